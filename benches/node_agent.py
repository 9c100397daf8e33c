#!/usr/bin/env python3
"""One `clrscope agent` on a full node: what it costs to follow many .NET processes (issue 24).

    benches/node_agent.py [--processes 110] [--seconds 1800] [--restarts-per-minute 10]
                          [--agent-args "..."] [--beside BINARY] [--no-build] [--keep DIR]

Starts --processes test-bed targets (one CpuHot --split 60,30,10, one Bookstore under its own
load, the rest a mix of mostly idle ones: AsyncWeb, Faults, Alloc, Logs, Meters, SpanLoops at low
rates), then one agent at default settings that finds them as a node agent does (connect mode,
rescanning; limited with --command-line to a copy of the targets in this run's folder, since the
machine may run other people's .NET processes). Every --sample-seconds it reads the agent's CPU
(utime+stime from /proc, so the figure is the agent's own CPU time whatever else loads the
machine) and RSS; every minute it stops --restarts-per-minute of the idle targets (round robin)
and starts the same kind again (in the background: a startup at high load may take minutes), so
processes come and go all run long.

At the end it checks, through the agent's API:
- the CpuHot's cpu profile over the last --check-seconds against the kernel's per-thread CPU of its
  three spinning threads (/proc/PID/task/TID/stat) over the same span: goal within ±5 points;
- every target that lived at least --min-life seconds (restarted ones included): its profile of
  the kind's own evidence holds a frame of the kind's own code (`CpuHot.Program.Spin…`,
  `Bookstore.Reports.SalesReport`, the throwing `Faults.` frames in `exception`, `Alloc.` in
  `alloc_samples`, and the kind's own namespace in `wall` for the others);
and reports how long the agent took to attach to all of them, its CPU (% of one core, whole run
and after the first minute), peak RSS (VmHWM), RSS over the last 20 minutes (a least-squares
slope and max − min: flat means no leak as processes come and go), the agent's heap in use and
its allocator's resident bytes over the same span (its own metrics, every 30 s: growth in the
first is data kept, in the second alone pages the allocator keeps), and a few of its metrics.

With --beside BINARY, a second agent (another build, e.g. the last commit's) runs beside the
first on the same targets with the same flags, and its CPU over the same span is reported too:
load on this kind of machine moves a lone agent's figure by more than most changes, and two agents
side by side see the same load. Each also sees the other's sessions in the targets, so both
figures are above a lone agent's.

Exit 1 on a setup problem, never because a goal was missed: the goals are printed beside the
numbers.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_overhead import (CLRSCOPE, ROOT, TESTBED, Agent, SetupError, Target,  # noqa: E402
                            cpu_by_thread_name, cpu_seconds, loadavg, log, status_kib,
                            thread_cpu_seconds)

GOAL_CPU_PCT = 2.0
GOAL_RSS_MIB = 128.0
GOAL_SHARE_POINTS = 5.0

CPUHOT = ("CpuHot", ["--split", "60,30,10", "--cores", "0.5"])
BOOKSTORE = ("Bookstore", ["--self-load", "4", "--no-request-lines"])
# Mostly idle: each does a little of what it is for, so every profile type sees some events.
IDLE_KINDS = [
    ("AsyncWeb", ["--no-request-lines"]),
    ("Faults", ["--exceptions-per-second", "1", "--secondary-per-second", "0.2",
                "--lock-episodes-per-second", "0.5"]),
    ("Alloc", ["--keep", "1000,100,10", "--churn-per-second", "2000"]),
    ("Logs", ["--messages-per-second", "1", "--exceptions-per-second", "0", "--no-span-lines"]),
    ("Meters", ["--no-wait", "--steps", "1000", "--step-ms", "60000"]),
    # A span of ~6 ms every half second. (`--between-ms` is busy time: 500 of it made each of
    # these a spinning core's worth of demand, and the node's load ~47 on 2 cores.)
    ("SpanLoops", ["--loops", "1", "--between-ms", "1", "--idle-ms", "500", "--no-span-lines"]),
]

# What each kind's profile must show: (profile type, a frame of the kind's own code).
EVIDENCE = {
    "CpuHot": ("cpu", "CpuHot.Program.Spin"),
    "Bookstore": ("cpu", "Bookstore."),
    "Faults": ("exception", "Faults."),
    "Alloc": ("alloc_samples", "Alloc."),
}


def evidence(kind):
    return EVIDENCE.get(kind, ("wall", kind + "."))


class Fleet:
    """The targets of the run: started, restarted and stopped, each with its life span."""

    def __init__(self, workdir, targets_dir):
        self.workdir = workdir
        self.targets_dir = targets_dir
        self.live = []
        self.history = []  # {kind, pid, started_ms, stopped_ms}
        self.failed_starts = 0
        self.lock = threading.Lock()

    def start(self, kinds, workers=6, tolerate=False):
        """Starts targets of `kinds` ((name, args) pairs), several at once; returns them. With
        `tolerate`, a target that is not ready in time is counted in `failed_starts` and left
        out instead of ending the run (a restart on a machine at load 150 may take minutes)."""
        def one(kind):
            try:
                target = Target(kind[0], kind[1], self.workdir, targets_dir=self.targets_dir,
                                ready_timeout=180)
            except SetupError as e:
                if not tolerate:
                    raise
                log(f"restart failed: {e}")
                self.failed_starts += 1
                return None
            target.kind = kind
            target.started_ms = int(time.time() * 1000)
            return target
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            started = [t for t in pool.map(one, kinds) if t is not None]
        with self.lock:
            self.live.extend(started)
            for t in started:
                self.history.append({"kind": t.name, "pid": t.pid, "started_ms": t.started_ms,
                                     "stopped_ms": None, "target": t})
        return started

    def stop(self, targets):
        # All at once: each takes a moment to exit on a loaded machine.
        for t in targets:
            if t.proc.poll() is None:
                t.proc.send_signal(signal.SIGINT)
        # One deadline for all: at a load of 50, waiting 10 s for each in turn took many minutes.
        deadline = time.monotonic() + 10
        for t in targets:
            t.stop(timeout=max(0.1, deadline - time.monotonic()))
            with self.lock:
                self.live.remove(t)
                for h in self.history:
                    if h["target"] is t:
                        h["stopped_ms"] = int(time.time() * 1000)

    def stop_all(self):
        self.stop(list(self.live))


class Api:
    def __init__(self, url, token):
        self.url = url
        self.token = token

    def get(self, path, raw=False, **params):
        query = urllib.parse.urlencode(params)
        request = urllib.request.Request(f"{self.url}{path}?{query}",
                                         headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=400) as answer:
            body = answer.read()
            return body if raw else body.decode()

    def folded(self, kind, pid, from_ms, until_ms):
        """(stack, value) pairs of one process's profile."""
        text = self.get("/api/v1/profile", type=kind, format="folded", query=f'{{process_id="{pid}"}}',
                        **{"from": from_ms, "until": until_ms})
        pairs = []
        for line in text.splitlines():
            stack, _, value = line.rpartition(" ")
            if stack:
                pairs.append((stack, int(value)))
        return pairs

    def metrics(self):
        """The agent's own metrics without labels, and label-summed totals of the others."""
        values = {}
        for line in self.get("/metrics").splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{")[0]
            try:
                values[name] = values.get(name, 0.0) + float(value)
            except ValueError:
                pass
        return values


def watch_agent(agent, samples, stop, every):
    """Every `every` seconds: (monotonic, agent CPU s, RSS MiB, threads, load)."""
    while not stop.wait(every):
        try:
            samples.append((time.monotonic(), cpu_seconds(agent.pid),
                            status_kib(agent.pid, "VmRSS") / 1024,
                            len(os.listdir(f"/proc/{agent.pid}/task")), loadavg()))
        except (FileNotFoundError, ProcessLookupError):
            return


def watch_heap(api, heap, stop, every):
    """Every `every` seconds: (monotonic, heap in use MiB, allocator resident MiB) from the
    agent's own metrics: whether RSS that grows is heap in use or pages the allocator keeps."""
    while not stop.wait(every):
        try:
            m = api.metrics()
        except OSError:
            continue
        if "clrscope_agent_heap_allocated_bytes" in m:
            heap.append((time.monotonic(), m["clrscope_agent_heap_allocated_bytes"] / 2**20,
                         m["clrscope_agent_heap_resident_bytes"] / 2**20))


def slope_mib_per_10min(points):
    """Least-squares slope of (seconds, MiB) points, in MiB per 10 minutes."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points)
    return 600 * sum((p[0] - mx) * (p[1] - my) for p in points) / den if den else 0.0


def wait_attached_all(agent, api, pids, timeout):
    """Seconds until the agent's process list holds every pid."""
    started = time.monotonic()
    want = set(pids)
    while time.monotonic() - started < timeout:
        if agent.proc.poll() is not None:
            raise SetupError(f"the agent exited with code {agent.proc.returncode}; see {agent.log_path}")
        try:
            listed = {p["pid"] for p in json.loads(api.get("/api/v1/processes"))}
        except OSError:
            listed = set()
        if want <= listed:
            return time.monotonic() - started
        time.sleep(0.25)
    raise SetupError(f"the agent attached to {len(want & listed)} of {len(want)} targets in {timeout} s")


def cpuhot_check(api, cpuhot, from_ms, before, until_ms, after):
    """Percent per spinning thread in the cpu profile and by the kernel over one span."""
    folded = api.folded("cpu", cpuhot.pid, from_ms, until_ms)
    rows = []
    threads = [t["name"] for t in cpuhot.ready["threads"]]
    profiled = {t: sum(v for s, v in folded if f"CpuHot.Program.{t}(" in s) for t in threads}
    kernel = {t: after[t] - before[t] for t in threads}
    total_p = sum(profiled.values()) or 1
    total_k = sum(kernel.values()) or 1
    for t in threads:
        rows.append((t, 100 * profiled[t] / total_p, 100 * kernel[t] / total_k))
    return rows, total_p / 1e9, total_k


def spinner_cpu(cpuhot):
    """Kernel CPU seconds per spinning thread of the CpuHot."""
    by_tid = {str(t["tid"]): t["name"] for t in cpuhot.ready["threads"]}
    return {by_tid[tid]: cpu for (tid, _), cpu in thread_cpu_seconds(cpuhot.pid).items() if tid in by_tid}


def run(args, workdir):
    targets_dir = os.path.join(workdir, "targets")
    shutil.copytree(os.path.join(TESTBED, "targets"), targets_dir)
    fleet = Fleet(workdir, targets_dir)
    kinds = [CPUHOT, BOOKSTORE] + [IDLE_KINDS[i % len(IDLE_KINDS)] for i in range(args.processes - 2)]
    result = {"load_start": loadavg(), "processes": args.processes}
    agent = None
    beside = None
    stop_watch = threading.Event()
    try:
        t0 = time.monotonic()
        fleet.start(kinds)
        log(f"{len(fleet.live)} targets ready in {time.monotonic() - t0:.0f} s; load {loadavg():.2f}")
        cpuhot = fleet.live[0]
        token_file = os.path.join(workdir, "token")
        agent = Agent(["--command-line", targets_dir + "/", "--temp-apikey-file", token_file,
                       *args.agent_args.split()],
                      [], os.path.join(workdir, "data"), os.path.join(workdir, "agent.log"),
                      log_filter="info")
        started = time.monotonic()
        api_url = agent.api_url()
        deadline = time.monotonic() + 30
        while not os.path.exists(token_file) and time.monotonic() < deadline:
            time.sleep(0.1)
        with open(token_file) as f:
            api = Api(api_url, f.read().strip())
        samples = []
        watcher = threading.Thread(target=watch_agent,
                                   args=(agent, samples, stop_watch, args.sample_seconds), daemon=True)
        watcher.start()
        beside_samples = []
        if args.beside:
            beside = Agent(["--command-line", targets_dir + "/",
                            "--temp-apikey-file", os.path.join(workdir, "token-beside"),
                            *args.agent_args.split()],
                           [], os.path.join(workdir, "data-beside"), os.path.join(workdir, "agent-beside.log"),
                           log_filter="info", binary=os.path.abspath(args.beside))
            threading.Thread(target=watch_agent, args=(beside, beside_samples, stop_watch, args.sample_seconds),
                             daemon=True).start()
        heap = []
        threading.Thread(target=watch_heap, args=(api, heap, stop_watch, 30), daemon=True).start()
        result["attach_s"] = wait_attached_all(agent, api, [t.pid for t in fleet.live], 300)
        result["attach_cpu_s"] = cpu_seconds(agent.pid)
        log(f"agent attached to all {args.processes} in {result['attach_s']:.1f} s "
            f"({result['attach_cpu_s']:.1f} s of its CPU); load {loadavg():.2f}")

        if args.pprof_seconds:
            # The agent's own CPU profile after the first minute, while the restarts go on.
            def self_profile():
                time.sleep(60)
                body = api.get("/debug/pprof/profile", raw=True, seconds=args.pprof_seconds)
                with open(os.path.join(workdir, "agent-cpu.pb.gz"), "wb") as f:
                    f.write(body)
            threading.Thread(target=self_profile, daemon=True).start()
        restartable = [t for t in fleet.live if t.name not in ("CpuHot", "Bookstore")]
        next_restart = started + 60
        check_from = started + max(0, args.seconds - args.check_seconds)
        check_start = None
        restarted = [0]

        def replace(kinds):
            new = fleet.start(kinds, tolerate=True)
            with fleet.lock:
                restartable.extend(new)
                restarted[0] += len(new)

        # Replacements start in the background: at load ~45 a .NET startup may take minutes, and
        # waiting for it in this loop held back the next minute's restarts.
        restarts = concurrent.futures.ThreadPoolExecutor(4)
        pending = []
        while time.monotonic() - started < args.seconds:
            now = time.monotonic()
            if check_start is None and now >= check_from:
                check_start = (int(time.time() * 1000), spinner_cpu(cpuhot))
            if args.restarts_per_minute and now >= next_restart:
                next_restart += 60
                with fleet.lock:
                    old = restartable[:args.restarts_per_minute]
                    del restartable[:args.restarts_per_minute]
                fleet.stop(old)
                pending.append(restarts.submit(replace, [t.kind for t in old]))
            time.sleep(1)
        if check_start is None:
            check_start = (int(time.time() * 1000), spinner_cpu(cpuhot))
        end_ms = int(time.time() * 1000)
        kernel_after = spinner_cpu(cpuhot)
        ended = time.monotonic()
        total_cpu = cpu_seconds(agent.pid)
        # Which of the agent's threads the CPU went to: the runtime's workers (sessions, parsing,
        # naming) or the store's writer (flushes, compaction).
        result["cpu_by_thread"] = cpu_by_thread_name({}, thread_cpu_seconds(agent.pid), ended - started)
        # Replacements still starting are waited for (not counted in the CPU above): their
        # targets lived too short to be checked, but they are stopped with the rest.
        restarts.shutdown(wait=True)
        for done in pending:
            done.result()
        result["restarted"] = restarted[0]
        result["failed_restarts"] = fleet.failed_starts
        result["seconds"] = ended - started
        result["cpu_pct"] = 100 * total_cpu / (ended - started)
        steady = [s for s in samples if s[0] >= started + 60]
        if len(steady) >= 2:
            result["steady_cpu_pct"] = 100 * (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
        # The agent beside it over the same span: its samples nearest the first agent's.
        if beside and len(steady) >= 2 and beside_samples:
            near = lambda t: min(beside_samples, key=lambda b: abs(b[0] - t))
            first, last = near(steady[0][0]), near(steady[-1][0])
            if last[0] > first[0]:
                result["beside"] = {"binary": args.beside,
                                    "steady_cpu_pct": 100 * (last[1] - first[1]) / (last[0] - first[0]),
                                    "seconds": last[0] - first[0]}
        result["peak_rss_mib"] = status_kib(agent.pid, "VmHWM") / 1024
        rss = [(s[0] - started, s[2]) for s in samples]
        last20 = [p for p in rss if p[0] >= result["seconds"] - 1200 and p[0] >= 60]
        result["rss_first_mib"] = rss[0][1] if rss else 0
        result["rss_last_mib"] = rss[-1][1] if rss else 0
        result["rss_max_mib"] = max(p[1] for p in rss) if rss else 0
        if last20:
            result["rss_window_s"] = last20[-1][0] - last20[0][0]
            result["rss_window_range_mib"] = max(p[1] for p in last20) - min(p[1] for p in last20)
            result["rss_window_slope"] = slope_mib_per_10min(last20)
            # Mean of the window's first and last fifth: what drifts, whatever the noise.
            fifth = max(1, len(last20) // 5)
            result["rss_window_ends_mib"] = (statistics.mean(p[1] for p in last20[:fifth]),
                                             statistics.mean(p[1] for p in last20[-fifth:]))
        for i, what in ((1, "heap_allocated"), (2, "heap_resident")):
            points = [(h[0] - started, h[i]) for h in heap
                      if h[0] - started >= result["seconds"] - 1200 and h[0] - started >= 60]
            if len(points) >= 2:
                result[what + "_window"] = (points[0][1], points[-1][1], slope_mib_per_10min(points))
        result["heap"] = [(round(h[0] - started, 1), round(h[1], 2), round(h[2], 2)) for h in heap]
        result["threads_max"] = max((s[3] for s in samples), default=0)
        result["load_min"] = min((s[4] for s in samples), default=0)
        result["load_max"] = max((s[4] for s in samples), default=0)
        result["load_mean"] = statistics.mean(s[4] for s in samples) if samples else 0
        result["samples"] = [(round(s[0] - started, 1), round(s[1], 2), round(s[2], 1), s[3], s[4])
                             for s in samples]
        result["metrics"] = {k: v for k, v in api.metrics().items()
                             if k.startswith("clrscope_") and "bucket" not in k}

        # The windows up to the end are named a second or more later.
        time.sleep(15)
        rows, profiled_s, kernel_s = cpuhot_check(api, cpuhot, check_start[0], check_start[1],
                                                  end_ms, kernel_after)
        result["cpuhot"] = {"rows": rows, "profiled_s": profiled_s, "kernel_s": kernel_s,
                            "span_s": (end_ms - check_start[0]) / 1000}
        checks = []
        for h in fleet.history:
            stopped = h["stopped_ms"] or end_ms
            if (stopped - h["started_ms"]) / 1000 < args.min_life:
                continue
            kind, frame = evidence(h["kind"])
            folded = api.folded(kind, h["pid"], h["started_ms"], stopped + 15000)
            total = sum(v for _, v in folded)
            found = sum(v for s, v in folded if frame in s)
            unknown = sum(v for s, v in folded if s.rsplit(";", 1)[-1].startswith("[unknown"))
            checks.append({"kind": h["kind"], "pid": h["pid"], "restarted": h["stopped_ms"] is not None,
                           "life_s": (stopped - h["started_ms"]) / 1000, "type": kind, "frame": frame,
                           "total": total, "found": found,
                           "unknown_leaf_pct": 100 * unknown / total if total else None,
                           "ok": found > 0})
        result["checks"] = checks
        stop_watch.set()
        result["agent_stop_s"] = agent.stop()
        result["agent_problems"] = agent.problems()
        agent = None
    finally:
        stop_watch.set()
        if agent:
            agent.stop()
        if beside:
            beside.stop()
        fleet.stop_all()
    result["load_end"] = loadavg()
    return result


def report(r, args):
    print(f"\nNode: {r['processes']} targets, one agent (`{args.agent_args or 'default settings'}`), "
          f"{r['seconds']:.0f} s, {r['restarted']} restarts ({r['failed_restarts']} not ready in 180 s)")
    print("| measure | result | goal |")
    print("|---|---|---|")
    ok = lambda good: "meets" if good else "misses"
    print(f"| attached to all {r['processes']} after start | {r['attach_s']:.1f} s "
          f"({r['attach_cpu_s']:.1f} s of agent CPU) | seconds |")
    print(f"| agent CPU, whole run | {r['cpu_pct']:.2f} % of a core | ≤ {GOAL_CPU_PCT} % "
          f"({ok(r['cpu_pct'] <= GOAL_CPU_PCT)}) |")
    if "steady_cpu_pct" in r:
        print(f"| agent CPU after the first minute | {r['steady_cpu_pct']:.2f} % of a core | |")
    if "beside" in r:
        b = r["beside"]
        print(f"| the agent beside it (`{b['binary']}`), over the same {b['seconds']:.0f} s "
              f"| {b['steady_cpu_pct']:.2f} % of a core | |")
    print(f"| agent peak RSS (VmHWM) | {r['peak_rss_mib']:.1f} MiB | ≤ {GOAL_RSS_MIB:.0f} MiB "
          f"({ok(r['peak_rss_mib'] <= GOAL_RSS_MIB)}) |")
    print(f"| agent RSS: first, max, last | {r['rss_first_mib']:.1f}, {r['rss_max_mib']:.1f}, "
          f"{r['rss_last_mib']:.1f} MiB | |")
    if "rss_window_s" in r:
        a, b = r["rss_window_ends_mib"]
        print(f"| RSS over the last {r['rss_window_s'] / 60:.0f} min: slope, max − min, first → last fifth "
              f"| {r['rss_window_slope']:+.2f} MiB per 10 min, {r['rss_window_range_mib']:.1f} MiB, "
              f"{a:.1f} → {b:.1f} MiB | flat |")
    for what, label in (("heap_allocated", "heap in use"), ("heap_resident", "allocator resident")):
        if what + "_window" in r:
            first, last, slope = r[what + "_window"]
            print(f"| agent {label} over the last 20 min: first → last, slope | {first:.1f} → {last:.1f} MiB, "
                  f"{slope:+.2f} MiB per 10 min | |")
    print(f"| agent threads (max) | {r['threads_max']} | |")
    by_thread = ", ".join(f"{name} {pct:.2f} %" for name, pct in
                          sorted(r["cpu_by_thread"].items(), key=lambda kv: -kv[1]))
    print(f"| agent CPU by thread, whole run | {by_thread} | |")
    c = r["cpuhot"]
    worst = max(abs(p - k) for _, p, k in c["rows"])
    shares = ", ".join(f"{t} {p:.1f} % (kernel {k:.1f} %)" for t, p, k in c["rows"])
    print(f"| CpuHot over the last {c['span_s']:.0f} s ({c['profiled_s']:.1f} s profiled, {c['kernel_s']:.1f} s "
          f"by the kernel) | {shares} | ±{GOAL_SHARE_POINTS:.0f} points "
          f"({ok(worst <= GOAL_SHARE_POINTS)}: {worst:.1f}) |")
    checks = r["checks"]
    passed = sum(1 for x in checks if x["ok"])
    restarted = [x for x in checks if x["restarted"]]
    print(f"| profiles with the kind's own frame | {passed} of {len(checks)} "
          f"({sum(1 for x in restarted if x['ok'])} of {len(restarted)} restarted ones) | all |")
    unknown = [x["unknown_leaf_pct"] for x in checks if x["unknown_leaf_pct"] is not None]
    if unknown:
        print(f"| samples whose leaf is [unknown] (the profile checked), median (max) "
              f"| {statistics.median(unknown):.2f} % ({max(unknown):.2f} %) | |")
    print(f"load average (1 min) during the run: {r['load_min']:.2f} – {r['load_max']:.2f} "
          f"(mean {r['load_mean']:.2f}), {os.cpu_count()} CPUs")
    failed = [x for x in checks if not x["ok"]]
    for x in failed[:20]:
        print(f"  no {x['frame']} in {x['type']} of {x['kind']} {x['pid']} (lived {x['life_s']:.0f} s, "
              f"total {x['total']})")
    m = r["metrics"]
    interesting = sorted(k for k in m if any(w in k for w in ("dropped", "lost", "budget", "sessions",
                                                              "attached", "restarts", "batches")))
    print("agent metrics (summed over labels): " + ", ".join(f"{k} {m[k]:g}" for k in interesting))
    problems = "; ".join(f"{n}× {k}" for k, n in r["agent_problems"].items()) or "none"
    print(f"agent warnings/errors: {problems[:2000]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=110, help="targets (default 110, at least 3)")
    parser.add_argument("--seconds", type=int, default=1800, help="run length after the agent starts")
    parser.add_argument("--restarts-per-minute", type=int, default=10,
                        help="idle targets stopped and started again every minute (default 10)")
    parser.add_argument("--sample-seconds", type=float, default=5, help="agent CPU/RSS every N s")
    parser.add_argument("--check-seconds", type=int, default=600,
                        help="the CpuHot's last N s are compared with the kernel (default 600)")
    parser.add_argument("--min-life", type=int, default=40,
                        help="targets that lived less are not checked (default 40 s)")
    parser.add_argument("--agent-args", default="", help="more agent arguments")
    parser.add_argument("--pprof-seconds", type=int, default=0,
                        help="take the agent's own CPU profile (/debug/pprof/profile) for N s after "
                             "the first minute, into agent-cpu.pb.gz in --keep DIR (default 0: none)")
    parser.add_argument("--beside", metavar="BINARY",
                        help="run this clrscope binary as a second agent beside the first, and report its CPU")
    parser.add_argument("--no-build", action="store_true", help="use target/release/clrscope as it is")
    parser.add_argument("--keep", metavar="DIR", help="keep logs, store and results.json in DIR")
    args = parser.parse_args()
    if args.processes < 3:
        parser.error("--processes must be at least 3")
    try:
        if not args.no_build:
            log("cargo build --release --bin clrscope")
            if subprocess.run(["cargo", "build", "--release", "--bin", "clrscope"], cwd=ROOT).returncode:
                raise SetupError("cargo build --release failed")
        if not os.access(CLRSCOPE, os.X_OK):
            raise SetupError(f"{CLRSCOPE} is missing: run cargo build --release")
        workdir = args.keep or tempfile.mkdtemp(prefix="clrscope-node-")
        os.makedirs(workdir, exist_ok=True)
        log(f"logs and store in {workdir}; load average {loadavg():.2f}; {os.cpu_count()} CPUs")
        result = run(args, workdir)
        report(result, args)
        if args.keep:
            with open(os.path.join(workdir, "results.json"), "w") as f:
                json.dump({"args": vars(args), "result": result}, f, indent=1)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    except SetupError as e:
        log(f"setup problem: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
