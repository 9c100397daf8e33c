#!/usr/bin/env python3
"""Connection floods against a running agent (issue 18): opens IDLE connections that send
nothing and SLOW connections that send a request head one byte every few seconds to each
listener (the API and the metrics listener), keeps those numbers up (a closed connection is
reopened once a second, as an attacker would), and meanwhile times authenticated API calls and
/metrics scrapes, each on a new connection. Prints p50 and max of each, and how many calls failed
or took longer than --slow-answer.

    ulimit -n 16384   # the client's sockets
    python3 benches/connection_flood.py --api 127.0.0.1:52323 --metrics 127.0.0.1:52325 \
        --token "$TOKEN" [--idle 3000] [--slow 200] [--calls 20] [--agent-pid PID]

Python 3 standard library only.
"""

import argparse
import os
import resource
import selectors
import socket
import statistics
import threading
import time


def address(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


class Flood:
    """IDLE + SLOW connections to one listener, reopened when the server closes them."""

    def __init__(self, target, idle, slow, byte_every):
        self.target = target
        self.want = {"idle": idle, "slow": slow}
        self.byte_every = byte_every
        self.head = (
            f"GET /metrics HTTP/1.1\r\nHost: {target[0]}:{target[1]}\r\nX-Pad: "
            + "a" * 200
            + "\r\n\r\n"
        ).encode()
        self.selector = selectors.DefaultSelector()
        self.open = {"idle": 0, "slow": 0}
        self.closed_by_server = 0
        self.connect_errors = 0
        self.slow_sockets = {}  # socket -> bytes sent

    def _connect(self, kind):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect_ex(self.target)
        except OSError:
            self.connect_errors += 1
            s.close()
            return False
        self.selector.register(s, selectors.EVENT_READ, kind)
        self.open[kind] += 1
        if kind == "slow":
            self.slow_sockets[s] = 0
        return True

    def top_up(self):
        for kind in ("idle", "slow"):
            while self.open[kind] < self.want[kind]:
                if not self._connect(kind):
                    return

    def _close(self, s, kind):
        self.selector.unregister(s)
        s.close()
        self.open[kind] -= 1
        self.slow_sockets.pop(s, None)

    def reap(self, timeout):
        """Notices connections the server closed (readable with no data, or reset)."""
        for key, _ in self.selector.select(timeout):
            s, kind = key.fileobj, key.data
            try:
                data = s.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                self.closed_by_server += 1
                self._close(s, kind)

    def trickle(self):
        for s in list(self.slow_sockets):
            sent = self.slow_sockets[s]
            try:
                s.send(self.head[sent % len(self.head) : sent % len(self.head) + 1])
                self.slow_sockets[s] = sent + 1
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.closed_by_server += 1
                self._close(s, "slow")


def run_floods(floods, byte_every, stop):
    last_trickle = 0.0
    last_top_up = 0.0
    while not stop.is_set():
        now = time.monotonic()
        if now - last_top_up >= 1.0:
            for flood in floods:
                flood.top_up()
            last_top_up = now
        if now - last_trickle >= byte_every:
            for flood in floods:
                flood.trickle()
            last_trickle = now
        for flood in floods:
            flood.reap(0.05)


def timed_get(target, path, headers, timeout):
    """Seconds to connect, send GET path and read the whole answer (Connection: close); None if
    it failed or took longer than timeout."""
    start = time.monotonic()
    try:
        with socket.create_connection(target, timeout=timeout) as s:
            request = f"GET {path} HTTP/1.1\r\nHost: {target[0]}:{target[1]}\r\n"
            for name, value in headers:
                request += f"{name}: {value}\r\n"
            s.sendall((request + "Connection: close\r\n\r\n").encode())
            answer = b""
            while True:
                s.settimeout(max(0.001, timeout - (time.monotonic() - start)))
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        if not answer.startswith(b"HTTP/1.1 200"):
            return None
        return time.monotonic() - start
    except OSError:
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", type=address, required=True, help="HOST:PORT of the API")
    parser.add_argument("--metrics", type=address, required=True, help="HOST:PORT of /metrics")
    parser.add_argument("--token", default="", help="bearer token for the API (none: --no-auth)")
    parser.add_argument("--idle", type=int, default=3000, help="idle connections per listener")
    parser.add_argument("--slow", type=int, default=200, help="slow-header connections per listener")
    parser.add_argument("--byte-every", type=float, default=3.0, help="seconds between slow bytes")
    parser.add_argument("--calls", type=int, default=20, help="timed calls to each listener")
    parser.add_argument("--timeout", type=float, default=10.0, help="give up on a call after this")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of flood before timing")
    parser.add_argument("--slow-answer", type=float, default=1.0, help="report calls slower than this")
    parser.add_argument("--agent-pid", type=int, help="report the agent's open descriptors (Linux /proc)")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (args.idle + args.slow) + 64
    if soft < need:
        soft = min(hard, need) if hard != resource.RLIM_INFINITY else need
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft < need:
        raise SystemExit(f"need {need} file descriptors, the hard limit is {hard}: raise it (ulimit -Hn)")

    floods = [Flood(t, args.idle, args.slow, args.byte_every) for t in (args.api, args.metrics)]
    for flood in floods:
        flood.top_up()
    stop = threading.Event()
    flooder = threading.Thread(target=run_floods, args=(floods, args.byte_every, stop), daemon=True)
    flooder.start()
    time.sleep(args.settle)

    def agent_fds():
        try:
            return len(os.listdir(f"/proc/{args.agent_pid}/fd"))
        except OSError:
            return None

    auth = [("Authorization", f"Bearer {args.token}")] if args.token else []
    fds = []
    results = {}
    for name, target, path, headers in (
        ("API GET /api/v1/processes", args.api, "/api/v1/processes", auth),
        ("metrics GET /metrics", args.metrics, "/metrics", []),
    ):
        times = []
        for _ in range(args.calls):
            times.append(timed_get(target, path, headers, args.timeout))
            if args.agent_pid:
                fds.append(agent_fds())
        results[name] = times
    stop.set()
    flooder.join()

    print(f"flood per listener: {args.idle} idle + {args.slow} slow-header (a byte every {args.byte_every:g} s), "
          f"reopened each second; {args.settle:g} s before timing")
    for flood, label in zip(floods, ("API", "metrics")):
        print(f"  {label}: open now {flood.open['idle']} idle + {flood.open['slow']} slow; "
              f"closed by the server {flood.closed_by_server}; connect errors {flood.connect_errors}")
    if fds:
        known = [n for n in fds if n is not None]
        print(f"agent's open descriptors while timing: max {max(known) if known else '?'}")
    for name, times in results.items():
        answered = [t for t in times if t is not None]
        failed = len(times) - len(answered)
        slow = sum(1 for t in answered if t > args.slow_answer)
        if answered:
            print(f"{name}: {len(answered)}/{len(times)} answered, p50 {statistics.median(answered) * 1000:.1f} ms, "
                  f"max {max(answered) * 1000:.1f} ms, over {args.slow_answer:g} s: {slow}, "
                  f"failed or over {args.timeout:g} s: {failed}")
        else:
            print(f"{name}: 0/{len(times)} answered within {args.timeout:g} s")


if __name__ == "__main__":
    main()
