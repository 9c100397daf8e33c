#!/usr/bin/env bash
# tests/testbed/setup.sh: installs and builds clrscope's real .NET test bed.
#
#   tests/testbed/setup.sh            everything `make test` uses: mirror, runtimes, peers, targets
#   tests/testbed/setup.sh mirror     only points cargo and pip at ../shared/mirror (when it exists)
#   tests/testbed/setup.sh demo       only what `make demo` uses: the runtimes, the targets and curl
#   tests/testbed/setup.sh targets    rebuild the targets (after `all` or `demo`)
#   tests/testbed/setup.sh peers      only Microsoft's diagnostics tools and the TraceEvent reader
#
# What it installs (idempotent; a few seconds when everything is there):
#   * the offline mirror: when ../shared/mirror/use exists beside the clone (machines that reach no
#     crates registry and no Python index), it is run first, so cargo and pip read the mirror;
#   * the .NET runtimes of the matrix, side by side in .testbed/dotnet (a `dotnet` root of its
#     own): Microsoft.NETCore.App and Microsoft.AspNetCore.App 8, 9 and 10 from NuGet's runtime
#     packs, at the patch versions the SDK picks (tests/testbed/runtimes/Runtimes.csproj), and 11
#     when its packs can be had (Runtimes11.csproj; said either way). Needs the .NET SDK >= 10 on
#     PATH: it restores the packs and builds the targets;
#   * .testbed/bin/dotnet -> .testbed/dotnet/dotnet, and .testbed/runtimes.env naming each runtime;
#   * the targets: tests/targets/Targets.slnx built by `dotnet build` for net8.0, net9.0 and
#     net10.0 into .testbed/targets/<Name>/<tfm>/ (skipped when no source changed since), and
#     tests/targets/StorefrontAot published with NativeAOT (`dotnet publish`, net10.0, the
#     ILCompiler package the SDK picks) into .testbed/targets/StorefrontAot/publish/;
#   * Microsoft's diagnostics tools dotnet-trace, dotnet-counters and dotnet-gcdump ($DOTNET_TOOLS_VERSION,
#     NuGet) in .testbed/tools, run on the test bed's own runtimes (DOTNET_ROOT=.testbed/dotnet), and
#     tests/peers/TraceEventReader (TraceEvent $TRACEEVENT_VERSION) built into .testbed/peers: the
#     peers tests/suite/peers.rs compares clrscope with;
#   * `go` (Debian golang-go), whose `go tool pprof` is the real pprof reader;
#   * `promtool` and `prometheus` (Debian prometheus; the package's service is not started);
#   * Debian `python3-yaml` (tests/deploy.rs parses the Kubernetes manifests with it);
#   * Debian `postgresql` (its initdb, postgres and psql: tests/support/postgres.rs starts a server of
#     its own per test, on a unix socket; the package's own cluster and service are not used);
#   * `curl` (Debian curl), with which the demo asks the agent's HTTP API;
#   * Python `opentelemetry-proto`, `grpcio`, `grpcio-tools` and `moto[server]` in .testbed/pypeers
#     (the OTLP receiver tests/otlp/receiver.py, and the S3 server of tests/api_monitor.rs);
#   * Debian `chromium`, Node.js and the npm packages of $NPM_PACKAGES in .testbed/node
#     (`playwright-core` drives the system Chromium: no browser download; the Connect client of
#     tests/querier.rs; `azurite`, the Azure Storage emulator, 3.35.0: the last for Node 20).
#
# The test-bed folder is $CLRSCOPE_TESTBED_DIR, else <repo>/.testbed. Each step prints one line;
# what apt-get, pip, npm and dotnet print goes to .testbed/setup.log, whose end is shown on failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TESTBED=${CLRSCOPE_TESTBED_DIR:-$ROOT/.testbed}
case "$TESTBED" in /*) ;; *) TESTBED=$ROOT/$TESTBED ;; esac
MIRROR_USE=$ROOT/../shared/mirror/use
PLAYWRIGHT_VERSION=1.65.1
# The Python peers' packages: opentelemetry-proto 1.45.x has the proto v1.10 profiles layout (the
# OTLP receiver); moto's server stands in for S3 (`python3 -m moto.server`).
PYPEERS_PACKAGES=(opentelemetry-proto==1.45.2 grpcio==1.85.1 grpcio-tools==1.85.1
    'moto[server]==5.2.5')
# Installed by one `npm install` (one that named fewer would remove the others).
NPM_PACKAGES=(
    "playwright-core@$PLAYWRIGHT_VERSION"
    @connectrpc/connect@2.3.0
    @connectrpc/connect-node@2.3.0
    @bufbuild/protobuf@2.17.0
    @bufbuild/protoc-gen-es@2.17.0
    @bufbuild/buf@1.75.0
    azurite@3.35.0
)
# Microsoft's diagnostics tools (one version for the three) and the TraceEvent the reader is built on
# (tests/peers/TraceEventReader/TraceEventReader.csproj names it too).
DOTNET_TOOLS=(dotnet-trace dotnet-counters dotnet-gcdump)
DOTNET_TOOLS_VERSION=10.0.750501
TRACEEVENT_VERSION=4.0.0
# The SDK that builds the targets and restores the runtime packs.
SDK_MAJOR_MIN=10
DOTNET_ROOT_DIR=$TESTBED/dotnet

say() { printf 'testbed: %s\n' "$*" >&2; }
die() { printf 'testbed: error: %s\n' "$*" >&2; exit 1; }

SETUP_LOG=$TESTBED/setup.log
# `quietly CMD…`: runs a package manager with its output appended to $SETUP_LOG; on failure shows
# the end of it and names the log.
quietly() {
    mkdir -p "$TESTBED"
    printf '\n$ %s\n' "$*" >>"$SETUP_LOG"
    if ! "$@" >>"$SETUP_LOG" 2>&1; then
        tail -n 25 "$SETUP_LOG" >&2
        die "'$*' failed; its whole output is in $SETUP_LOG"
    fi
}

# ---------------------------------------------------------------------------------------------
# the offline mirror of crates and wheels

ensure_mirror() {
    [ -x "$MIRROR_USE" ] || return 0
    # One line from the script itself ("mirror: cargo -> …"); idempotent and quick.
    (cd "$ROOT" && "$MIRROR_USE") >&2 || die "$MIRROR_USE failed"
}

# ---------------------------------------------------------------------------------------------
# privileged package installation (Debian)

SUDO=()
APT_UPDATED=0
need_root() {
    if [ "$(id -u)" -eq 0 ]; then
        SUDO=()
    elif command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        die "need to install '$1' with apt-get, but this is not root and sudo is missing: install it yourself (apt-get install -y --no-install-recommends $1) or rerun as root"
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "need to install '$1' but apt-get is missing (not Debian/Ubuntu?): install it yourself"
}

apt_install() {
    need_root "$*"
    if [ "$APT_UPDATED" -eq 0 ]; then
        say "apt-get update…"
        quietly "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    quietly "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$@"
}

# ---------------------------------------------------------------------------------------------
# the .NET SDK and the runtimes of the matrix

# `ensure_sdk`: sets SDK_DOTNET to a `dotnet` on PATH with an SDK >= $SDK_MAJOR_MIN.
ensure_sdk() {
    local path_dotnet best
    # Our own host (.testbed/bin) has runtimes only: look past it.
    path_dotnet=$(PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$TESTBED/bin" | paste -sd: -) \
        command -v dotnet 2>/dev/null || true)
    [ -n "$path_dotnet" ] ||
        die "no \`dotnet\` on PATH: the test bed needs the .NET SDK >= $SDK_MAJOR_MIN (https://learn.microsoft.com/dotnet/core/install/linux-debian) to restore the runtimes and build tests/targets"
    best=$("$path_dotnet" --list-sdks 2>/dev/null | awk '{ split($1, v, "."); if (v[1] + 0 > m) m = v[1] + 0 } END { print m + 0 }')
    [ "$best" -ge "$SDK_MAJOR_MIN" ] ||
        die "$path_dotnet has no SDK >= $SDK_MAJOR_MIN (\`dotnet --list-sdks\`: ${best:-none}): install the .NET $SDK_MAJOR_MIN SDK"
    SDK_DOTNET=$path_dotnet
    export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1
}

# `restore_packs PROJECT`: restores PROJECT (a project that only downloads runtime packs) and prints
# "NAME VERSION" for every runtime pack its restore downloaded.
restore_packs() {
    local project=$1 obj=$TESTBED/obj/runtimes/$(basename "$1" .csproj)
    quietly "$SDK_DOTNET" restore "$project" "-p:BaseIntermediateOutputPath=$obj/"
    python3 - "$obj/project.assets.json" <<'PY'
import json, re, sys
assets = json.load(open(sys.argv[1]))
seen = set()
for framework in assets["project"]["frameworks"].values():
    for dep in framework.get("downloadDependencies", []):
        name, version = dep["name"], re.sub(r"[\[\]() ]", "", dep["version"]).split(",")[0]
        if name.endswith(".Runtime.linux-x64") and (name, version) not in seen:
            seen.add((name, version))
            print(name, version)
PY
}

# `install_pack NAME VERSION`: lays the runtime pack out as a shared framework under $DOTNET_ROOT_DIR
# (the pack's managed and native files side by side, as a `dotnet` install has them). Prints the
# framework's name.
install_pack() {
    local name=$1 version=$2 pack framework dir major
    pack=$NUGET_PACKAGES_DIR/$(printf '%s' "$name" | tr '[:upper:]' '[:lower:]')/$version/runtimes/linux-x64
    framework=${name%.Runtime.linux-x64}
    dir=$DOTNET_ROOT_DIR/shared/$framework/$version
    major=${version%%.*}
    [ -d "$pack/lib/net$major.0" ] || die "runtime pack $name $version has no lib/net$major.0 in $pack"
    if [ ! -f "$dir/.complete" ]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        cp -R "$pack/lib/net$major.0/." "$dir/"
        [ -d "$pack/native" ] && cp -R "$pack/native/." "$dir/"
        # NuGet drops the run bit: the runtime execs createdump for dumps.
        [ -f "$dir/createdump" ] && chmod +x "$dir/createdump"
        touch "$dir/.complete"
    fi
    echo "$framework"
}

ensure_runtimes() {
    ensure_sdk
    NUGET_PACKAGES_DIR=$("$SDK_DOTNET" nuget locals global-packages --list | sed -n 's/^global-packages: //p')
    NUGET_PACKAGES_DIR=${NUGET_PACKAGES_DIR%/}
    [ -n "$NUGET_PACKAGES_DIR" ] || die "\`dotnet nuget locals global-packages --list\` named no folder"
    local stamp=$DOTNET_ROOT_DIR/.packs want packs="" packs11="" line name version versions="" v11=""
    want=$(cat "$ROOT/tests/testbed/runtimes/"*.csproj "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
    if [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$want" ] && [ -x "$DOTNET_ROOT_DIR/dotnet" ]; then
        RUNTIME_VERSIONS=$(sed -n 2p "$stamp")
        RUNTIME_11_NOTE=$(sed -n 3p "$stamp")
    else
        say "restoring the runtime packs of .NET 8, 9 and 10 (NuGet)…"
        packs=$(restore_packs "$ROOT/tests/testbed/runtimes/Runtimes.csproj")
        # .NET 11: no SDK here builds net11.0, but its runtime runs the net10.0 builds rolled forward.
        if packs11=$( (restore_packs "$ROOT/tests/testbed/runtimes/Runtimes11.csproj") 2>/dev/null); then
            packs=$(printf '%s\n%s\n' "$packs" "$packs11")
            RUNTIME_11_NOTE="present"
        else
            RUNTIME_11_NOTE="its runtime packs did not restore from this machine's NuGet (see $SETUP_LOG)"
            say ".NET 11: $RUNTIME_11_NOTE; the matrix runs 8, 9 and 10"
        fi
        mkdir -p "$DOTNET_ROOT_DIR/host/fxr"
        while read -r name version; do
            [ -n "$name" ] || continue
            install_pack "$name" "$version" >/dev/null
            case "$name" in Microsoft.NETCore.App.*) versions="$versions $version" ;; esac
        done <<<"$packs"
        RUNTIME_VERSIONS=$(printf '%s\n' $versions | sort -t. -k1,1n -k2,2n -k3,3n | paste -sd' ' -)
        # The host: the SDK's muxer (a copy: it finds host/fxr beside its own real path) and the
        # newest runtime's hostfxr, which resolves every older framework too.
        local newest=${RUNTIME_VERSIONS##* }
        cp -f "$(readlink -f "$SDK_DOTNET")" "$DOTNET_ROOT_DIR/dotnet.partial"
        mv -f "$DOTNET_ROOT_DIR/dotnet.partial" "$DOTNET_ROOT_DIR/dotnet"
        rm -rf "$DOTNET_ROOT_DIR/host/fxr/"*
        mkdir -p "$DOTNET_ROOT_DIR/host/fxr/$newest"
        cp -f "$DOTNET_ROOT_DIR/shared/Microsoft.NETCore.App/$newest/libhostfxr.so" "$DOTNET_ROOT_DIR/host/fxr/$newest/"
        printf '%s\n%s\n%s\n' "$want" "$RUNTIME_VERSIONS" "$RUNTIME_11_NOTE" >"$stamp"
        say "runtimes in $DOTNET_ROOT_DIR: $RUNTIME_VERSIONS"
    fi
    mkdir -p "$TESTBED/bin"
    if [ "$(readlink "$TESTBED/bin/dotnet" 2>/dev/null || true)" != "$DOTNET_ROOT_DIR/dotnet" ]; then
        ln -sfn "$DOTNET_ROOT_DIR/dotnet" "$TESTBED/bin/dotnet"
    fi
    write_runtimes_env
}

# .testbed/runtimes.env: what the Rust test support and `make test-matrix` read. Rewritten only when
# its content changes.
write_runtimes_env() {
    local env_file=$TESTBED/runtimes.env new v majors=""
    for v in $RUNTIME_VERSIONS; do majors="$majors ${v%%.*}"; done
    new=$(printf 'DOTNET_ROOT=%s\nRUNTIMES=%s\nMAJORS=%s\nRUNTIME_11=%s\n' \
        "$DOTNET_ROOT_DIR" "$RUNTIME_VERSIONS" "${majors# }" "$RUNTIME_11_NOTE")
    if [ ! -f "$env_file" ] || [ "$(cat "$env_file")" != "$new" ]; then
        printf '%s\n' "$new" >"$env_file"
    fi
}

# ---------------------------------------------------------------------------------------------
# the targets

ensure_targets() {
    local stamp=$TESTBED/targets/.built want
    # Every file the build reads from the repository, and the SDK's version.
    want=$( (cd "$ROOT/tests/targets" && find . -type f \( -name '*.cs' -o -name '*.csproj' -o -name '*.props' -o -name '*.slnx' -o -name '*.proto' -o -name '*.json' \) -print0 |
        sort -z | xargs -0 sha256sum; "$SDK_DOTNET" --version) | sha256sum | cut -c1-16)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return
    fi
    say "building tests/targets (dotnet build: net8.0, net9.0, net10.0)…"
    quietly "$SDK_DOTNET" build "$ROOT/tests/targets/Targets.slnx" -c Release -nologo -v:q \
        "-p:ClrscopeTestbed=$TESTBED"
    # Not in Targets.slnx: `dotnet publish` compiles it to native code (the SDK picks the
    # ILCompiler package of its .NET 10), a few minutes of the build.
    say "publishing tests/targets/StorefrontAot (NativeAOT, net10.0)…"
    quietly "$SDK_DOTNET" publish "$ROOT/tests/targets/StorefrontAot/StorefrontAot.csproj" -c Release \
        -nologo -v:q "-p:ClrscopeTestbed=$TESTBED"
    printf '%s\n' "$want" >"$stamp"
}

# ---------------------------------------------------------------------------------------------
# peers

# dotnet-trace, dotnet-counters, dotnet-gcdump (NuGet) in $TESTBED/tools, and the TraceEvent reader
# (tests/peers) in $TESTBED/peers: the peers of tests/suite/peers.rs.
ensure_dotnet_peers() {
    local stamp=$TESTBED/tools/.installed want tool
    want=$( (printf '%s\n' "${DOTNET_TOOLS[@]}" "$DOTNET_TOOLS_VERSION" "$TRACEEVENT_VERSION"
        cd "$ROOT/tests/peers" && find . -type f \( -name '*.cs' -o -name '*.csproj' -o -name '*.props' \) -print0 |
            sort -z | xargs -0 sha256sum; "$SDK_DOTNET" --version) | sha256sum | cut -c1-16)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return
    fi
    say "installing ${DOTNET_TOOLS[*]} $DOTNET_TOOLS_VERSION (dotnet tool, NuGet) into $TESTBED/tools…"
    rm -rf "$TESTBED/tools"
    for tool in "${DOTNET_TOOLS[@]}"; do
        quietly "$SDK_DOTNET" tool install "$tool" --version "$DOTNET_TOOLS_VERSION" \
            --tool-path "$TESTBED/tools"
    done
    say "building tests/peers/TraceEventReader (TraceEvent $TRACEEVENT_VERSION)…"
    quietly "$SDK_DOTNET" build "$ROOT/tests/peers/TraceEventReader/TraceEventReader.csproj" -c Release \
        -nologo -v:q "-p:ClrscopeTestbed=$TESTBED"
    printf '%s\n' "$want" >"$stamp"
}

# go tool pprof (a real peer for pprof output)
ensure_go() {
    command -v go >/dev/null 2>&1 && return
    say "installing go tool pprof (Debian golang-go)…"
    apt_install golang-go
    command -v go >/dev/null 2>&1 || die "golang-go installed but go is not on PATH"
}

# promtool and the Prometheus server (tests/metrics.rs: the agent's /metrics is valid and scraped)
ensure_prometheus() {
    if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
        return
    fi
    say "installing promtool and prometheus (Debian prometheus)…"
    apt_install prometheus
    command -v promtool >/dev/null 2>&1 || die "prometheus installed but promtool is not on PATH"
}

# Debian's python3 with PyYAML (tests/deploy.rs parses the Kubernetes manifests with it)
ensure_pyyaml() {
    /usr/bin/python3 -c 'import yaml' >/dev/null 2>&1 && return
    say "installing PyYAML (Debian python3-yaml)…"
    apt_install python3-yaml
}

# PostgreSQL's server programs (the Storefront's database in tests/suite/storefront.rs)
ensure_postgres() {
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && command -v psql >/dev/null 2>&1 && return
    say "installing PostgreSQL (Debian postgresql)…"
    apt_install postgresql
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || die "postgresql installed but no /usr/lib/postgresql/*/bin/initdb"
}

# curl (the demo asks the agent's HTTP API with it)
ensure_curl() {
    command -v curl >/dev/null 2>&1 && return
    say "installing curl (Debian curl)…"
    apt_install curl
}

# Chromium, Node.js and the tests' npm packages (the web UI's browser test, the querier's client)
ensure_browser() {
    if [ ! -x /usr/bin/chromium ]; then
        say "installing chromium (Debian chromium)…"
        apt_install chromium
    fi
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        say "installing Node.js (Debian nodejs, npm)…"
        apt_install nodejs npm
    fi
    local spec name installed stale=0
    for spec in "${NPM_PACKAGES[@]}"; do
        name=${spec%@*}
        installed=$(node -p "require('$TESTBED/node/node_modules/$name/package.json').version" 2>/dev/null || true)
        [ "$name@$installed" = "$spec" ] || stale=1
    done
    if [ "$stale" -eq 1 ]; then
        say "installing ${NPM_PACKAGES[*]} (npm) into $TESTBED/node…"
        mkdir -p "$TESTBED/node"
        quietly npm install --prefix "$TESTBED/node" --no-save --no-audit --no-fund \
            "${NPM_PACKAGES[@]}"
    fi
}

# `find_pip`: sets the array `pip` to a pip command, installing Debian's python3-pip if none.
find_pip() {
    if python3 -m pip --version >/dev/null 2>&1; then
        pip=(python3 -m pip)
    elif command -v pip3 >/dev/null 2>&1; then
        pip=(pip3)
    else
        apt_install python3-pip
        pip=(python3 -m pip)
    fi
}

# Python packages of the OTLP/Pyroscope receiver (tests/otlp/receiver.py) and of moto's S3 server
# (tests/api_monitor.rs runs PYTHONPATH=$TESTBED/pypeers python3 -m moto.server)
ensure_python_peers() {
    local stamp=$TESTBED/pypeers/.installed want
    want=${PYPEERS_PACKAGES[*]}
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return
    fi
    local pip=()
    find_pip
    say "installing ${PYPEERS_PACKAGES[*]} (pip) into $TESTBED/pypeers…"
    rm -rf "$TESTBED/pypeers.partial"
    quietly "${pip[@]}" install --root-user-action=ignore --disable-pip-version-check --no-input \
        --no-compile --target "$TESTBED/pypeers.partial" "${PYPEERS_PACKAGES[@]}"
    rm -rf "$TESTBED/pypeers"
    mv "$TESTBED/pypeers.partial" "$TESTBED/pypeers"
    printf '%s\n' "$want" >"$stamp"
}

cmd_demo() {
    ensure_mirror
    ensure_runtimes
    ensure_targets
    ensure_curl
}

cmd_all() {
    ensure_mirror
    ensure_runtimes
    ensure_targets
    ensure_dotnet_peers
    ensure_go
    ensure_prometheus
    ensure_pyyaml
    ensure_postgres
    ensure_curl
    ensure_browser
    ensure_python_peers
}

case "${1:-all}" in
all) cmd_all ;;
mirror) ensure_mirror ;;
demo) cmd_demo ;;
targets)
    ensure_sdk
    ensure_targets
    ;;
peers)
    ensure_sdk
    ensure_dotnet_peers
    ;;
*) die "usage: $0 [all|mirror|demo|targets|peers]" ;;
esac
