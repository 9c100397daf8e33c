#!/usr/bin/env python3
"""What collecting logs and exceptions costs the process logging, and the agent.

    benches/logs_overhead.py [--rates 100,1000,10000] [--seconds 10] [--warmup 5] [--agent PATH]

For each rate, the Logs target (tests/targets/Logs.cs: a Microsoft-Extensions-Logging stand-in
with the real provider's layout, messages in spans, 10 nested exception episodes a second) runs
three times: with no agent ("none"), under `clrscope agent` without --logs ("agent": the light
session with exceptions, logging provider off) and with `--logs Information` ("logs": every
message at Information or above written by the target's EventSource and decoded by the agent).
After --warmup seconds it measures --seconds: the messages the target logged per second (it is
paced, so a shortfall means it could not keep up), the target's CPU (utime+stime from
/proc/PID/stat, % of one core) and the agent's. Prints a Markdown table for BENCHMARKS.md.
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
# The runtime: CLRSCOPE_DOTNET (8, 9, 10; default 10), as in the tests.
TARGET = os.path.join(TESTBED, "targets", "Logs", f"net{os.environ.get('CLRSCOPE_DOTNET') or 10}.0",
                      "Logs.dll")
CLK_TCK = os.sysconf("SC_CLK_TCK")

CONFIGS = {"none": None, "agent": [], "logs": ["--logs", "Information"]}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


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
        if key in value:
            return value
    raise SystemExit(f"no {key!r} line from the target")


def run(rate, config, args, workdir):
    target = subprocess.Popen(
        [DOTNET, TARGET, "--messages-per-second", str(rate), "--no-span-lines"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    read_json_line(target, "ready", 30)
    agent = None
    if CONFIGS[config] is not None:
        agent = subprocess.Popen(
            [args.agent, "agent", "--urls", "http://127.0.0.1:0", "--metrics-urls", "none",
             "--temp-apikey", "--data-dir", os.path.join(workdir, f"{rate}-{config}"),
             "--pid", str(target.pid), *CONFIGS[config]],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(args.warmup)
    before = read_json_line(target, "progress", 5)
    t0, c0 = time.monotonic(), cpu_seconds(target.pid)
    a0 = cpu_seconds(agent.pid) if agent else 0.0
    time.sleep(args.seconds)
    # The target's own count over whole seconds of its clock (lines may wait in the pipe).
    while True:
        after = read_json_line(target, "progress", 5)
        if after["elapsed_s"] - before["elapsed_s"] >= args.seconds - 1:
            break
    t1, c1 = time.monotonic(), cpu_seconds(target.pid)
    a1 = cpu_seconds(agent.pid) if agent else 0.0
    if agent:
        agent.send_signal(signal.SIGINT)
        agent.wait(60)
    target.send_signal(signal.SIGINT)
    target.wait(30)
    seconds = t1 - t0
    return {
        "rate": rate,
        "config": config,
        "logged_per_s": (after["totals"]["logged"] - before["totals"]["logged"])
        / (after["elapsed_s"] - before["elapsed_s"]),
        "target_cpu_pct": 100 * (c1 - c0) / seconds,
        "agent_cpu_pct": 100 * (a1 - a0) / seconds if agent else None,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="100,1000,10000")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--agent", default=os.path.join(ROOT, "target", "release", "clrscope"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="clrscope-logs-bench-") as workdir:
        for rate in [int(r) for r in args.rates.split(",")]:
            for config in CONFIGS:
                row = run(rate, config, args, workdir)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    print("| msg/s asked | config | msg/s logged | target CPU | agent CPU |")
    print("|---|---|---|---|---|")
    for r in rows:
        agent = "–" if r["agent_cpu_pct"] is None else f"{r['agent_cpu_pct']:.1f} %"
        print(f"| {r['rate']} | {r['config']} | {r['logged_per_s']:.0f} | {r['target_cpu_pct']:.1f} % | {agent} |")


if __name__ == "__main__":
    main()
