#!/usr/bin/env bash
# benches/peers_cost.sh: clrscope's cost beside its peers' on the same input, best of RUNS (issue 47
# item 5): reading one trace (`clrscope inspect` vs TraceEvent's EventPipeEventSource, `clrscope
# convert` vs TraceEvent's TraceLog and stack source: the suite's tests/peers/TraceEventReader), and
# one heap snapshot (`clrscope gcdump` vs `dotnet-gcdump collect` of the Alloc target, still, with
# --keep SMALL,25000,1000 objects). Prints one line per tool and step: wall seconds, CPU seconds (user
# + system), MB/s per CPU second, peak RSS.
#
#   benches/peers_cost.sh TRACE.nettrace [RUNS=5] [SMALL=1000000]
#
# Needs the test bed (`bash tests/testbed/setup.sh`) and `cargo build --release`. TraceEvent's figures
# include its process's start (the .NET runtime and JIT: ~0.1 s CPU on an empty file).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRACE=${1:?usage: $0 TRACE.nettrace [RUNS] [SMALL]}
RUNS=${2:-5}
SMALL=${3:-1000000}
TB=$ROOT/.testbed
CLRSCOPE=${CLRSCOPE:-$ROOT/target/release/clrscope}
READER=$TB/peers/TraceEventReader/TraceEventReader.dll
export DOTNET_ROOT=$TB/dotnet
[ -x "$CLRSCOPE" ] || { echo "build it first: cargo build --release" >&2; exit 1; }
[ -f "$READER" ] || { echo "install the test bed first: bash tests/testbed/setup.sh peers" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"; [ -n "${ALLOC:-}" ] && kill "$ALLOC" 2>/dev/null || true' EXIT

# `best NAME BYTES CMD…`: runs CMD RUNS times; prints the run of least CPU.
best() {
    local name=$1 bytes=$2 line best_cpu="" best_line=""
    shift 2
    for _ in $(seq "$RUNS"); do
        /usr/bin/time -f '%e %U %S %M' -o "$WORK/time" "$@" >/dev/null 2>"$WORK/err" ||
            { cat "$WORK/err" >&2; exit 1; }
        read -r wall user sys rss <"$WORK/time"
        cpu=$(echo "$user + $sys" | bc)
        if [ -z "$best_cpu" ] || [ "$(echo "$cpu < $best_cpu" | bc)" = 1 ]; then
            best_cpu=$cpu
            best_line=$(printf '%-34s wall %6.2f s  cpu %6.2f s  %8.1f MB/s per core  peak RSS %7.1f MB' \
                "$name" "$wall" "$cpu" "$(echo "scale=1; $bytes / 1000000 / ($cpu + 0.001)" | bc)" \
                "$(echo "scale=1; $rss / 1000" | bc)")
        fi
    done
    echo "$best_line"
}

BYTES=$(stat -c %s "$TRACE")
echo "trace $TRACE: $BYTES bytes, best of $RUNS"
best "clrscope inspect" "$BYTES" "$CLRSCOPE" inspect --json "$TRACE"
best "TraceEvent EventPipeEventSource" "$BYTES" "$TB/bin/dotnet" "$READER" events "$TRACE"
best "clrscope convert (folded)" "$BYTES" "$CLRSCOPE" convert "$TRACE" -o "$WORK/out.folded"
best "TraceEvent TraceLog + stacks" "$BYTES" "$TB/bin/dotnet" "$READER" cpu "$TRACE"

# The heap: a still Alloc target, one snapshot of each tool first (a process's first diagnostic
# session makes objects of its own), then RUNS of each.
"$TB/bin/dotnet" "$TB/targets/Alloc/net10.0/Alloc.dll" --keep "$SMALL,25000,1000" --churn-per-second 0 \
    >"$WORK/alloc.out" 2>&1 &
ALLOC=$!
for _ in $(seq 600); do grep -q '"ready"' "$WORK/alloc.out" && break; sleep 0.5; done
"$CLRSCOPE" gcdump --pid "$ALLOC" --timeout 300s -o "$WORK/warm.gcdump" 2>/dev/null
"$TB/tools/dotnet-gcdump" collect -p "$ALLOC" -o "$WORK/warm2.gcdump" >/dev/null
HEAP=$(stat -c %s "$WORK/warm.gcdump")
echo "heap of Alloc --keep $SMALL,25000,1000 (.NET 10): gcdump $HEAP bytes, best of $RUNS"
best "clrscope gcdump" "$HEAP" "$CLRSCOPE" gcdump --pid "$ALLOC" --timeout 300s -o "$WORK/c.gcdump"
best "dotnet-gcdump collect" "$HEAP" "$TB/tools/dotnet-gcdump" collect -p "$ALLOC" -o "$WORK/d.gcdump"
