#!/usr/bin/env bash
# tests/testbed/demo.sh (`make demo`): the whole scene in one command.
#
#  1. starts the ASP.NET Core sample service Storefront twice: `inventory` (--role downstream),
#     whose every 10th stock reservation takes 400 ms (the slow dependency), and `storefront`
#     (--role frontend) calling it in every checkout, with a hot recommendations endpoint (25 ms
#     of CPU a request) and every 5th coupon lookup throwing CouponServiceException; both on SQLite
#     files in the demo's folder (no database server to install, start or leave behind, and no
#     root: PostgreSQL's initdb refuses to run as root, and Debian's postgresql is not installed
#     by `setup.sh demo`);
#  2. starts the clrscope agent for those two pids only (it connects to their diagnostic
#     sockets, so it profiles nothing else on the machine) with Warning logs and
#     tests/testbed/demo-settings.json: two collection rules of a team moving off
#     dotnet-monitor, both on the frontend — slow recommendations (AspNetRequestDuration on
#     /api/recommendations: a 10 s CPU trace, and a sampling boost) and slow checkouts (AspNetRequestDuration on /api/orders: the warnings of the 30 s
#     before, which name the slow reservations) — each limited to one action per 10 minutes,
#     writing to a FileSystem egress under a disk budget;
#  3. starts StorefrontLoad driving the frontend at 20 requests/s (open loop, a fixed mix);
#  4. waits (at most 2 minutes) until the agent's API, which the web UI draws, shows the three:
#     a RecommendationEngine function as the top function of the cpu profile, the coupon
#     exceptions, and the slow dependency (the frontend's warnings "Inventory reservation … took
#     4xx ms"), and both rules firing (markers on the timeline), saying when each appeared; then
#     the rules' state, the artifacts, the top functions and the web UI's URL, and stays up until
#     Ctrl-C (at most DEMO_SECONDS). Ctrl-C, or the end, stops all it started; should the script
#     be killed outright, the services and the load exit within a second (TESTBED_EXIT_WITH_PARENT).
# Needs `make setup` and `make build` (the Makefile's demo target does both first).
#
# Environment (`make demo DEMO_PORT=0`; not CLRSCOPE_…, which the agent reads as configuration):
#   DEMO_PORT     the agent's API and UI port (default 52323; 0 picks a free one)
#   DEMO_METRICS_PORT  its /metrics port (default 52325; 0 picks a free one)
# The API wants a token, as it does by default: the demo makes a key with `clrscope generatekey`,
# configures the agent with it and sends the token; the web UI asks for it (in $DEMO_DIR/apikey).
#   DEMO_DIR      where the agent's data, artifacts, the databases and logs go (default
#                 target/demo; emptied first: another folder only if it is empty or an earlier
#                 demo's); $DEMO_DIR/demo.env names the processes and URLs (tests/suite/demo.rs)
#   DEMO_SECONDS  how long the scene stays up after the summary (default 600), then it stops
#                 by itself; Ctrl-C stops it earlier
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TESTBED=${CLRSCOPE_TESTBED_DIR:-$ROOT/.testbed}
DOTNET=$TESTBED/bin/dotnet
STOREFRONT=$TESTBED/targets/Storefront/net10.0/Storefront.dll
LOAD=$TESTBED/targets/StorefrontLoad/net10.0/StorefrontLoad.dll
CLRSCOPE=${CLRSCOPE:-$ROOT/target/debug/clrscope}
SETTINGS=$ROOT/tests/testbed/demo-settings.json
PORT=${DEMO_PORT:-52323}
DEMO_DIR=${DEMO_DIR:-$ROOT/target/demo}
STAY_SECONDS=${DEMO_SECONDS:-600}
# How long the demo waits for the three to show. The services and the load end by themselves
# LIFE_SECONDS after they start, should the demo be killed without its trap running.
WAIT_SECONDS=120
LIFE_SECONDS=$((WAIT_SECONDS + STAY_SECONDS + 60))
RATE=20
MIX=catalog:2,product:4,cart:2,checkout:4,recommend:3,coupon:3
FRONTEND_BEHAVIOUR=hot_ms=25,exception_every=5
INVENTORY_BEHAVIOUR=inventory_delay_ms=5,inventory_tail_ms=400,inventory_tail_every=10
HOT_PATH=Storefront.Recommendations.RecommendationEngine.
EXCEPTION=Storefront.Pricing.CouponServiceException

say() { printf 'demo: %s\n' "$*" >&2; }

for file in "$DOTNET" "$STOREFRONT" "$LOAD"; do
    [ -e "$file" ] || { say "no $file in the test bed: run \`make setup\` first"; exit 1; }
done
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
artifacts=$DEMO_DIR/artifacts
mkdir -m 0700 "$artifacts"
agent_log=$DEMO_DIR/agent.log
started=$SECONDS

agent="" inventory="" frontend="" load="" sleeper=""
# Stops a process the demo started: SIGINT first, as Ctrl-C would; then SIGTERM, since a
# background job of a script inherits SIGINT ignored and .NET then never sees it; then SIGKILL.
stop() {
    local pid=$1 name=$2
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    say "stopping $name (pid $pid)"
    for signal in INT TERM; do
        kill -"$signal" "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break 2; sleep 0.1; done
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
# Newest first: the load, the frontend, its dependency, then the agent (it ends its sessions and
# flushes the store).
cleanup() {
    trap '' INT TERM # a second Ctrl-C must not cut the stopping short
    [ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null || true
    stop "$load" StorefrontLoad
    stop "$frontend" "Storefront (frontend)"
    stop "$inventory" "Storefront (inventory)"
    stop "$agent" "the agent"
}
trap cleanup EXIT
# Ctrl-C is how a person ends the demo: a clean stop, not a failure.
trap 'echo; say stopping on request; exit 0' INT TERM

# wait_for_line PID NAME LOG PATTERN: waits up to 60 s for PATTERN in LOG while PID runs.
wait_for_line() {
    local pid=$1 name=$2 log=$3 pattern=$4
    for _ in $(seq 600); do
        grep -qs "$pattern" "$log" && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    say "$name did not start:"
    cat "$log" >&2
    exit 1
}
# ready_field LOG FIELD: a string field of the ready line in LOG.
ready_field() { grep -m1 '"ready"' "$1" | grep -o "\"$2\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }

# --- an API key, as a user makes one: the agent's settings (its environment) and our token ---
"$CLRSCOPE" generatekey -o Shell >"$DEMO_DIR/apikey"
chmod 0600 "$DEMO_DIR/apikey"
eval "$(grep '^export ' "$DEMO_DIR/apikey")"
auth=$(grep '^Authorization: ' "$DEMO_DIR/apikey")
# What the printed commands send: a person pastes them as they are (the token stays in the file).
apikey_path=$DEMO_DIR/apikey
apikey_path=${apikey_path#"$PWD"/}
auth_arg="-H \"\$(grep '^Authorization: ' $apikey_path)\""

# --- the two Storefronts; they exit with this script ---
# start_storefront NAME LOG ARGS…: sets $started_pid. Idle thread-pool workers spin before they
# sleep (LowLevelSpinWaiter.Wait): on the 2 busy cores the demo is tried on that spinning took half
# the frontend's cpu samples and hid its hot endpoint, so it is off, as in a CPU-limited container.
start_storefront() {
    local name=$1 log=$2
    shift 2
    OTEL_SERVICE_NAME=$name TESTBED_EXIT_WITH_PARENT=1 DOTNET_ThreadPool_UnfairSemaphoreSpinLimit=0 \
        "$DOTNET" "$STOREFRONT" --sqlite "$DEMO_DIR/$name.db" --duration-seconds "$LIFE_SECONDS" "$@" \
        >"$log" 2>"${log%.log}.stderr.log" &
    started_pid=$!
}
start_storefront inventory "$DEMO_DIR/inventory.log" --role downstream --behaviour "$INVENTORY_BEHAVIOUR"
inventory=$started_pid
wait_for_line "$inventory" "Storefront (inventory)" "$DEMO_DIR/inventory.log" '"ready"'
inventory_url=$(ready_field "$DEMO_DIR/inventory.log" url)
inventory_grpc=$(ready_field "$DEMO_DIR/inventory.log" grpc_url)
start_storefront storefront "$DEMO_DIR/storefront.log" --role frontend --behaviour "$FRONTEND_BEHAVIOUR" \
    --downstream "$inventory_url" --downstream-grpc "$inventory_grpc"
frontend=$started_pid
wait_for_line "$frontend" "Storefront (frontend)" "$DEMO_DIR/storefront.log" '"ready"'
frontend_url=$(ready_field "$DEMO_DIR/storefront.log" url)
say "Storefront up: $frontend_url (pid $frontend), its inventory service $inventory_url (pid $inventory)"

# --- the agent, for these two only (--pid): it connects to their diagnostic sockets ---
# (CLRSCOPE_TESTBED_DIR is this script's, not a configuration key of the agent's.)
env -u CLRSCOPE_TESTBED_DIR CLRSCOPE_Egress__FileSystem__artifacts__DirectoryPath=$artifacts \
    "$CLRSCOPE" agent --config "$SETTINGS" --urls "http://127.0.0.1:$PORT" \
    --metrics-urls "http://127.0.0.1:${DEMO_METRICS_PORT:-52325}" --logs Warning \
    --data-dir "$DEMO_DIR/data" --pid "$frontend" --pid "$inventory" 2>"$agent_log" &
agent=$!
wait_for_line "$agent" "the agent" "$agent_log" 'API on'
api=$(grep -m1 -o 'API on http://[0-9.]*:[0-9]*' "$agent_log" | sed 's/^API on //')
say "agent up: $api, rules from ${SETTINGS#"$ROOT"/} (log: $agent_log)"
api_get() { curl -sf -H "$auth" "$api$1"; }

# --- the load ---
TESTBED_EXIT_WITH_PARENT=1 "$DOTNET" "$LOAD" --target "$frontend_url" --rps $RATE --mix $MIX \
    --duration-seconds "$LIFE_SECONDS" >"$DEMO_DIR/load.log" 2>&1 &
load=$!
wait_for_line "$load" StorefrontLoad "$DEMO_DIR/load.log" '"ready"'
say "StorefrontLoad drives it at $RATE requests/s ($MIX) while the demo is up"
cat >"$DEMO_DIR/demo.env" <<EOF
api=$api
agent=$agent
inventory=$inventory
frontend=$frontend
load=$load
frontend_url=$frontend_url
inventory_url=$inventory_url
inventory_behaviour=$INVENTORY_BEHAVIOUR
EOF

# --- wait for what the web UI shows ---
# (The checks' pipelines end early, grep -q and head, and a query may fail while the agent is busy:
# their status is the answer, never a reason to stop the demo.)
query=$(printf '%s' '{service_name="storefront"}' | sed 's/{/%7B/; s/}/%7D/; s/=/%3D/; s/"/%22/g')
# top_functions N: the N functions with the most cpu self time of the last minute, with shares.
top_functions() {
    api_get "/api/v1/profile?type=cpu&from=now-1m&query=$query&format=folded" |
        awk 'NF {n=split($0,f,";"); leaf=f[n]; sub(/ [0-9]+$/, "", leaf); t[leaf]+=$NF; all+=$NF}
             END {for (k in t) printf "%5.1f%%  %s\n", 100*t[k]/all, k}' | sort -rn | awk -v n="$1" 'NR <= n' || true
}
has_exceptions() { api_get "/api/v1/processes/$frontend/signals?level=Error&limit=5" | grep "\"$EXCEPTION\"" >/dev/null; }
# slow_reservation: the latest of the frontend's warnings "Inventory reservation … took N ms".
slow_reservation() {
    api_get "/api/v1/processes/$frontend/signals?level=Warning&limit=100" |
        grep -o '"Message":"Inventory reservation [^"]*"' | head -1 | cut -d'"' -f4 || true
}
rule_fired() { api_get "/api/v1/events?query=$query" | grep "\"rule\":\"$1\"" >/dev/null; }
declare -A seen=()
note() { [ -n "${seen[$1]:-}" ] || { seen[$1]=$((SECONDS - started)); say "${seen[$1]}s: $2"; }; }
while [ $((SECONDS - started)) -lt $WAIT_SECONDS ]; do
    top=$(top_functions 1)
    [[ "$top" == *"$HOT_PATH"* ]] && note hot "the top function: $top (the hot endpoint)"
    has_exceptions && note exceptions "the frontend's exceptions show $EXCEPTION"
    slow=$(slow_reservation)
    [ -n "$slow" ] && note dependency "the frontend warns: $slow (the slow inventory service)"
    for rule in SlowRecommendations SlowCheckouts; do rule_fired $rule && note "$rule" "rule $rule fired"; done
    [ ${#seen[@]} -eq 5 ] && break
    sleep 1
done
for what in hot exceptions dependency; do
    [ -n "${seen[$what]:-}" ] || say "not seen within ${WAIT_SECONDS}s: $what (see $agent_log)"
done

echo
echo "\$ curl $auth_arg '$api/collectionrules?pid=$frontend'"
api_get "/collectionrules?pid=$frontend" || true
echo
echo
echo "\$ ls -l $artifacts"
ls -l "$artifacts"
echo
echo "\$ curl -G $auth_arg '$api/api/v1/profile' -d type=cpu -d from=now-1m --data-urlencode 'query={service_name=\"storefront\"}' -d format=folded"
echo "  (self time per function, summed from those folded stacks:)"
top_functions 6 | sed 's/^/  /'
echo
echo "\$ curl $auth_arg '$api/api/v1/processes/$frontend/signals?level=Warning&limit=20'"
echo "  (what the web UI lists below the frontend's flame graph: the latest warning and error logs"
echo "  and the exceptions by type; each record carries its trace and span ids)"
signals=$(api_get "/api/v1/processes/$frontend/signals?level=Warning&limit=20" || true)
printf '%s\n' "$signals" | grep -o '"LogLevel":"[A-Za-z]*","Message":"\([^"\\]\|\\.\)*"' | head -4 |
    sed 's/"LogLevel":"\([A-Za-z]*\)","Message":/  \1 /' || true
# An exception's own typeName follows its timestamp (and trace id); its frames' do not.
printf '%s\n' "$signals" | grep -o '"timestamp":"[^"]*",\("traceId":"[^"]*",\)\?"typeName":"[^"]*"' |
    sed 's/.*"typeName":"\([^"]*\)"/\1/' | sort | uniq -c | sed 's/^ */  /' || true
echo
echo "  web UI:  $api/#type=cpu&service=storefront&pid=$frontend"
echo "           process $frontend: its exceptions and warnings below the flame graph; the timeline marks the rules"
echo "           it asks for a token: the Bearer value of the Authorization line in $apikey_path"
echo "  data:    $DEMO_DIR (artifacts in $artifacts)"
echo
say "up for ${STAY_SECONDS}s more; Ctrl-C stops the load, both Storefronts and the agent"
sleep "$STAY_SECONDS" &
sleeper=$!
wait "$sleeper" || true
