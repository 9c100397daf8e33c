#!/usr/bin/env bash
# tests/testbed/run-tests.sh MODE: runs one tier of the tests, every test program even after a
# failure, and ends with one line totalling all of them (cargo's own last line belongs to whichever
# program ran last). A failing run lists each failed test with the command that reruns exactly it.
#
#   check    no .NET: the unit tests of every crate, the crates' own integration tests, and the
#            suite's modules in $OFFLINE (golden files, fixtures, the agent without targets)
#   test     everything, against real .NET processes on $CLRSCOPE_DOTNET (default 10)
#   matrix   the suite's runtime-dependent modules ($RUNTIME_DEPENDENT) on every runtime the test
#            bed installed (.testbed/runtimes.env), one run per runtime, then a table of them
#
# The suite (tests/suite) runs $CLRSCOPE_TEST_THREADS tests at once (default 6: most wait on real
# processes rather than use a core). Soak-length tests run only with CLRSCOPE_SOAK=1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CARGO=${CARGO:-cargo}
MODE=${1:-test}
shift || true
THREADS=${CLRSCOPE_TEST_THREADS:-6}
TESTBED=${CLRSCOPE_TESTBED_DIR:-$PWD/.testbed}

# Suite modules that start no .NET process.
OFFLINE=(agent_config:: auth:: convert:: crate_graph:: entra_id:: hostile_clients:: hostile_targets:: inspect::
    openapi:: packaging:: wire_types::)
# Suite modules whose results depend on the runtime (IPC commands, nettrace parsing, symbolization,
# CPU split, listen mode, linkage, logs, exceptions, allocations, gcdump, counters and meters, rules,
# the Storefront service and its OpenTelemetry twin, whose SDK version differs per framework, and the
# agreement with Microsoft's tools, whose sessions see each runtime's events).
RUNTIME_DEPENDENT=(targets:: ipc:: cli_ps:: nettrace_live:: r2r_images:: cli_record:: cli_trace::
    cli_live:: cli_dump:: agent:: linkage:: traces:: signals:: gcdump:: counters:: metrics_export::
    rules:: api_monitor:: storefront:: startup:: peers::)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# `run ARGS…`: one cargo test invocation, its output shown and kept for the summary.
run() {
    "$CARGO" test "$@" 2>&1 | tee -a "$log"
    local s=${PIPESTATUS[0]}
    [ "$s" -eq 0 ] || status=$s
}

summary() {
    awk '
      # Which program the following results belong to, as the option that selects it.
      /^ *Running unittests src\/(lib|main)\.rs/ { program = ($3 ~ /main/) ? "--bins" : "--lib"; next }
      /^ *Running unittests/ { program = "--bins"; next }
      /^ *Running tests\// { name = $2; sub(/^.*tests\//, "", name); sub(/\.rs$/, "", name); sub(/\/main$/, "", name); program = "--test " name; next }
      /^ *Running [a-z]+\/tests\// { name = $2; sub(/^.*tests\//, "", name); sub(/\.rs$/, "", name); program = "--test " name; next }
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
}

case "$MODE" in
check)
    run --workspace --exclude clrscope --no-fail-fast "$@"
    run -p clrscope --bins --no-fail-fast "$@"
    run -p clrscope --test suite --no-fail-fast -- --test-threads "$THREADS" "${OFFLINE[@]}"
    summary
    ;;
test)
    run --workspace --no-fail-fast "$@" -- --test-threads "$THREADS"
    summary
    ;;
matrix)
    majors=$(sed -n 's/^MAJORS=//p' "$TESTBED/runtimes.env" 2>/dev/null)
    [ -n "$majors" ] || { echo "run-tests: no $TESTBED/runtimes.env: run \`make setup\`" >&2; exit 1; }
    table=()
    for major in $majors; do
        before=$(wc -l <"$log")
        started=$SECONDS
        echo "=== .NET $major ==="
        CLRSCOPE_DOTNET=$major run -p clrscope --test suite --no-fail-fast "$@" -- \
            --test-threads "$THREADS" "${RUNTIME_DEPENDENT[@]}"
        result=$(tail -n +"$((before + 1))" "$log" | grep '^test result:' | tail -n1)
        table+=("$(printf '.NET %-3s %5ds  %s' "$major" $((SECONDS - started)) "${result#test result: }")")
    done
    printf '%s\n' "${table[@]}"
    summary
    ;;
*)
    echo "usage: $0 check|test|matrix [cargo test options]" >&2
    exit 2
    ;;
esac
exit "$status"
