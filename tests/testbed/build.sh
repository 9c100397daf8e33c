#!/usr/bin/env bash
# tests/testbed/build.sh: `cargo build --workspace --all-targets` for `make demo`, in one line.
#
# A first build compiles ~400 crates; a person trying the demo wants to see that it is building,
# not 400 `Compiling` lines. cargo's output goes to $TESTBED/build.log; on a terminal one line
# counts the crates as they compile; a failed build shows the log's end (the compiler's errors).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TESTBED=${CLRSCOPE_TESTBED_DIR:-$ROOT/.testbed}
CARGO=${CARGO:-cargo}
LOG=$TESTBED/build.log
mkdir -p "$TESTBED"

printf 'build: cargo build --workspace --all-targets (a first build takes ~6 min on 2 cores; log: %s)\n' \
    "${LOG#"$ROOT"/}" >&2
started=$SECONDS
status=0
if [ -t 2 ]; then
    # `Compiling` lines become one counter, rewritten in place.
    { "$CARGO" build --workspace --all-targets 2>&1 || echo "build.sh: cargo exited $?"; } |
        tee "$LOG" |
        awk '/^ *Compiling / { n++; printf "\rbuild: crates compiled: %d", n > "/dev/stderr"; fflush("/dev/stderr") }
             END { if (n) printf "\n" > "/dev/stderr" }'
    grep -q '^build.sh: cargo exited' "$LOG" && status=1
else
    "$CARGO" build --workspace --all-targets >"$LOG" 2>&1 || status=$?
fi

if [ "$status" -ne 0 ]; then
    printf 'build: cargo build failed; the end of %s:\n' "${LOG#"$ROOT"/}" >&2
    tail -n 40 "$LOG" >&2
    exit 1
fi
printf 'build: done in %ds\n' $((SECONDS - started)) >&2
