#!/usr/bin/env bash
# tests/testbed/demo.sh (`make demo`): starts the CpuHot test-bed target in the background (three
# threads designed to use 60/30/10 % of the CPU), then shows what clrscope sees of it: `ps`, the
# threads' stacks, a 5-second cpu profile as text and as an SVG flame graph, then the always-on
# agent profiling it and answering a query over HTTP. Stops everything at the end (also on Ctrl-C).
# Needs `make setup` and `make build` (the Makefile's demo target does both first).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TESTBED=${CLRSCOPE_TESTBED_DIR:-$ROOT/.testbed}
DOTNET=$TESTBED/bin/dotnet
DLL=$TESTBED/targets/CpuHot/CpuHot.dll
CLRSCOPE=${CLRSCOPE:-$ROOT/target/debug/clrscope}

say() { printf 'demo: %s\n' "$*" >&2; }

[ -x "$DOTNET" ] && [ -f "$DLL" ] || { say "no test bed in $TESTBED: run \`make setup\` first"; exit 1; }
[ -x "$CLRSCOPE" ] || { say "no $CLRSCOPE: run \`make build\` first"; exit 1; }

out=$(mktemp "${TMPDIR:-/tmp}/clrscope-demo.XXXXXX")
pid=""
agent=""
cleanup() {
    if [ -n "$agent" ] && kill -0 "$agent" 2>/dev/null; then
        kill -INT "$agent" 2>/dev/null || true
        wait "$agent" 2>/dev/null || true
    fi
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "stopping CpuHot (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -f "$out"
}
trap cleanup EXIT
trap 'say interrupted; exit 130' INT TERM

"$DOTNET" "$DLL" --split 60,30,10 >"$out" 2>&1 &
pid=$!
say "started CpuHot (pid $pid), waiting for its ready line…"
for _ in $(seq 300); do
    grep -q '"ready"' "$out" && break
    if ! kill -0 "$pid" 2>/dev/null; then
        say "CpuHot exited before it was ready:"
        cat "$out" >&2
        exit 1
    fi
    sleep 0.1
done
grep -q '"ready"' "$out" || { say "CpuHot not ready after 30 s"; cat "$out" >&2; exit 1; }
say "ready: $(grep -m1 '"ready"' "$out")"
say "diagnostic socket: $(ls "${TMPDIR:-/tmp}"/dotnet-diagnostic-"$pid"-*-socket 2>/dev/null || echo none)"
run() {
    echo
    echo "\$ clrscope $*"
    local status=0
    "$CLRSCOPE" "$@" || status=$?
    if [ "$status" -ne 0 ]; then
        say "clrscope $1 failed (exit status $status)"
        exit "$status"
    fi
}

demo_dir=${CLRSCOPE_DEMO_DIR:-$ROOT/target/demo}
mkdir -p "$demo_dir"
run ps
run stacks --pid "$pid"
run top --pid "$pid" --duration 5s --rows 8
run record --pid "$pid" --duration 5s -o "$demo_dir/cpuhot.svg"
run record --pid "$pid" --duration 5s -o "$demo_dir/cpuhot.pb.gz"
echo
say "designed split: SpinAlpha 60%, SpinBravo 30%, SpinCharlie 10% — compare with top's SELF% above"
say "flame graph: $demo_dir/cpuhot.svg (open it in a browser); pprof: go tool pprof -top $demo_dir/cpuhot.pb.gz"

echo
echo "\$ clrscope generatekey -o Shell   (a key for the agent's API: settings for the agent, a token for clients)"
key=$("$CLRSCOPE" generatekey -o Shell)
printf '%s\n' "$key" | cut -c1-100
eval "$(printf '%s\n' "$key" | grep '^export ')"
auth=$(printf '%s\n' "$key" | grep '^Authorization: ')

echo
echo "\$ clrscope agent --pid $pid --sample-period 2s --urls http://127.0.0.1:0 --metrics-urls http://127.0.0.1:0 --data-dir $demo_dir/agent-data"
agent_log=$demo_dir/agent.log
"$CLRSCOPE" agent --pid "$pid" --sample-period 2s --urls http://127.0.0.1:0 \
    --metrics-urls http://127.0.0.1:0 --data-dir "$demo_dir/agent-data" 2>"$agent_log" &
agent=$!
for _ in $(seq 50); do grep -q 'API on' "$agent_log" && break; sleep 0.1; done
api=$(grep -o 'API on http://127.0.0.1:[0-9]*' "$agent_log" | head -1 | cut -d' ' -f3)
metrics=$(grep -o 'metrics http://127.0.0.1:[0-9]*/metrics' "$agent_log" | head -1 | cut -d' ' -f2)
[ -n "$api" ] || { say "the agent did not start:"; cat "$agent_log" >&2; exit 1; }
grep 'API on' "$agent_log"
say "letting the agent sample for 12 s…"
sleep 12
echo
echo "\$ curl '$api/api/v1/processes'   (no token: refused)"
curl -s "$api/api/v1/processes"
echo
echo "\$ curl -H 'Authorization: Bearer …' '$api/api/v1/processes'"
curl -sf -H "$auth" "$api/api/v1/processes"
echo
echo "\$ curl -H 'Authorization: Bearer …' '$api/api/v1/profile?type=cpu&from=now-1m&format=folded'   (self time per leaf)"
curl -sf -H "$auth" "$api/api/v1/profile?type=cpu&from=now-1m&format=folded" |
    awk '{n=split($0,f,";"); leaf=f[n]; sub(/ [0-9]+$/, "", leaf); t[leaf]+=$NF; all+=$NF}
         END {for (k in t) printf "  %5.1f%%  %s\n", 100*t[k]/all, k}' | sort -rn | head -5
curl -sf -H "$auth" "$api/api/v1/profile?type=cpu&from=now-1m&format=svg" -o "$demo_dir/agent-cpuhot.svg"
say "the agent's flame graph of the last minute: $demo_dir/agent-cpuhot.svg"
echo
echo "\$ curl '$metrics'   (Prometheus text, no token)"
curl -sf "$metrics" | grep -E '^clrscope_(processes_attached|samples_total|store_bytes) '
