#!/usr/bin/env bash
# Runs every test of the workspace, every test program even after a failure, and ends with one
# line totalling all of them (cargo's own last line belongs to whichever program ran last). A
# failing run lists each failed test with the command that reruns exactly it, with the
# workspace's features so nothing is rebuilt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"${CARGO:-cargo}" test --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
awk '
  # Which program the following results belong to, as the option that selects it.
  /^ *Running unittests src\/(lib|main)\.rs/ { program = ($3 ~ /main/) ? "--bins" : "--lib"; next }
  /^ *Running unittests/ { program = "--bins"; next }
  /^ *Running tests\// { name = $2; sub(/^tests\//, "", name); sub(/\.rs$/, "", name); sub(/\/main$/, "", name); program = "--test " name; next }
  /^ *Running benches\// { name = $2; sub(/^benches\//, "", name); sub(/\.rs$/, "", name); program = "--bench " name; next }
  /^ *Doc-tests / { program = "--doc"; next }
  /^test .* \.\.\. FAILED$/ {
    test = $0; sub(/^test /, "", test); sub(/ \.\.\. FAILED$/, "", test)
    failed[++n] = sprintf("  %s\n    rerun: cargo test --workspace %s -- --exact '\''%s'\''", test, program, test)
  }
  /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
  END {
    if (n > 0) { print "failed tests:"; for (i = 1; i <= n; i++) print failed[i] }
    printf "tests: %d passed, %d failed\n", p, f
  }' "$log"
exit "$status"
