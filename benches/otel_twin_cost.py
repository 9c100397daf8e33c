#!/usr/bin/env python3
"""What each way of getting a service's telemetry costs the service (issue 45 item 3).

    CLRSCOPE_DOTNET=10 benches/otel_twin_cost.py [--rps 200] [--seconds 60] [--warmup 15] [--agent PATH]

Three configurations of the Storefront service (tests/targets), one after another in one run, each
under the same StorefrontLoad (its own process, every route, at --rps for --seconds after a
--warmup of the same load):

- "nothing": Storefront alone;
- "sdk": StorefrontOtel, the OpenTelemetry .NET SDK inside (traces, metrics and logs over OTLP/gRPC
  to tests/otlp/receiver.py, the SDK's default export intervals);
- "clrscope": Storefront with `clrscope agent --pid PID --trace-linkage` beside it (defaults
  otherwise), exporting profiles and spans over OTLP/gRPC to the same receiver.

For each: the service's CPU per completed request (utime+stime from /proc/PID/stat over the measured
load, divided by the generator's completed count), the generator's p99 latency, and for clrscope the
agent's CPU (% of one core) and peak RSS (VmHWM). Prints a Markdown table for BENCHMARKS.md. Exits 1
on a setup problem, never because a figure is high.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.environ.get("CLRSCOPE_TESTBED_DIR", os.path.join(ROOT, ".testbed"))
DOTNET = os.path.join(TESTBED, "bin", "dotnet")
RUNTIME = os.environ.get("CLRSCOPE_DOTNET") or "10"
CLK_TCK = os.sysconf("SC_CLK_TCK")
MIX = "catalog:3,product:3,cart:2,checkout:2,recommend:1,coupon:1,report:1,health:1,grpc:2"


def dll(name):
    return os.path.join(TESTBED, "targets", name, f"net{RUNTIME}.0", f"{name}.dll")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def read_json_line(proc, key, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and key in value:
            return value
    raise SystemExit(f"no {key!r} line within {timeout} s")


def start_receiver(workdir):
    receiver = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "otlp", "receiver.py"), "--out-dir", workdir,
         "--grpc-port", "0", "--http-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, PYTHONPATH=os.path.join(TESTBED, "pypeers"), PYTHONDONTWRITEBYTECODE="1"))
    ready = read_json_line(receiver, "grpc_port", 30)
    # The receiver prints a line per request: drain them so it never blocks on the pipe.
    subprocess.Popen(["cat"], stdin=receiver.stdout, stdout=subprocess.DEVNULL)
    return receiver, ready["grpc_port"]


def load(ready, args, seconds):
    generator = subprocess.Popen(
        [DOTNET, dll("StorefrontLoad"), "--target", ready["url"], "--grpc-target", ready["grpc_url"],
         "--rps", str(args.rps), "--mix", MIX, "--duration-seconds", str(seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    exit_line = read_json_line(generator, "exit", seconds + 120)
    generator.wait(30)
    return exit_line


def run(config, args, workdir, grpc_port):
    name = "StorefrontOtel" if config == "sdk" else "Storefront"
    command = [DOTNET, dll(name)]
    if config == "sdk":
        command += ["--otlp-endpoint", f"http://127.0.0.1:{grpc_port}"]
    service = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready = read_json_line(service, "ready", 60)
    agent = None
    if config == "clrscope":
        settings = os.path.join(workdir, "settings.json")
        with open(settings, "w") as f:
            json.dump({"Exporters": {"otel": {"Kind": "otlp-grpc",
                                              "Endpoint": f"http://127.0.0.1:{grpc_port}",
                                              "Signals": ["Profiles", "Traces"]}}}, f)
        agent = subprocess.Popen(
            [args.agent, "agent", "--urls", "http://127.0.0.1:0", "--metrics-urls", "none",
             "--temp-apikey", "--data-dir", os.path.join(workdir, "store"), "--startup-grace", "0s",
             "--pid", str(service.pid), "--trace-linkage", "--config", settings],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Drain the service's lines from now on (it prints nothing per request without --request-lines).
    subprocess.Popen(["cat"], stdin=service.stdout, stdout=subprocess.DEVNULL)
    load(ready, args, args.warmup)
    c0 = cpu_seconds(service.pid)
    a0 = cpu_seconds(agent.pid) if agent else 0.0
    t0 = time.monotonic()
    exit_line = load(ready, args, args.seconds)
    t1 = time.monotonic()
    c1 = cpu_seconds(service.pid)
    row = {
        "runtime": RUNTIME,
        "config": config,
        "completed": exit_line["completed"],
        "requests_per_s": exit_line["completed"] / args.seconds,
        "cpu_ms_per_request": 1000 * (c1 - c0) / max(exit_line["completed"], 1),
        "p99_ms": exit_line["latency_ms"]["p99"],
    }
    if agent:
        row["agent_cpu_pct"] = 100 * (cpu_seconds(agent.pid) - a0) / (t1 - t0)
        row["agent_peak_rss_mib"] = peak_rss_kib(agent.pid) / 1024
        agent.send_signal(signal.SIGINT)
        agent.wait(60)
    service.send_signal(signal.SIGINT)
    service.wait(30)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rps", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--agent", default=os.path.join(ROOT, "target", "release", "clrscope"))
    args = parser.parse_args()
    for path in [DOTNET, dll("Storefront"), dll("StorefrontOtel"), dll("StorefrontLoad"), args.agent]:
        if not os.path.exists(path):
            raise SystemExit(f"missing {path}: run `make setup` (and build the agent)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="clrscope-twin-cost-") as workdir:
        receiver, grpc_port = start_receiver(workdir)
        try:
            for config in ["nothing", "sdk", "clrscope"]:
                row = run(config, args, workdir, grpc_port)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
        finally:
            receiver.kill()
    print("| runtime | telemetry | requests/s | service CPU per request | p99 | agent CPU | agent peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        agent = (f"{r['agent_cpu_pct']:.1f} %", f"{r['agent_peak_rss_mib']:.0f} MiB") if "agent_cpu_pct" in r \
            else ("–", "–")
        print(f"| .NET {r['runtime']} | {r['config']} | {r['requests_per_s']:.0f} | "
              f"{r['cpu_ms_per_request']:.2f} ms | {r['p99_ms']} ms | {agent[0]} | {agent[1]} |")


if __name__ == "__main__":
    main()
