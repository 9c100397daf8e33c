#!/usr/bin/env bash
# tests/testbed/demo.sh (`make demo`): the whole scene in one command.
#
#  1. starts the clrscope agent with tests/testbed/demo-settings.json: the two collection rules of
#     a team moving off dotnet-monitor — slow report requests (AspNetRequestDuration on
#     /reports/*: a CPU trace that starts 10 s before the trigger, and a sampling boost) and
#     payment latency (EventMeter: p95 of bookstore.payment.duration above 300 ms: a heap
#     snapshot) — each limited to one action per 10 minutes, writing to a FileSystem egress under
#     a disk budget; the agent listens on a diagnostic socket only, so it profiles nothing else;
#  2. starts the sample Bookstore service in listen mode (DOTNET_DiagnosticPorts=SOCKET,nosuspend:
#     it dials the agent and starts without waiting) with its own bounded load generator, whose
#     slow CSV exports and slow payments make both rules fire;
#  3. waits (at most 2 minutes) for both rules to fire and their artifacts to land, then shows the
#     rules' state, the artifacts, the hottest functions of the last minutes (the CSV export) and
#     the URL of the web UI, and stays up until Ctrl-C (at most DEMO_SECONDS).
# Needs `make setup` and `make build` (the Makefile's demo target does both first).
#
# Environment (`make demo DEMO_PORT=0`; not CLRSCOPE_…, which the agent reads as configuration):
#   DEMO_PORT     the agent's API and UI port (default 52323; 0 picks a free one)
#   DEMO_METRICS_PORT  its /metrics port (default 52325; 0 picks a free one)
# The API wants a token, as it does by default: the demo makes a key with `clrscope generatekey`,
# configures the agent with it and sends the token; the web UI asks for it (in $DEMO_DIR/apikey).
#   DEMO_DIR      where the agent's data, artifacts and logs go (default target/demo; emptied
#                 first: another folder only if it is empty or an earlier demo's)
#   DEMO_SECONDS  how long the scene stays up after the summary (default 600), then it stops
#                 by itself; Ctrl-C stops it earlier
#   DEMO_CHECK=1  verify and exit instead of staying up: exit 0 only if, within 2 minutes, both
#                 rules fired, each wrote its artifact, and the profile shows the report
#                 export's hot path
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TESTBED=${CLRSCOPE_TESTBED_DIR:-$ROOT/.testbed}
DOTNET=$TESTBED/bin/dotnet
DLL=$TESTBED/targets/Bookstore/net10.0/Bookstore.dll
CLRSCOPE=${CLRSCOPE:-$ROOT/target/debug/clrscope}
SETTINGS=$ROOT/tests/testbed/demo-settings.json
PORT=${DEMO_PORT:-52323}
DEMO_DIR=${DEMO_DIR:-$ROOT/target/demo}
STAY_SECONDS=${DEMO_SECONDS:-600}
CHECK=${DEMO_CHECK:-0}
# How long the demo waits for the rules; Bookstore's load generator runs while the demo is up (a
# pasted command shows the hot path until the end), and stops by itself should the demo be killed.
WAIT_SECONDS=120
LOAD_SECONDS=$((WAIT_SECONDS + STAY_SECONDS + 60))
RULES=(SlowReportRequests SlowPayments)
HOT_PATH=Bookstore.Reports.SalesReport.ExportCsv

say() { printf 'demo: %s\n' "$*" >&2; }

if [ ! -x "$DOTNET" ] || [ ! -f "$DLL" ]; then say "no test bed in $TESTBED: run \`make setup\` first"; exit 1; fi
[ -x "$CLRSCOPE" ] || { say "no $CLRSCOPE: run \`make build\` first"; exit 1; }
command -v curl >/dev/null || { say "curl is missing: run \`make setup\`"; exit 1; }

if [ "$DEMO_DIR" != "$ROOT/target/demo" ] && [ -e "$DEMO_DIR" ] && [ -n "$(ls -A "$DEMO_DIR")" ] &&
    [ ! -e "$DEMO_DIR/.clrscope-demo" ]; then
    say "$DEMO_DIR is not empty and not an earlier demo's: give DEMO_DIR another folder"
    exit 1
fi
rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
chmod 0700 "$DEMO_DIR"
touch "$DEMO_DIR/.clrscope-demo"
socket=$DEMO_DIR/diag/clrscope.sock
artifacts=$DEMO_DIR/artifacts
mkdir -m 0700 "$artifacts"
agent_log=$DEMO_DIR/agent.log
store_log=$DEMO_DIR/bookstore.log

agent=""
bookstore=""
sleeper=""
# Stops what the demo started, newest first: Bookstore, then the agent (it ends its sessions and
# flushes the store). SIGINT first, as Ctrl-C would; then SIGTERM, since a background job of a
# script inherits SIGINT ignored and .NET then never sees it; then SIGKILL.
stop() {
    local pid=$1 name=$2
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    say "stopping $name (pid $pid)"
    for signal in INT TERM; do
        kill -"$signal" "$pid" 2>/dev/null || true
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break 2; sleep 0.1; done
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    [ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null || true
    stop "$bookstore" Bookstore
    stop "$agent" "the agent"
}
trap cleanup EXIT
# Ctrl-C is how a person ends the demo: a clean stop, not a failure.
trap 'echo; say stopping on request; exit 0' INT TERM

# wait_for_line PID NAME LOG PATTERN: waits up to 30 s for PATTERN in LOG while PID runs.
wait_for_line() {
    local pid=$1 name=$2 log=$3 pattern=$4
    for _ in $(seq 300); do
        grep -qs "$pattern" "$log" && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    say "$name did not start:"
    cat "$log" >&2
    exit 1
}

# --- an API key, as a user makes one: the agent's settings (its environment) and our token ---
"$CLRSCOPE" generatekey -o Shell >"$DEMO_DIR/apikey"
chmod 0600 "$DEMO_DIR/apikey"
eval "$(grep '^export ' "$DEMO_DIR/apikey")"
auth=$(grep '^Authorization: ' "$DEMO_DIR/apikey")
# What the printed commands send: a person pastes them as they are (the token stays in the file).
apikey_path=$DEMO_DIR/apikey
apikey_path=${apikey_path#"$PWD"/}
auth_arg="-H \"\$(grep '^Authorization: ' $apikey_path)\""

# --- the agent ---
# (CLRSCOPE_TESTBED_DIR is this script's, not a configuration key of the agent's.)
env -u CLRSCOPE_TESTBED_DIR CLRSCOPE_Egress__FileSystem__artifacts__DirectoryPath=$artifacts \
    "$CLRSCOPE" agent --config "$SETTINGS" --urls "http://127.0.0.1:$PORT" \
    --metrics-urls "http://127.0.0.1:${DEMO_METRICS_PORT:-52325}" \
    --data-dir "$DEMO_DIR/data" --diagnostic-port "$socket" --no-connect 2>"$agent_log" &
agent=$!
wait_for_line "$agent" "the agent" "$agent_log" 'API on'
api=$(grep -m1 -o 'API on http://[0-9.]*:[0-9]*' "$agent_log" | sed 's/^API on //')
say "agent up: $api, rules from ${SETTINGS#"$ROOT"/} (log: $agent_log)"
api_get() { curl -sf -H "$auth" "$api$1"; }

# --- Bookstore, dialling the agent's socket ---
DOTNET_DiagnosticPorts="$socket,nosuspend" OTEL_SERVICE_NAME=bookstore \
    "$DOTNET" "$DLL" --self-load 20 --self-load-seconds "$LOAD_SECONDS" --no-request-lines \
    >"$store_log" 2>&1 &
bookstore=$!
wait_for_line "$bookstore" Bookstore "$store_log" '"ready"'
started=$SECONDS
bookstore_url=$(grep -m1 '"ready"' "$store_log" | grep -o '"url":"[^"]*"' | cut -d'"' -f4)
say "Bookstore up: $bookstore_url (pid $bookstore), under load at 20 requests/s while the demo is up"

# --- wait for both rules to fire and their artifacts to land ---
# fired RULE: how often RULE has run its actions on Bookstore.
fired() {
    api_get "/collectionrules/$1?pid=$bookstore" |
        grep -o '"lifetimeOccurrences":[0-9]*' | cut -d: -f2 || echo 0
}
declare -A fired_at=()
attached=0
while [ $((SECONDS - started)) -lt $WAIT_SECONDS ]; do
    if [ $attached -eq 0 ] && api_get /api/v1/processes | grep -q "\"pid\":$bookstore,"; then
        attached=1
        say "$((SECONDS - started))s: the agent attached Bookstore (listen mode)"
    fi
    for rule in "${RULES[@]}"; do
        if [ -z "${fired_at[$rule]:-}" ] && [ "$(fired "$rule")" -gt 0 ]; then
            fired_at[$rule]=$((SECONDS - started))
            say "${fired_at[$rule]}s: rule $rule fired"
        fi
    done
    artifact_count=$(find "$artifacts" -type f | wc -l)
    [ ${#fired_at[@]} -eq ${#RULES[@]} ] && [ "$artifact_count" -ge ${#RULES[@]} ] && break
    sleep 2
done

echo
for rule in "${RULES[@]}"; do
    echo "\$ curl $auth_arg '$api/collectionrules/$rule?pid=$bookstore'"
    api_get "/collectionrules/$rule?pid=$bookstore" || true
    echo
done
echo
echo "\$ ls -l $artifacts"
ls -l "$artifacts"
echo
query="%7Bservice_name%3D%22bookstore%22%7D"
echo "\$ curl -G $auth_arg '$api/api/v1/profile' -d type=cpu -d from=now-3m --data-urlencode 'query={service_name=\"bookstore\"}' -d format=folded"
echo "  (self time per function, summed from those folded stacks:)"
folded=$(api_get "/api/v1/profile?type=cpu&from=now-3m&query=$query&format=folded" || true)
printf '%s\n' "$folded" | awk 'NF {n=split($0,f,";"); leaf=f[n]; sub(/ [0-9]+$/, "", leaf); t[leaf]+=$NF; all+=$NF}
         END {for (k in t) printf "  %5.1f%%  %s\n", 100*t[k]/all, k}' | sort -rn | awk 'NR <= 8'
share=$(printf '%s\n' "$folded" | awk -v hot="$HOT_PATH" 'NF { all += $NF; if (index($0, hot)) h += $NF }
         END { if (all > 0) printf "%.0f", 100 * h / all; else print 0 }')
echo
say "$share% of Bookstore's cpu time is under $HOT_PATH (the CSV report export)"

if [ "$CHECK" = 1 ]; then
    failed=0
    [ $attached -eq 1 ] || { say "FAILED: the agent never attached Bookstore"; failed=1; }
    for rule in "${RULES[@]}"; do
        [ -n "${fired_at[$rule]:-}" ] || { say "FAILED: rule $rule did not fire within ${WAIT_SECONDS}s"; failed=1; }
    done
    for kind in nettrace gcdump; do
        find "$artifacts" -type f -name "*.$kind" | grep -q . ||
            { say "FAILED: no .$kind artifact in $artifacts"; failed=1; }
    done
    [ "$share" -gt 0 ] || { say "FAILED: no cpu samples under $HOT_PATH"; failed=1; }
    [ $failed -eq 0 ] || exit 1
    say "check passed: both rules fired, their artifacts exist, the hot path shows"
    exit 0
fi

echo
echo "  web UI:  $api/#type=cpu&service=bookstore&search=SalesReport"
echo "           it asks for a token: the Bearer value of the Authorization line in $apikey_path"
echo "  data:    $DEMO_DIR (artifacts in $artifacts)"
echo
say "up for ${STAY_SECONDS}s more; Ctrl-C stops Bookstore and the agent"
sleep "$STAY_SECONDS" &
sleeper=$!
wait "$sleeper" || true
