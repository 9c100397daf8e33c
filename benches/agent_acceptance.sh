#!/usr/bin/env bash
# benches/agent_acceptance.sh: issue 5's first acceptance run, repeatable. Starts CpuHot (60/30/10),
# Alloc and Faults, then `clrscope agent` at default settings limited to them, waits two minutes and
# prints what the agent's API answers for the last minute: cpu shares per leaf, allocation stacks and
# types, exception stacks and types, lock waits; plus the agent's peak RSS and CPU ticks.
# Needs `make setup` and `make build` (or CLRSCOPE=path/to/clrscope), curl and go.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TB=${CLRSCOPE_TESTBED_DIR:-$ROOT/.testbed}
CLRSCOPE=${CLRSCOPE:-$ROOT/target/debug/clrscope}
SECONDS_TO_RUN=${SECONDS_TO_RUN:-120}
work=$(mktemp -d "${TMPDIR:-/tmp}/clrscope-acceptance.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$TB/bin/dotnet" "$TB/targets/CpuHot/net10.0/CpuHot.dll" --split 60,30,10 >"$work/cpuhot.out" & C=$!
"$TB/bin/dotnet" "$TB/targets/Alloc/net10.0/Alloc.dll" >"$work/alloc.out" & A=$!
"$TB/bin/dotnet" "$TB/targets/Faults/net10.0/Faults.dll" >"$work/faults.out" & F=$!
pids+=("$C" "$A" "$F")
sleep 3
# Authentication as a user sets it up: a key from generatekey, its settings in the agent's
# environment, its header on every request.
"$CLRSCOPE" generatekey -o Shell >"$work/key"
eval "$(grep '^export ' "$work/key")"
auth=$(grep '^Authorization: ' "$work/key")
"$CLRSCOPE" agent --data-dir "$work/data" --urls http://127.0.0.1:0 --metrics-urls http://127.0.0.1:0 \
    --pid "$C" --pid "$A" --pid "$F" 2>"$work/agent.log" & G=$!
pids=("$G" "${pids[@]}")
for _ in $(seq 50); do grep -q 'API on' "$work/agent.log" && break; sleep 0.1; done
api=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/agent.log" | head -1)
[ -n "$api" ] || { cat "$work/agent.log" >&2; exit 1; }
echo "agent at $api; sampling for $SECONDS_TO_RUN s…" >&2
sleep "$SECONDS_TO_RUN"
echo "load: $(cat /proc/loadavg)"

profile() { curl -sf -H "$auth" "$api/api/v1/profile?type=$1&format=$2&from=now-1m&query=%7Bprocess_id%3D%22$3%22%7D"; }
top_stacks() { profile "$1" folded "$2" | sort -t' ' -k2 -nr | head -3 | cut -c1-300; }
types() { profile "$1" pprof "$2" >"$work/p.pb.gz"; go tool pprof -tags "$work/p.pb.gz" 2>/dev/null | sed -n '/^ type:/,/^$/p'; }

echo "== cpu shares per leaf (CpuHot, last minute)"
profile cpu folded "$C" | awk '{n=split($0,f,";"); leaf=f[n]; sub(/ [0-9]+$/, "", leaf); t[leaf]+=$NF; all+=$NF}
    END {for (k in t) printf "%5.1f%%  %s\n", 100*t[k]/all, k; printf "total %.2f s of cpu\n", all/1e9}' | sort -rn | head -5
echo "== alloc_samples (Alloc)"; top_stacks alloc_samples "$A"; types alloc_size "$A"
echo "== exception (Faults)"; top_stacks exception "$F"; types exception "$F"
echo "== lock_count (Faults)"; top_stacks lock_count "$F"
profile lock_time folded "$F" | awk '{t+=$NF} END {printf "lock_time total %.3f s\n", t/1e9}'
echo "== agent: $(grep -E 'VmHWM' /proc/$G/status | tr -s ' \t' ' ') cpu ticks (utime+stime): $(awk '{print $14+$15}' /proc/$G/stat)"
