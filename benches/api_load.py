#!/usr/bin/env python3
"""The agent's API under the load of many web UI clients, while it profiles a fleet of processes.

    benches/api_load.py [--rates 200,50] [--rounds 1] [--seconds 60] [--targets 16] [--settle 60]
                        [--no-build] [--binary PATH] [--agent-args "..."]

Starts --targets test-bed processes (a mix: CpuHot, AsyncWeb and Bookstore with their own
request load, Alloc, Faults, SpanLoops, Meters, Logs; each light, so that the fleet does not
drown the machine) and one release `clrscope agent` profiling only them (default settings, a key
of its own: every request carries `Authorization: Bearer <token>` as the agent requires). After
--settle seconds (the store then holds minutes of every process), it sends requests at a constant
arrival rate for --seconds per run: open loop, request i leaves at start + i / rate whether or
not earlier ones were answered, each on a connection of its own, so a slow agent shows as
latency and never slows the offered load down. Latency is measured from the moment a request
was due (so a generator that falls behind adds to it rather than hides it) to the last byte of
the answer. With several --rates, runs alternate (A, B, A, B for --rounds 2), so a drift of the
machine's load hits every rate.

The requests are those the web UI makes (ui/web/*.js), drawn at random with these weights per
100 (MIX below): the filter lists it loads on every refresh (profile types, label names, the
service and process values: 32), the processes list (10), the timeline's series and events for
the 5-minute and 1-hour windows (28), the flame graph (and top table, drawn from the same
answer) of the window, of one process and of the last hour, 65,536 nodes (23), a comparison of
the last minute with the one before (3) and one process's error signals (4).

Reported per run: per route, requests, errors (anything but a 200, by status, or no answer),
p50/p90/p99/max latency; the offered and achieved rate; the generator's own lag; the agent's
CPU (utime+stime from /proc, % of one core) and RSS (mean and peak over the run); the load
average; and from the agent's /metrics the deltas of what ingestion could have lost
(clrscope_store_dropped_batches_total, clrscope_store_write_errors_total,
clrscope_eventpipe_dropped_events_total, clrscope_session_restarts_total), of samples taken, and
of the admission counters (rejected, cancelled, per route class). The script exits 1 on a setup
problem, never because a goal was missed: the goals are printed beside the numbers.
"""

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_overhead import (  # noqa: E402  (the fleet's targets and /proc readings, shared)
    CLRSCOPE, SetupError, Target, cpu_seconds, loadavg, log, prepare, status_kib)

# (name, arguments) of the fleet, cycled to --targets processes; each uses a few % of a core.
FLEET = [
    ("CpuHot", ["--split", "60,30,10", "--cores", "0.05"]),
    ("AsyncWeb", ["--self-load", "5", "--no-request-lines"]),
    ("Bookstore", ["--self-load", "5", "--report-rows", "2000"]),
    ("Alloc", ["--keep", "10000,2500,100", "--churn-per-second", "20000"]),
    ("Faults", ["--exceptions-per-second", "10", "--secondary-per-second", "2",
                "--lock-episodes-per-second", "5"]),
    ("CpuHot", ["--split", "50,50", "--cores", "0.05"]),
    ("AsyncWeb", ["--self-load", "5", "--no-request-lines"]),
    ("SpanLoops", ["--loops", "1", "--no-span-lines"]),
    ("Meters", ["--no-wait", "--steps", "1000", "--step-ms", "1000"]),
    ("Logs", ["--messages-per-second", "10", "--exceptions-per-second", "1", "--no-span-lines"]),
    ("CpuHot", ["--split", "70,30", "--cores", "0.05"]),
    ("Alloc", ["--keep", "10000,2500,100", "--churn-per-second", "20000"]),
    ("Faults", ["--exceptions-per-second", "10", "--secondary-per-second", "2",
                "--lock-episodes-per-second", "5"]),
    ("Bookstore", ["--self-load", "5", "--report-rows", "2000"]),
    ("CpuHot", ["--split", "40,60", "--cores", "0.05"]),
    ("AsyncWeb", ["--self-load", "5", "--no-request-lines"]),
]

MINUTE_MS = 60_000


def mix(pids):
    """The web UI's requests as (route name, weight, function of now in ms -> path)."""
    def profile(span_ms, query=""):
        return lambda now: "/api/v1/profile?" + urllib.parse.urlencode(
            {"type": "cpu", "query": query, "from": now - span_ms, "until": now,
             "format": "json", "max_nodes": 65536})

    def series(span_ms, step):
        return lambda now: "/api/v1/series?" + urllib.parse.urlencode(
            {"type": "cpu", "query": "", "from": now - span_ms, "until": now, "step": step})

    def one_process():
        return '{process_id="%d"}' % random.choice(pids)

    return [
        ("profile-types", 8, lambda now: "/api/v1/profile-types"),
        ("labels", 8, lambda now: "/api/v1/labels"),
        ("labels/service_name/values", 8, lambda now: "/api/v1/labels/service_name/values"),
        ("labels/process_id/values", 8, lambda now: "/api/v1/labels/process_id/values"),
        ("processes", 10, lambda now: "/api/v1/processes"),
        ("events 5m", 6, lambda now: f"/api/v1/events?query=&from={now - 5 * MINUTE_MS}&until={now}"),
        ("events 1h", 4, lambda now: f"/api/v1/events?query=&from={now - 60 * MINUTE_MS}&until={now}"),
        ("series 5m", 10, series(5 * MINUTE_MS, "10000ms")),
        ("series 1h", 8, series(60 * MINUTE_MS, "30000ms")),
        ("profile 5m", 10, profile(5 * MINUTE_MS)),
        ("profile 5m, one process", 8,
         lambda now: profile(5 * MINUTE_MS, one_process())(now)),
        ("profile 1h", 5, profile(60 * MINUTE_MS)),
        ("diff 1m", 3, lambda now: "/api/v1/diff?" + urllib.parse.urlencode(
            {"type": "cpu", "query": "", "base_from": now - 2 * MINUTE_MS,
             "base_until": now - MINUTE_MS, "from": now - MINUTE_MS, "until": now,
             "format": "json"})),
        ("signals", 4, lambda now: f"/api/v1/processes/{random.choice(pids)}/signals?level=Error&limit=50"),
    ]


class Agent:
    """A release `clrscope agent` limited to the fleet, on free ports, with a key of its own."""

    def __init__(self, binary, pids, workdir, extra_args):
        self.token_file = os.path.join(workdir, "token")
        self.log_path = os.path.join(workdir, "agent.log")
        self.log_file = open(self.log_path, "w")
        pid_args = [a for pid in pids for a in ("--pid", str(pid))]
        command = [binary, "agent", "--urls", "http://127.0.0.1:0",
                   "--metrics-urls", "http://127.0.0.1:0", "--temp-apikey",
                   "--temp-apikey-file", self.token_file,
                   "--data-dir", os.path.join(workdir, "data"), *pid_args, *extra_args]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.log_file)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise SetupError(f"the agent exited with code {self.proc.returncode}; see {self.log_path}")
            with open(self.log_path) as f:
                started = re.search(r"API on http://127\.0\.0\.1:(\d+); metrics http://127\.0\.0\.1:(\d+)",
                                    f.read())
            if started:
                self.port, self.metrics_port = int(started[1]), int(started[2])
                break
            if time.monotonic() > deadline:
                raise SetupError(f"the agent did not listen within 60 s; see {self.log_path}")
            time.sleep(0.2)
        with open(self.token_file) as f:
            self.token = f.read().strip()

    def metrics(self):
        """/metrics as {series: value}."""
        text = http_get(self.metrics_port, "/metrics")
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                series, _, value = line.rpartition(" ")
                values[series] = float(value)
        return values

    def attached(self):
        return json.loads(http_get(self.port, "/api/v1/processes", self.token))

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()


def http_get(port, path, token=None):
    """A blocking GET for setup and /metrics; the load itself goes through `fetch`."""
    import http.client
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    body = response.read().decode()
    connection.close()
    if response.status != 200:
        raise SetupError(f"GET {path}: {response.status} {body[:300]}")
    return body


async def fetch(port, token, path):
    """One request on a connection of its own; its status (0: no answer) when the last byte came."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0
    try:
        writer.write((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                      f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n").encode())
        await writer.drain()
        status_line = await reader.readline()
        await reader.read()  # to the end: the answer is complete when the agent closes
        parts = status_line.split()
        return int(parts[1]) if len(parts) > 1 else 0
    except (OSError, ValueError):
        return 0
    finally:
        writer.close()


async def offer_load(agent, routes, rate, seconds, timeout):
    """Sends rate requests per second for `seconds`, open loop; returns [(route, status, latency s)]
    and the generator's largest lag behind the schedule."""
    weights = [w for _, w, _ in routes]
    results = []
    max_lag = 0.0
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.1
    total = int(rate * seconds)

    async def one(name, path, due):
        try:
            status = await asyncio.wait_for(fetch(agent.port, agent.token, path), timeout)
        except asyncio.TimeoutError:
            status = 0
        results.append((name, status, loop.time() - due))

    tasks = []
    for i in range(total):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        max_lag = max(max_lag, loop.time() - due)
        name, _, make = random.choices(routes, weights)[0]
        tasks.append(asyncio.create_task(one(name, make(int(time.time() * 1000)), due)))
    await asyncio.gather(*tasks)
    return results, max_lag


class UsageWatch:
    """The agent's CPU and RSS, read from /proc every second on a thread of its own."""

    def __init__(self, pid):
        self.pid = pid
        self.rss_kib = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.cpu0, self.t0 = cpu_seconds(self.pid), time.monotonic()
        self.load0 = loadavg()
        self.thread.start()
        return self

    def _run(self):
        while not self.stop_event.wait(1.0):
            self.rss_kib.append(status_kib(self.pid, "VmRSS"))

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join()
        self.cpu_pct = 100 * (cpu_seconds(self.pid) - self.cpu0) / (time.monotonic() - self.t0)
        self.load1 = loadavg()


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]


LOSS_COUNTERS = ["clrscope_store_dropped_batches_total", "clrscope_store_write_errors_total",
                 "clrscope_eventpipe_dropped_events_total", "clrscope_session_restarts_total"]


def delta(before, after, prefix):
    """Sum of the change of every series of a family (every label set)."""
    keys = {k for k in list(before) + list(after) if k == prefix or k.startswith(prefix + "{")}
    return sum(after.get(k, 0.0) - before.get(k, 0.0) for k in keys)


def by_class(before, after, family):
    out = {}
    for key in after:
        if key.startswith(family + "{"):
            cls = key.split('route_class="')[1].split('"')[0]
            out[cls] = after[key] - before.get(key, 0.0)
    return out


def report(rate, seconds, results, max_lag, usage, before, after):
    print(f"\n## {rate} requests/s for {seconds} s (load average {usage.load0:.1f} -> {usage.load1:.1f})")
    print(f"generator lag behind the schedule: at most {max_lag * 1000:.0f} ms")
    achieved = len(results) / seconds
    print(f"requests: {len(results)} ({achieved:.0f}/s offered)")
    print("| route | requests | errors | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|---|")
    names = sorted({r[0] for r in results}, key=lambda n: [x[0] for x in ROUTE_ORDER].index(n))
    all_errors = {}
    for name in names + ["all"]:
        rows = [r for r in results if name == "all" or r[0] == name]
        latencies = sorted(r[2] * 1000 for r in rows)
        errors = {}
        for _, status, _ in rows:
            if status != 200:
                errors[status] = errors.get(status, 0) + 1
        if name == "all":
            all_errors = errors
        error_text = ", ".join(f"{n}× {s or 'no answer'}" for s, n in sorted(errors.items())) or "0"
        print(f"| {name} | {len(rows)} | {error_text} | {percentile(latencies, 50):.0f} | "
              f"{percentile(latencies, 90):.0f} | {percentile(latencies, 99):.0f} | {latencies[-1]:.0f} |")
    rss = usage.rss_kib or [0]
    print(f"agent: {usage.cpu_pct:.1f} % of one core; RSS mean {sum(rss) / len(rss) / 1024:.1f} MiB, "
          f"peak {max(rss) / 1024:.1f} MiB (sampled every second)")
    print(f"samples taken meanwhile: {delta(before, after, 'clrscope_samples_total'):.0f}; "
          f"store flushes: {delta(before, after, 'clrscope_store_flushes_total'):.0f}")
    losses = {c: delta(before, after, c) for c in LOSS_COUNTERS}
    print("ingestion losses (goal: all 0): " + ", ".join(f"{k} +{v:.0f}" for k, v in losses.items()))
    for family in ["clrscope_api_queries_total", "clrscope_api_queries_rejected_total",
                   "clrscope_api_queries_cancelled_total"]:
        counts = by_class(before, after, family)
        print(f"{family}: " + ", ".join(f"{k} +{v:.0f}" for k, v in sorted(counts.items())))
    ok = not all_errors and not any(losses.values())
    print(f"goal (no errors, nothing lost): {'met' if ok else 'NOT met'}")


ROUTE_ORDER = mix([0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="200", help="requests per second, comma-separated (default 200)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every rate, alternating (default 1)")
    parser.add_argument("--seconds", type=int, default=60, help="length of one run (default 60)")
    parser.add_argument("--targets", type=int, default=16, help="profiled processes (default 16)")
    parser.add_argument("--settle", type=int, default=60,
                        help="seconds between the last attach and the first run (default 60)")
    parser.add_argument("--pause", type=int, default=10, help="seconds between runs (default 10)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a request may take before it counts as unanswered (default 60)")
    parser.add_argument("--agent-args", default="", help="more agent arguments, shell-quoted")
    parser.add_argument("--no-build", action="store_true", help="use the existing binary and test bed")
    parser.add_argument("--binary", default=CLRSCOPE,
                        help="the clrscope to run (default the release build, target/release/clrscope)")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    random.seed(1)
    targets, agent = [], None
    workdir = tempfile.mkdtemp(prefix="clrscope-api-load-")
    try:
        if args.no_build:
            if not os.access(args.binary, os.X_OK):
                raise SetupError(f"{args.binary} is missing: run without --no-build")
        else:
            prepare(args)
        for i in range(args.targets):
            name, target_args = FLEET[i % len(FLEET)]
            targets.append(Target(name, target_args, workdir))
        pids = [t.pid for t in targets]
        log(f"{len(targets)} targets started: {', '.join(t.name for t in targets)}")
        agent = Agent(args.binary, pids, workdir, shlex.split(args.agent_args))
        deadline = time.monotonic() + 120
        while len(agent.attached()) < len(pids):
            if time.monotonic() > deadline:
                raise SetupError(f"the agent attached fewer than {len(pids)} targets; see {agent.log_path}")
            time.sleep(1)
        log(f"all attached; settling {args.settle} s")
        time.sleep(args.settle)
        routes = mix(pids)
        print(f"# api_load: {len(pids)} targets, agent {agent.pid}, {os.cpu_count()} cores")
        for round_ in range(args.rounds):
            for rate in rates:
                log(f"round {round_ + 1}: {rate:.0f} requests/s for {args.seconds} s")
                before = agent.metrics()
                with UsageWatch(agent.pid) as usage:
                    results, max_lag = asyncio.run(
                        offer_load(agent, routes, rate, args.seconds, args.timeout))
                after = agent.metrics()
                report(rate, args.seconds, results, max_lag, usage, before, after)
                sys.stdout.flush()
                time.sleep(args.pause)
    except SetupError as e:
        log(f"setup failed: {e}")
        return 1
    finally:
        if agent:
            agent.stop()
        for t in targets:
            t.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
