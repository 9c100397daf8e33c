#!/usr/bin/env bash
# tests/testbed/demo.sh (`make demo`): the whole scene in one command. Starts the clrscope agent
# listening on a diagnostic socket, starts the sample Bookstore service in listen mode
# (DOTNET_DiagnosticPorts=SOCKET,nosuspend: it dials the agent, nothing waits), drives a bounded
# load through Bookstore's own load generator, then shows what the agent saw: the attached process,
# the hottest functions of the last minute (the CSV report export), its /metrics, and the URL of
# the web UI. The API wants a token, as it does by default: the demo makes a key with
# `clrscope generatekey`, configures the agent with it and sends the token, as a user would.
# Needs `make setup` and `make build` (the Makefile's demo target does both first).
#
# Environment:
#   CLRSCOPE_DEMO_PORT     the agent's API and UI port (default 52323; 0 picks a free one)
#   CLRSCOPE_DEMO_METRICS_PORT  its /metrics port (default 52325; 0 picks a free one)
#   CLRSCOPE_DEMO_DIR      where the agent's data and logs go (default target/demo, emptied first)
#   CLRSCOPE_DEMO_SECONDS  how long the scene stays up after the summary (default 600), then it
#                          stops by itself; Ctrl-C stops it earlier
#   CLRSCOPE_DEMO_CHECK=1  verify and exit instead of staying up: exit 0 only if the agent
#                          attached Bookstore and its profile shows the report export's hot path
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TESTBED=${CLRSCOPE_TESTBED_DIR:-$ROOT/.testbed}
DOTNET=$TESTBED/bin/dotnet
DLL=$TESTBED/targets/Bookstore/Bookstore.dll
CLRSCOPE=${CLRSCOPE:-$ROOT/target/debug/clrscope}
PORT=${CLRSCOPE_DEMO_PORT:-52323}
METRICS_PORT=${CLRSCOPE_DEMO_METRICS_PORT:-52325}
DEMO_DIR=${CLRSCOPE_DEMO_DIR:-$ROOT/target/demo}
STAY_SECONDS=${CLRSCOPE_DEMO_SECONDS:-600}
CHECK=${CLRSCOPE_DEMO_CHECK:-0}
# How long Bookstore's load generator runs, and how long the demo waits for the agent's data.
LOAD_SECONDS=150
WAIT_SECONDS=120
MIN_SECONDS=35
HOT_PATH=Bookstore.Reports.SalesReport.ExportCsv

say() { printf 'demo: %s\n' "$*" >&2; }

if [ ! -x "$DOTNET" ] || [ ! -f "$DLL" ]; then say "no test bed in $TESTBED: run \`make setup\` first"; exit 1; fi
[ -x "$CLRSCOPE" ] || { say "no $CLRSCOPE: run \`make build\` first"; exit 1; }
command -v curl >/dev/null || { say "curl is missing: run \`make setup\`"; exit 1; }

rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
chmod 0700 "$DEMO_DIR"
socket=$DEMO_DIR/diag/clrscope.sock
agent_log=$DEMO_DIR/agent.log
store_log=$DEMO_DIR/bookstore.log

agent=""
bookstore=""
# Stops what the demo started, newest first: Bookstore (Ctrl-C equivalent: a clean exit), then the
# agent (SIGINT: it ends its sessions and flushes the store).
stop() {
    local pid=$1 name=$2
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    say "stopping $name (pid $pid)"
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    stop "$bookstore" Bookstore
    stop "$agent" "the agent"
}
trap cleanup EXIT

# wait_for_line PID NAME LOG PATTERN: waits up to 30 s for PATTERN in LOG while PID runs.
wait_for_line() {
    local pid=$1 name=$2 log=$3 pattern=$4
    for _ in $(seq 300); do
        grep -q "$pattern" "$log" && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    say "$name did not start:"
    cat "$log" >&2
    exit 1
}
trap 'echo; say interrupted; exit 130' INT TERM

# --- an API key: settings for the agent (its environment), the token for our requests ---
"$CLRSCOPE" generatekey -o Shell >"$DEMO_DIR/apikey"
chmod 0600 "$DEMO_DIR/apikey"
eval "$(grep '^export ' "$DEMO_DIR/apikey")"
auth=$(grep '^Authorization: ' "$DEMO_DIR/apikey")
token=${auth#Authorization: Bearer }

# --- the agent: listen mode only, so it profiles Bookstore and nothing else on this machine ---
"$CLRSCOPE" agent --urls "http://127.0.0.1:$PORT" --metrics-urls "http://127.0.0.1:$METRICS_PORT" \
    --data-dir "$DEMO_DIR/data" --diagnostic-port "$socket" --no-connect 2>"$agent_log" &
agent=$!
wait_for_line "$agent" "the agent" "$agent_log" 'API on'
api=$(grep -o 'API on http://[0-9.]*:[0-9]*' "$agent_log" | head -1 | sed 's/^API on //')
metrics=$(grep -o 'metrics http://[0-9.]*:[0-9]*/metrics' "$agent_log" | head -1 | sed 's/^metrics //')
say "agent up: $api (log: $agent_log)"

# --- Bookstore, dialling the agent's socket ---
DOTNET_DiagnosticPorts="$socket,nosuspend" OTEL_SERVICE_NAME=bookstore \
    "$DOTNET" "$DLL" --self-load 20 --self-load-seconds "$LOAD_SECONDS" --no-request-lines \
    >"$store_log" 2>&1 &
bookstore=$!
wait_for_line "$bookstore" Bookstore "$store_log" '"ready"'
bookstore_url=$(grep -m1 '"ready"' "$store_log" | grep -o '"url":"[^"]*"' | cut -d'"' -f4)
say "Bookstore up: $bookstore_url (pid $bookstore), ${LOAD_SECONDS}s of load at 20 requests/s"

# --- wait for the agent's view of it ---
query="%7Bservice_name%3D%22bookstore%22%7D"
hot_share() {
    curl -sf -H "$auth" "$api/api/v1/profile?type=cpu&from=now-2m&query=$query&format=folded" |
        awk -v hot="$HOT_PATH" '{ v = $NF; all += v; if (index($0, hot)) h += v }
             END { if (all > 0) printf "%.0f", 100 * h / all; else print 0 }'
}
started=$SECONDS
deadline=$((started + WAIT_SECONDS))
attached=0
share=0
while [ $SECONDS -lt $deadline ]; do
    if [ $attached -eq 0 ] && curl -sf -H "$auth" "$api/api/v1/processes" | grep -q "\"pid\":$bookstore,"; then
        attached=1
        say "the agent attached Bookstore (listen mode)"
    fi
    # a few sampler windows (1 s every 10 s) before summing up
    if [ $attached -eq 1 ] && [ $SECONDS -ge $((started + MIN_SECONDS)) ]; then
        share=$(hot_share)
        [ "$share" -gt 0 ] && break
    fi
    sleep 2
done

echo
echo "\$ curl '$api/api/v1/processes'   (no token: refused)"
curl -s "$api/api/v1/processes"
echo
echo
echo "\$ curl -H 'Authorization: Bearer …' '$api/api/v1/processes'"
curl -sf -H "$auth" "$api/api/v1/processes"
echo
echo
echo "\$ curl -H 'Authorization: Bearer …' '$api/api/v1/profile?type=cpu&from=now-2m&query={service_name=\"bookstore\"}&format=folded'   (self time per function)"
curl -sf -H "$auth" "$api/api/v1/profile?type=cpu&from=now-2m&query=$query&format=folded" |
    awk '{n=split($0,f,";"); leaf=f[n]; sub(/ [0-9]+$/, "", leaf); t[leaf]+=$NF; all+=$NF}
         END {for (k in t) printf "  %5.1f%%  %s\n", 100*t[k]/all, k}' | sort -rn | head -8
echo
say "$share% of Bookstore's cpu time in the last 2 minutes is under $HOT_PATH (the CSV report export)"
echo
echo "\$ curl '$metrics'   (Prometheus text, no token; a few lines)"
curl -sf "$metrics" | grep -E '^(clrscope_(processes_attached|samples_total|store_bytes)|systemruntime_(cpu_usage_ratio|working_set_bytes))[ {]' || true

if [ "$CHECK" = 1 ]; then
    [ $attached -eq 1 ] || { say "FAILED: the agent never attached Bookstore"; exit 1; }
    [ "$share" -gt 0 ] || { say "FAILED: no cpu samples under $HOT_PATH within ${WAIT_SECONDS}s"; exit 1; }
    say "check passed"
    exit 0
fi

echo
echo "  web UI:  $api/#type=cpu&service=bookstore&search=SalesReport"
echo "  token:   $token   (the page asks for it once per browser tab)"
echo "  data:    $DEMO_DIR"
echo
say "up for ${STAY_SECONDS}s more; Ctrl-C stops Bookstore and the agent"
sleep "$STAY_SECONDS" &
wait $! || true
