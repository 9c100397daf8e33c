#!/usr/bin/env bash
# benches/fidelity.sh [MAJOR…]: how true clrscope's output is, per .NET runtime (default 10 and 8),
# from the suite's own ground-truth tests, one at a time (no other test beside them), with their
# measured figures printed: the CPU split against the kernel's per-thread CPU (connect and listen
# mode), frames left unnamed (connect and listen mode), span linkage precision and recall, exception
# counts against the target's own, allocation shares, and logs with their span ids.
#
#   benches/fidelity.sh 10 8 | tee fidelity.txt          (BENCHMARKS.md, "Fidelity per runtime")
#
# HOGS=2 runs two CPU hogs beside the tests, as the suite's acceptance asks. Needs `make setup` and
# `cargo build`. Prints, per runtime, each test's verdict and the lines that carry its figures.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
majors=${*:-10 8}
TESTS=(
    agent::three_targets_profiled_continuously_and_kept_across_a_kill
    agent::listen_mode_cpu_split_holds_against_the_kernel
    agent::cpu_follows_the_kernel_when_threads_wait_for_a_core
    agent::listen_mode_names_every_frame
    agent::samples_carry_the_span_of_the_request_they_ran_for
    cli_record::cpu_split_holds_and_pprof_reads_the_file
    cli_record::frames_of_every_target_resolve
    linkage::samples_join_the_span_running_on_their_thread
    signals::logs_and_exceptions_out_of_process
)
# The lines the tests print their measurements on.
FIGURES='% of the profile|by the kernel|of managed frames named|unnamed|precision|recall|Judged|logs: |exceptions: |allocations: |cpu of the spinning'

hogs=()
for _ in $(seq "${HOGS:-0}"); do
    sh -c 'while :; do :; done' &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT

for major in $majors; do
    echo "## .NET $major ($(date -u +%FT%TZ), load $(cut -d' ' -f1 /proc/loadavg), hogs ${HOGS:-0})"
    for test in "${TESTS[@]}"; do
        out=$(CLRSCOPE_DOTNET=$major cargo test -q --test suite -- --exact --nocapture "$test" 2>&1)
        # `-q` prints a dot per test, not its name: the verdict is the run's result line.
        verdict=$(grep -oE '^test result: [A-Za-z]+\. 1 passed' <<<"$out" >/dev/null && echo ok)
        echo "### $test: ${verdict:-no verdict}"
        grep -E "$FIGURES" <<<"$out" | grep -v '^test ' | sed 's/^/    /' | head -n 20
        if [ "$verdict" != ok ]; then grep -A3 'panicked at' <<<"$out" | sed 's/^/    ! /' | head -n 8; fi
    done
done
