#!/usr/bin/env python3
"""What `clrscope agent` costs the .NET processes it profiles, and what it costs itself.

    benches/agent_overhead.py [--rounds 5] [--configs none,default,full] [--twins [--pin]] [--fleet-seconds 120]
                              [--phase-seconds 600]

Part 1, throughput: for --rounds rounds, one run per configuration of the Throughput target
(tests/targets/Throughput.cs), each the same length: --warmup seconds (JIT tiering, the agent's
attach and rundown), then --measure seconds of counted operations. A round runs every
configuration once, starting one configuration later than the round before, so slow drifts of the
machine's load spread over all of them instead of hitting one. The measured span is a whole number
of sampler periods, so every agent run contains the same amount of sampling.

With --twins each run starts two Throughputs at once and attaches the agent to one of them (the
first or second started, alternately): both see the same load from the rest of the machine at the
same moment, so the loss is taken against the twin, run by run. On a machine shared with builds
this is much steadier than comparing runs made one after another; configuration "none" then
measures the noise floor (two unprofiled twins). Besides ops/s, every run reports ops per
CPU-second of the target: the cost inside the process, whatever CPU share the scheduler gave it.

With --pin each twin runs on a CPU of its own (the first started on CPU 0, the second on CPU 1,
all of its threads: workers, GC, the runtime's sampler and EventPipe threads), so on a quiet
machine with --threads 1 neither twin competes with the other, the time the profiled one stands
suspended is lost to it alone, and whatever the machine's speed does in a run it does to both.
The profiled twin changes CPU every round, so a difference between the CPUs cancels out.

Part 2, fleet: four test-bed targets (CpuHot, Alloc, Faults, AsyncWeb --self-load 50) profiled by
one agent (default settings, or --fleet-config) for --fleet-seconds: the agent's CPU (utime+stime
from /proc, as % of one core, in all and per thread name: the store writer apart from the tokio
workers that parse and symbolize), its peak RSS (VmHWM) and RSS over time, and the store's bytes
on disk per sample.

Part 3, phase (--phase-seconds): what the sampler's windows cost one process, measured inside
that process, so that neither other load nor the machine's drifting speed can bias it. One
Throughput (--threads 1, pinned to CPU 0) prints its operation count every 100 ms against the wall
clock; the agent (default settings, pinned to CPU 1) logs when each sampler window opened and
closed. Each sampler period, from 2 s before a window opens to 2 s before the next one opens, is
compared with its own quiet part (all of it but 0.5 s before the window to 2 s after it): the
loss of a period is 1 - (its operations per second) / (those of its quiet part). The same sum with
the windows moved by half a period, where nothing happens (the real windows' spans left out), is
the method's control and must come out near 0. A cost spread evenly over time (the light session's events) does not show here: on
Throughput nothing in the light session fires once its code is compiled (no exceptions, no
contended locks), and part 1 measures it.

Every agent is limited with --pid to the targets this script started: the machine may run other
people's .NET processes. The script exits 1 on a setup problem (no runtime, a target or the agent
failing to start or attach), never because a goal was missed: the goals are printed beside the
numbers.
"""

import argparse
import glob
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.environ.get("CLRSCOPE_TESTBED_DIR", os.path.join(ROOT, ".testbed"))
DOTNET = os.path.join(TESTBED, "bin", "dotnet")
# The runtime the targets run on: CLRSCOPE_DOTNET (8, 9, 10, 11; default 10), as in the tests. The
# SDK builds up to net10.0; a newer runtime runs that build rolled forward.
DOTNET_MAJOR = int(os.environ.get("CLRSCOPE_DOTNET") or 10)
TARGET_FRAMEWORK = f"net{min(DOTNET_MAJOR, 10)}.0"
TARGET_ENV = {"DOTNET_ROLL_FORWARD": "LatestMajor"} if DOTNET_MAJOR > 10 else {}
CLRSCOPE = os.environ.get("CLRSCOPE", os.path.join(ROOT, "target", "release", "clrscope"))
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Agent arguments per configuration (None: no agent). The default list is the comparison;
# the others split the default's cost into its parts when asked for with --configs.
CONFIGS = {
    "none": None,
    "default": [],  # 1 s of sampling every 10 s, light session with every event profile
    "full": ["--sample-window", "10s", "--sample-period", "10s"],  # sampler always on
    "half": ["--sample-window", "500ms", "--sample-period", "10s"],
    # One 10 ms window at attach (inside the warm-up), then only the light session. The agent
    # turns events into store batches once per period, so here only at its stop: this measures
    # the target's side of the light session, and a little less than all of the agent's.
    "light": ["--sample-window", "10ms", "--sample-period", "1h"],
    # The light session with JIT/Loader only: what the allocation, exception and lock events add
    # is the difference to "light".
    "light-jit": ["--sample-window", "10ms", "--sample-period", "1h",
                  "--no-alloc", "--no-exceptions", "--no-locks"],
    "default-no-events": ["--no-alloc", "--no-exceptions", "--no-locks"],
    # Ten times the sampler sessions of "default-no-events" for a tenth of its sampling: what
    # starting and stopping a session costs.
    "churn-no-events": ["--sample-window", "10ms", "--sample-period", "1s",
                        "--no-alloc", "--no-exceptions", "--no-locks"],
}
SAMPLE_PERIOD_S = 10

FLEET = [
    ("CpuHot", []),
    ("Alloc", []),
    ("Faults", []),
    ("AsyncWeb", ["--self-load", "50", "--no-request-lines"]),
]

GOAL_LOSS_PCT = 1.0
GOAL_CPU_PCT = 1.0
GOAL_RSS_MIB = 64.0


class SetupError(Exception):
    """The benchmark cannot run as designed; the message says what to fix."""


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_seconds(pid):
    """utime + stime of a process so far (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu_seconds(pid):
    """utime + stime per live thread, keyed by (tid, thread name)."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        threads[(tid, name)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return threads


def cpu_by_thread_name(before, after, seconds):
    """% of a core per thread name between two thread_cpu_seconds() readings."""
    shares = {}
    for key, cpu in after.items():
        shares[key[1]] = shares.get(key[1], 0.0) + 100 * (cpu - before.get(key, 0.0)) / seconds
    return shares


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise SetupError(f"no {key} in /proc/{pid}/status")


class Target:
    """A test-bed target whose JSON lines are read by a thread into a queue."""

    def __init__(self, name, args, logdir, cpu=None, targets_dir=None, ready_timeout=30):
        dll = os.path.join(targets_dir or os.path.join(TESTBED, "targets"), name, TARGET_FRAMEWORK,
                           name + ".dll")
        if not os.path.isfile(dll):
            raise SetupError(f"{dll} is missing: run tests/testbed/setup.sh")
        self.name = name
        self.stderr = open(os.path.join(logdir, f"{name}-{time.monotonic_ns()}.stderr"), "w")
        # The target also dies with this script, should the script be killed.
        env = dict(os.environ, TESTBED_EXIT_WITH_PARENT="1", **TARGET_ENV)
        # The affinity is set before exec, so every thread the runtime starts inherits it.
        pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
        self.proc = subprocess.Popen([DOTNET, dll, *args], stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=env, text=True, preexec_fn=pin)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.ready = self.next_line(ready_timeout, "ready")
        except SetupError:
            # Not left running: a node run that tolerates a failed restart would otherwise go on
            # with a process it does not count, which the agent still profiles.
            self._kill()
            self.stderr.close()
            raise
        self.pid = self.proc.pid

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.lines.put((time.monotonic(), json.loads(line)))
            except json.JSONDecodeError:
                pass
        self.lines.put((time.monotonic(), None))

    def next_line(self, timeout, kind, not_before=0.0):
        """The next line that has the key `kind` and arrived at `not_before` (monotonic) or later."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                arrived, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise SetupError(f"{self.name}: no {kind} line within {timeout} s")
            if line is None:
                raise SetupError(f"{self.name} exited (code {self.proc.wait()}) before its {kind} line")
            if kind in line and arrived >= not_before:
                return line

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill()
        self.stderr.close()

    def _kill(self):
        self.proc.kill()
        self.proc.wait()
        # A killed runtime cannot remove its diagnostic socket and debugger pipes.
        tmp = os.environ.get("TMPDIR") or "/tmp"
        for pattern in (f"dotnet-diagnostic-{self.proc.pid}-*-socket", f"clr-debug-pipe-{self.proc.pid}-*"):
            for path in glob.glob(os.path.join(tmp, pattern)):
                try:
                    os.remove(path)
                except OSError:
                    pass


class Agent:
    """`clrscope agent` with JSON logs in a file, limited to the given pids."""

    def __init__(self, extra_args, pids, data_dir, log_path, cpu=None, log_filter="warn,clrscope=debug",
                 binary=CLRSCOPE):
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        pid_args = [a for pid in pids for a in ("--pid", str(pid))]
        # Free ports, and a key of its own: nothing here calls the API.
        self.command = [binary, "--log", log_filter, "--log-format", "json",
                        "agent", "--urls", "http://127.0.0.1:0", "--metrics-urls", "none",
                        "--temp-apikey", "--data-dir", data_dir, *pid_args, *extra_args]
        pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL,
                                     stderr=self.log_file, preexec_fn=pin)
        self.pid = self.proc.pid

    def events(self):
        """The agent's JSON log records so far (its plain eprintln lines are skipped)."""
        records = []
        with open(self.log_path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return records

    def wait_attached(self, count, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SetupError(f"the agent exited with code {self.proc.returncode}; see {self.log_path}")
            attached = [e for e in self.events() if e.get("fields", {}).get("message") == "attached"]
            if len(attached) >= count:
                return
            time.sleep(0.2)
        raise SetupError(f"the agent attached to fewer than {count} targets in {timeout} s; see {self.log_path}")

    def api_url(self, timeout=30):
        """The API's address, from the line the agent prints when it listens."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SetupError(f"the agent exited with code {self.proc.returncode}; see {self.log_path}")
            with open(self.log_path) as f:
                for line in f:
                    if line.startswith("clrscope agent: API on "):
                        return line.split()[4].rstrip(";")
            time.sleep(0.2)
        raise SetupError(f"the agent did not say where its API listens within {timeout} s; see {self.log_path}")

    def stop(self):
        """SIGINT, as an operator would; returns how long the agent took to exit."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            log(f"the agent did not stop within 60 s of SIGINT and was killed; see {self.log_path}")
        self.log_file.close()
        return time.monotonic() - started

    def problems(self):
        """Its warnings and errors, with how often each message came."""
        counts = {}
        for e in self.events():
            if e.get("level") in ("WARN", "ERROR"):
                fields = e.get("fields", {})
                key = f"{e['level']} {fields.get('message', '')} {fields.get('error', '')}".strip()
                counts[key] = counts.get(key, 0) + 1
        return counts

    def windows(self, pid):
        """(opened, closed) wall-clock ms of each sampler window of `pid`, in order."""
        return [(f["opened_unix_ms"], f["closed_unix_ms"])
                for f in (e.get("fields", {}) for e in self.events())
                if f.get("message") == "sampler window closed" and f.get("pid") == pid]

    def stored_samples(self):
        """Sampler samples (with a stack) stored, from the per-window debug records."""
        return sum(int(e["fields"]["samples"]) for e in self.events()
                   if e.get("fields", {}).get("message") == "sampler window stored")


def start_throughput(args, workdir, cpu=None):
    return Target("Throughput", ["--threads", str(args.threads),
                                 "--blocked-threads", str(args.blocked_threads),
                                 "--duration-seconds", str(args.warmup + args.measure + 120)],
                  workdir, cpu)


def measure(targets, agent, args):
    """Counts the targets' operations over the same --measure seconds, after --warmup seconds
    from now; returns one dict of figures per target, plus the agent's CPU."""
    warm_until = time.monotonic() + args.warmup
    first, cpu0, threads0 = [], [], []
    for t in targets:
        first.append(t.next_line(args.warmup + 10, "progress", not_before=warm_until))
        cpu0.append(cpu_seconds(t.pid))
        threads0.append(thread_cpu_seconds(t.pid))
    agent_cpu0 = cpu_seconds(agent.pid) if agent else None
    figures = []
    for t, f, c0, th0 in zip(targets, first, cpu0, threads0):
        while True:
            last = t.next_line(10, "progress")
            if last["t_s"] - f["t_s"] >= args.measure - 0.5:
                break
        span = last["t_s"] - f["t_s"]
        cpu_pct = 100 * (cpu_seconds(t.pid) - c0) / span
        figures.append({
            "ops_per_s": (last["total_ops"] - f["total_ops"]) / span,
            "span_s": span,
            "target_cpu_pct": cpu_pct,
            "ops_per_cpu_s": (last["total_ops"] - f["total_ops"]) / (span * cpu_pct / 100),
            "alloc_mb_per_s": (last["allocated_bytes"] - f["allocated_bytes"]) / span / 1e6,
            # The runtime's own threads (sampler, EventPipe streaming) apart from the workers.
            "target_threads_cpu_pct": cpu_by_thread_name(th0, thread_cpu_seconds(t.pid), span),
        })
    if agent:
        figures[0]["agent_cpu_pct"] = 100 * (cpu_seconds(agent.pid) - agent_cpu0) / figures[0]["span_s"]
    return figures


def throughput_run(config, args, workdir, run_id, swap):
    """One run of Throughput under one configuration (--twins: two Throughputs side by side, the
    agent on the first started or, with `swap`, the second); returns the figures of the profiled
    one (and of its twin)."""
    targets = []
    agent = None
    load_start = loadavg()
    try:
        targets.append(start_throughput(args, workdir, 0 if args.pin else None))
        if args.twins:
            targets.append(start_throughput(args, workdir, 1 if args.pin else None))
            if swap:
                targets.reverse()
        if CONFIGS[config] is not None:
            agent = Agent(CONFIGS[config], [targets[0].pid],
                          os.path.join(workdir, f"data-{run_id}"),
                          os.path.join(workdir, f"agent-{run_id}.log"))
            agent.wait_attached(1)
        # The warm-up counts from the attach, so the agent's first rundown stays outside.
        figures = measure(targets, agent, args)
        result = figures[0]
        if args.twins:
            result["twin"] = figures[1]
        if agent:
            result["agent_stop_s"] = agent.stop()
            result["agent_problems"] = agent.problems()
            agent = None
    finally:
        if agent:
            agent.stop()
        for t in targets:
            t.stop()
    result.update(config=config, load_start=load_start, load_end=loadavg())
    if args.pin:
        result["cpu"] = 1 if swap else 0
    return result


def fleet_run(args, workdir):
    """Four targets, one agent; the agent's CPU (in all and per thread), memory and store size."""
    targets = []
    result = {"load_start": loadavg()}
    agent = None
    try:
        for name, extra in FLEET:
            targets.append(Target(name, extra, workdir))
        data_dir = os.path.join(workdir, "data-fleet")
        agent = Agent(CONFIGS[args.fleet_config], [t.pid for t in targets], data_dir,
                      os.path.join(workdir, "agent-fleet.log"))
        started = time.monotonic()
        agent.wait_attached(len(targets))
        time.sleep(args.warmup)
        steady_from = time.monotonic()
        steady_cpu0 = cpu_seconds(agent.pid)
        threads0 = thread_cpu_seconds(agent.pid)
        rss = []
        while time.monotonic() - steady_from < args.fleet_seconds:
            time.sleep(5)
            rss.append(status_kib(agent.pid, "VmRSS") / 1024)
            for t in targets:
                if t.proc.poll() is not None:
                    raise SetupError(f"{t.name} exited during the fleet run (code {t.proc.returncode})")
        now = time.monotonic()
        total_cpu = cpu_seconds(agent.pid)
        result["thread_cpu_pct"] = cpu_by_thread_name(threads0, thread_cpu_seconds(agent.pid),
                                                      now - steady_from)
        result.update(
            seconds=now - steady_from,
            steady_cpu_pct=100 * (total_cpu - steady_cpu0) / (now - steady_from),
            whole_cpu_pct=100 * total_cpu / (now - started),
            whole_seconds=now - started,
            peak_rss_mib=status_kib(agent.pid, "VmHWM") / 1024,
            rss_first_mib=rss[0],
            rss_last_mib=rss[-1],
            rss_max_mib=max(rss),
        )
        result["agent_stop_s"] = agent.stop()
        result["agent_problems"] = agent.problems()
        result["sampler_samples"] = agent.stored_samples()
        agent = None
        result.update(store_figures(data_dir))
    finally:
        if agent:
            agent.stop()
        for t in targets:
            t.stop()
    result["load_end"] = loadavg()
    return result


def phase_run(args, workdir):
    """Part 3: one Throughput's 100 ms operation counts and the agent's windows over
    --phase-seconds."""
    target = Target("Throughput", ["--threads", "1", "--tick-ms", str(PHASE_TICK_MS),
                                   "--blocked-threads", str(args.blocked_threads),
                                   "--duration-seconds", str(args.warmup + args.phase_seconds + 120)],
                    workdir, cpu=0)
    agent = None
    result = {"load_start": loadavg()}
    try:
        agent = Agent(CONFIGS[args.phase_config], [target.pid],
                      os.path.join(workdir, "data-phase"), os.path.join(workdir, "agent-phase.log"),
                      cpu=1)
        agent.wait_attached(1)
        time.sleep(args.warmup)
        start_ms = time.time() * 1000
        agent_cpu0 = cpu_seconds(agent.pid)
        ticks = []
        while not ticks or ticks[-1][0] - start_ms < args.phase_seconds * 1000:
            line = target.next_line(10, "tick")
            if line["unix_ms"] >= start_ms:  # the warm-up's ticks wait in the queue
                ticks.append((line["unix_ms"], line["total_ops"]))
        result["agent_cpu_pct"] = 100 * (cpu_seconds(agent.pid) - agent_cpu0) / args.phase_seconds
        result["agent_stop_s"] = agent.stop()
        result["agent_problems"] = agent.problems()
        result["windows"] = agent.windows(target.pid)
        agent = None
        result["ticks"] = ticks
    finally:
        if agent:
            agent.stop()
        target.stop()
    result["load_end"] = loadavg()
    return result


PHASE_TICK_MS = 100
# Around a window, the part of a period its cost may reach: from shortly before it opens (the
# session's start) to a while after it closes (the session's stop, the runtime's cleanup).
PHASE_BEFORE_MS, PHASE_AFTER_MS = 500, 2000
# Where a period starts: this long before its window opens.
PHASE_LEAD_MS = 2000


def rate(ticks, spans, exclude=()):
    """Operations per ms over the tick intervals that start inside any of `spans` ([a, b)) and
    inside none of `exclude`."""
    ops = ms = 0.0
    for (t0, n0), (t1, n1) in zip(ticks, ticks[1:]):
        if any(a <= t0 < b for a, b in spans) and not any(a <= t0 < b for a, b in exclude):
            ops += n1 - n0
            ms += t1 - t0
    return ops / ms if ms else None


def affected(windows):
    """The spans around `windows` their cost may reach."""
    return [(o - PHASE_BEFORE_MS, c + PHASE_AFTER_MS) for o, c in windows]


def phase_losses(ticks, windows, exclude=()):
    """Per period, the loss against its quiet part (%), and the rate inside the window against
    it (%); tick intervals inside `exclude` count nowhere."""
    losses, inside = [], []
    for (opened, closed), (next_opened, _) in zip(windows, windows[1:]):
        start, end = opened - PHASE_LEAD_MS, next_opened - PHASE_LEAD_MS
        if start < ticks[0][0] or end > ticks[-1][0]:
            continue
        quiet = rate(ticks, [(start, opened - PHASE_BEFORE_MS), (closed + PHASE_AFTER_MS, end)],
                     exclude)
        whole = rate(ticks, [(start, end)], exclude)
        during = rate(ticks, [(opened, closed)], exclude)
        if quiet and whole and during:
            losses.append(100 * (1 - whole / quiet))
            inside.append(100 * (1 - during / quiet))
    return losses, inside


def report_phase(p, args):
    windows, ticks = p["windows"], p["ticks"]
    print(f"\nPhase: one Throughput (--threads 1 --blocked-threads {args.blocked_threads}, CPU 0), "
          f"agent `{args.phase_config}` (CPU 1), "
          f"{args.phase_seconds} s after {args.warmup} s of warm-up; operations every {PHASE_TICK_MS} ms")
    if len(windows) < 3 or len(ticks) < 100:
        print(f"too little data: {len(windows)} windows, {len(ticks)} ticks")
        return
    period = statistics.median(b[0] - a[0] for a, b in zip(windows, windows[1:]))
    length = statistics.median(c - o for o, c in windows)
    losses, inside = phase_losses(ticks, windows)
    # Pretend windows half a period away, the real windows' spans left out: what the method
    # finds where nothing happens.
    shifted = [(o + period / 2, c + period / 2) for o, c in windows]
    control, _ = phase_losses(ticks, shifted, exclude=affected(windows))
    if len(losses) < 2 or len(control) < 2:
        print(f"too few whole periods: {len(losses)}")
        return
    fmt = lambda v: "{:+.2f} ± {:.2f} %".format(*mean_ci95(v))
    print("| measure | mean ± 95 % CI | median [min, max] | periods |")
    print("|---|---|---|---|")
    print(f"| throughput lost over a period (the duty cycle's cost) | **{fmt(losses)}** "
          "| {:+.2f} [{:+.2f}, {:+.2f}] | {} |".format(*spread(losses), len(losses)))
    print(f"| control: the same with the windows moved by half a period (the real ones left out) | {fmt(control)} "
          "| {:+.2f} [{:+.2f}, {:+.2f}] | {} |".format(*spread(control), len(control)))
    print(f"| throughput lost while a window is open (≈ a 100 % duty cycle's cost) | {fmt(inside)} "
          "| {:+.2f} [{:+.2f}, {:+.2f}] | {} |".format(*spread(inside), len(inside)))
    print(f"windows: {len(windows)}, median period {period / 1000:.2f} s, median window "
          f"{length:.0f} ms (from the session's request to its end); agent CPU "
          f"{p['agent_cpu_pct']:.2f} % of a core (on CPU 1); load average "
          f"{p['load_start']:.2f} → {p['load_end']:.2f}")
    problems = "; ".join(f"{n}× {k}" for k, n in p["agent_problems"].items()) or "none"
    print(f"agent warnings/errors: {problems}")
    print(f"goal: throughput loss at default settings ≤ {GOAL_LOSS_PCT} %")


def store_figures(data_dir):
    """Bytes on disk and what the blocks' meta.json files say they hold."""
    files = blocks = disk = appended = stacks = stack_bytes = 0
    for dirpath, _, names in os.walk(data_dir):
        for name in names:
            st = os.stat(os.path.join(dirpath, name))
            files += st.st_size
            disk += st.st_blocks * 512
            if name == "stacks.parquet":
                stack_bytes += st.st_size
            if name == "meta.json":
                with open(os.path.join(dirpath, name)) as f:
                    meta = json.load(f)
                blocks += 1
                appended += meta["samples_appended"]
                stacks += meta["rows"]["stacks"]
    return {"store_bytes": files, "store_disk_bytes": disk, "blocks": blocks,
            "samples_appended": appended, "unique_stacks": stacks,
            "stack_bytes": stack_bytes}


def spread(values):
    med = statistics.median(values)
    return med, min(values), max(values)


def runtime_threads(runs):
    """Median % of a core per non-worker thread name of the profiled target, busiest first."""
    names = {n for r in runs for n in r["target_threads_cpu_pct"] if not n.startswith("Worker")}
    medians = {n: statistics.median(r["target_threads_cpu_pct"].get(n, 0.0) for r in runs) for n in names}
    busiest = sorted(medians.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{n} {pct:.1f}" for n, pct in busiest)


def loss_pct(base, value):
    return 100 * (base - value) / base


# Student's t, two-sided 95 %, by degrees of freedom (beyond 30: the normal's 1.96 is close).
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
       10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11,
       18: 2.10, 19: 2.09, 20: 2.09, 25: 2.06, 30: 2.04}


def mean_ci95(values):
    """Mean and the half-width of its 95 % confidence interval (at least 2 values)."""
    df = len(values) - 1
    t = T95[max(k for k in T95 if k <= df)] if df <= 30 else 1.96
    return statistics.fmean(values), t * statistics.stdev(values) / len(values) ** 0.5


def report_throughput(runs, configs, args):
    by_config = {c: [r for r in runs if r["config"] == c] for c in configs}
    mode = ("twins: two Throughputs side by side, the agent on one" if args.twins
            else "one Throughput at a time, configurations interleaved")
    if args.pin:
        mode += ", each twin pinned to a CPU of its own"
    print(f"\nThroughput ({mode}): --threads {args.threads} --blocked-threads {args.blocked_threads}, "
          f"{args.rounds} rounds, {args.warmup} s warm-up + {args.measure} s measured per run")
    print("| config | agent args | ops/s median | min – max (spread) | loss vs no agent, median [min, max] "
          "| ops per target CPU-s | its loss, median [min, max] | agent CPU % of a core "
          "| target CPU % | busiest runtime threads, % of a core | loss, mean ± 95 % CI |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        rs = by_config[c]
        med, lo, hi = spread([r["ops_per_s"] for r in rs])
        cpu_med = statistics.median(r["ops_per_cpu_s"] for r in rs)
        losses = cpu_losses = None
        if args.twins:
            # Each run against its twin, which shared the machine with it at the same moment.
            losses = [loss_pct(r["twin"]["ops_per_s"], r["ops_per_s"]) for r in rs]
            cpu_losses = [loss_pct(r["twin"]["ops_per_cpu_s"], r["ops_per_cpu_s"]) for r in rs]
        elif c != "none" and by_config.get("none"):
            # Each run against the no-agent run of the same round.
            base = {r["round"]: r for r in by_config["none"]}
            losses = [loss_pct(base[r["round"]]["ops_per_s"], r["ops_per_s"]) for r in rs]
            cpu_losses = [loss_pct(base[r["round"]]["ops_per_cpu_s"], r["ops_per_cpu_s"]) for r in rs]
        fmt = lambda v: "—" if v is None else "{:+.2f} % [{:+.2f}, {:+.2f}]".format(*spread(v))
        agent_cpu = "—"
        if CONFIGS[c] is not None:
            agent_cpu = "{:.2f} [{:.2f}, {:.2f}]".format(*spread([r["agent_cpu_pct"] for r in rs]))
        target_cpu = "{:.0f} [{:.0f}, {:.0f}]".format(*spread([r["target_cpu_pct"] for r in rs]))
        if args.twins:
            target_cpu += " (twin {:.0f})".format(statistics.median(r["twin"]["target_cpu_pct"] for r in rs))
        agent_args = "(no agent)" if CONFIGS[c] is None else (" ".join(CONFIGS[c]) or "(defaults)")
        ci = "—"
        if losses and len(losses) > 1:
            ci = "{:+.2f} ± {:.2f} %".format(*mean_ci95(losses))
        print(f"| {c} | `{agent_args}` | {med:,.0f} | {lo:,.0f} – {hi:,.0f} ({100 * (hi - lo) / med:.1f} %) "
              f"| {fmt(losses)} | {cpu_med:,.0f} | {fmt(cpu_losses)} | {agent_cpu} | {target_cpu} "
              f"| {runtime_threads(rs)} | {ci} |")
    loads = [x for r in runs for x in (r["load_start"], r["load_end"])]
    allocs = [r["alloc_mb_per_s"] for r in runs]
    print(f"load average (1 min) during part 1: {min(loads):.2f} – {max(loads):.2f}; "
          f"target allocation rate {min(allocs):.0f} – {max(allocs):.0f} MB/s")
    print(f"goal: throughput loss at default settings ≤ {GOAL_LOSS_PCT} %")
    print_runs(runs)


def print_runs(runs):
    print("\nEvery run, in the order run:")
    print("| round | config | ops/s | ops per CPU-s | target CPU % | twin: ops/s, ops per CPU-s "
          "| agent CPU % | agent stop (s) | load 1 min | agent warnings/errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        problems = "; ".join(f"{n}× {k}" for k, n in r.get("agent_problems", {}).items()) or "—"
        agent_cpu = f"{r['agent_cpu_pct']:.2f}" if "agent_cpu_pct" in r else "—"
        stop = f"{r['agent_stop_s']:.1f}" if "agent_stop_s" in r else "—"
        twin = f"{r['twin']['ops_per_s']:,.0f}, {r['twin']['ops_per_cpu_s']:,.0f}" if "twin" in r else "—"
        config = r["config"] + (f" (CPU {r['cpu']})" if "cpu" in r else "")
        print(f"| {r['round']} | {config} | {r['ops_per_s']:,.0f} | {r['ops_per_cpu_s']:,.0f} "
              f"| {r['target_cpu_pct']:.0f} | {twin} | {agent_cpu} | {stop} "
              f"| {r['load_start']:.2f}→{r['load_end']:.2f} | {problems} |")


def report_fleet(f):
    names = ", ".join(n + (" " + " ".join(a) if a else "") for n, a in FLEET)
    agent_args = " ".join(CONFIGS[f["config"]]) or "default settings"
    print(f"\nFleet: agent ({agent_args}) over {names}")
    print("| measure | result | goal |")
    print("|---|---|---|")
    cpu_ok = "meets" if f["steady_cpu_pct"] <= GOAL_CPU_PCT else "misses"
    rss_ok = "meets" if f["peak_rss_mib"] <= GOAL_RSS_MIB else "misses"
    print(f"| agent CPU, steady state ({f['seconds']:.0f} s after warm-up) | {f['steady_cpu_pct']:.2f} % of a core "
          f"| ≤ {GOAL_CPU_PCT} % ({cpu_ok}) |")
    threads = sorted(f["thread_cpu_pct"].items(), key=lambda kv: -kv[1])
    by_thread = ", ".join(f"{name} {pct:.2f}" for name, pct in threads)
    print(f"| of which per thread name (threads alive at the end) | {by_thread} | |")
    print(f"| agent CPU, whole run ({f['whole_seconds']:.0f} s, attach and rundowns included) "
          f"| {f['whole_cpu_pct']:.2f} % of a core | |")
    print(f"| agent peak RSS (VmHWM) | {f['peak_rss_mib']:.1f} MiB | ≤ {GOAL_RSS_MIB:.0f} MiB ({rss_ok}) |")
    print(f"| agent RSS every 5 s: first, max, last | {f['rss_first_mib']:.1f}, {f['rss_max_mib']:.1f}, "
          f"{f['rss_last_mib']:.1f} MiB | |")
    print(f"| agent stop after SIGINT | {f['agent_stop_s']:.1f} s | |")
    samples = f["sampler_samples"]
    print(f"| store: bytes (du) / blocks | {f['store_bytes']:,} ({f['store_disk_bytes']:,}) / {f['blocks']} | |")
    if samples:
        print(f"| bytes per sampler sample (all files / {samples:,} samples with a stack) "
              f"| {f['store_bytes'] / samples:.2f} | |")
    if f["samples_appended"]:
        print(f"| bytes per stored sample (all files / {f['samples_appended']:,} samples appended, "
              f"all profile types) | {f['store_bytes'] / f['samples_appended']:.2f} | ≤ 2 |")
    if f["unique_stacks"]:
        print(f"| stacks.parquet bytes per unique stack ({f['unique_stacks']:,} over all blocks) "
              f"| {f['stack_bytes'] / f['unique_stacks']:.2f} | ≤ 8 |")
    print(f"load average (1 min) during part 2: {f['load_start']:.2f} → {f['load_end']:.2f}")
    problems = "; ".join(f"{n}× {k}" for k, n in f["agent_problems"].items()) or "none"
    print(f"agent warnings/errors: {problems}")


def prepare(args):
    """Builds what the benchmark runs: the test bed (a no-op when current) and the release binary."""
    for command in (["bash", os.path.join(ROOT, "tests", "testbed", "setup.sh")],
                    ["cargo", "build", "--release", "--bin", "clrscope"]):
        if args.no_build and command[0] == "cargo":
            continue
        log(" ".join(command))
        if subprocess.run(command, cwd=ROOT).returncode != 0:
            raise SetupError(f"`{' '.join(command)}` failed")
    if not os.access(CLRSCOPE, os.X_OK):
        raise SetupError(f"{CLRSCOPE} is missing: run cargo build --release")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs per configuration (default 5)")
    parser.add_argument("--configs", default="none,default,full",
                        help=f"comma-separated, from {', '.join(CONFIGS)} (default none,default,full)")
    parser.add_argument("--warmup", type=int, default=10, help="seconds before counting (default 10)")
    parser.add_argument("--measure", type=int, default=30,
                        help=f"seconds counted per run, a multiple of {SAMPLE_PERIOD_S} (default 30)")
    parser.add_argument("--threads", type=int, default=4, help="Throughput worker threads (default 4)")
    parser.add_argument("--blocked-threads", type=int, default=0, help="Throughput idle threads (default 0)")
    parser.add_argument("--fleet-seconds", type=int, default=120,
                        help="steady-state seconds of part 2; 0 skips it (default 120)")
    parser.add_argument("--twins", action="store_true",
                        help="run two Throughputs at once, the agent on one: on a loaded machine both "
                             "see the same load, so their ratio is steadier than runs one after another")
    parser.add_argument("--pin", action="store_true",
                        help="with --twins, run each twin on a CPU of its own (CPU 0 and CPU 1)")
    parser.add_argument("--fleet-config", default="default",
                        help="agent configuration of part 2, from the same list (default: default)")
    parser.add_argument("--phase-seconds", type=int, default=0,
                        help="seconds of part 3 (the windows' cost inside one process); 0 skips it "
                             "(default 0; 600 gives ~60 periods)")
    parser.add_argument("--phase-config", default="default",
                        help="agent configuration of part 3 (default: default)")
    parser.add_argument("--no-build", action="store_true", help="use target/release/clrscope as it is")
    parser.add_argument("--keep", metavar="DIR", help="keep logs and stores in DIR instead of a temporary folder")
    args = parser.parse_args()
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}")
    if args.phase_config not in CONFIGS or CONFIGS[args.phase_config] is None:
        parser.error(f"--phase-config must name an agent configuration, not {args.phase_config}")
    if 0 < args.phase_seconds < 60 or (args.phase_seconds and len(os.sched_getaffinity(0)) < 2):
        parser.error("--phase-seconds must be 0 (skip) or at least 60, on at least 2 CPUs")
    if args.fleet_config not in CONFIGS or CONFIGS[args.fleet_config] is None:
        parser.error(f"--fleet-config must name an agent configuration, not {args.fleet_config}")
    if 0 < args.fleet_seconds < 10:
        parser.error("--fleet-seconds must be 0 (skip) or at least 10")
    if args.pin and (not args.twins or len(os.sched_getaffinity(0)) < 2):
        parser.error("--pin needs --twins and at least 2 CPUs")
    if args.measure % SAMPLE_PERIOD_S:
        parser.error(f"--measure must be a multiple of the default sample period, {SAMPLE_PERIOD_S} s")

    try:
        prepare(args)
        workdir = args.keep or tempfile.mkdtemp(prefix="clrscope-overhead-")
        os.makedirs(workdir, exist_ok=True)
        log(f"logs and stores in {workdir}; load average {loadavg():.2f}; {os.cpu_count()} CPUs")
        runs = []
        if args.rounds:
            for rnd in range(args.rounds):
                for i in range(len(configs)):
                    config = configs[(rnd + i) % len(configs)]
                    run = throughput_run(config, args, workdir, f"{rnd}-{config}", rnd % 2 == 1)
                    run["round"] = rnd + 1
                    runs.append(run)
                    log(f"round {rnd + 1} {config}: {run['ops_per_s']:,.0f} ops/s, load {run['load_end']:.2f}")
        fleet = None
        if args.fleet_seconds:
            log(f"fleet: 4 targets, agent {args.fleet_config}, {args.warmup} + {args.fleet_seconds} s")
            fleet = fleet_run(args, workdir)
            fleet["config"] = args.fleet_config
        phase = None
        if args.phase_seconds:
            log(f"phase: one Throughput, agent {args.phase_config}, {args.warmup} + {args.phase_seconds} s")
            phase = phase_run(args, workdir)
        if runs:
            report_throughput(runs, configs, args)
        if fleet:
            report_fleet(fleet)
        if phase:
            report_phase(phase, args)
        if args.keep:
            with open(os.path.join(workdir, "results.json"), "w") as f:
                json.dump({"args": vars(args), "runs": runs, "fleet": fleet, "phase": phase}, f, indent=1)
        else:
            # Logs and stores are worth keeping only when asked: a long run's take some MB.
            shutil.rmtree(workdir, ignore_errors=True)
    except SetupError as e:
        log(f"setup problem: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
