#!/usr/bin/env bash
# Runs every test of the workspace and ends with one line totalling all test binaries, because
# cargo's own last line belongs to whichever crate ran last (often a doc-test run of 0 tests).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"${CARGO:-cargo}" test --workspace "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
