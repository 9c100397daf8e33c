#!/usr/bin/env python3
"""A hostile .NET runtime for tests/hostile_targets.rs (Python 3 stdlib only).

It listens on a connect-mode diagnostic socket and speaks the diagnostics IPC protocol
(dotnet/diagnostics documentation/design-docs/ipc-protocol.md) well enough to be attached to,
then misbehaves as told:

    fake_runtime.py --socket-dir DIR [--as-pid PID] [--trace FILE]
                    [--dump ok|symlink:PATH|fifo|hardlink:PATH]
                    [--signals scopes|exceptions|meters|blocks [--to-every-session] [--keep-open]]

--as-pid   name the socket after another process (a spoofed socket), with its start time
--trace    the bytes sent after every CollectTracing reply (a crafted nettrace stream)
--dump     what is put at the path of a GenerateCoreDump request before answering S_OK:
           a small dump (ok), a symbolic link to PATH, a FIFO, or a hard link to PATH
--signals  a well-formed stream of signals that cost memory to keep (issue 44), sent to each
           session whose request names its provider (every session with --to-every-session):
             scopes      16 nested ActivityJsonStart scopes of 30 values of 16,000 characters,
                         then 100 short MessageJson messages inside them
                         (Microsoft-Extensions-Logging)
             exceptions  200 ExceptionThrown_V1 events of ~960 KB: type name and message of
                         non-ASCII text (Microsoft-Windows-DotNETRuntime)
             meters      150 CounterRateValuePublished events of session SHARED, meter
                         Hostile.Meter, whose version and instrument take 300 KB each and whose
                         tags are 120,000 empty pairs (System.Diagnostics.Metrics)
             blocks      80 MB of event blocks of one ~1 MB event each, for a pre-trigger ring
                         (provider Hostile-Ring)
           Other sessions get a stream with no event, held open until they are stopped; with
           --keep-open the crafted stream is held open too once sent (else it ends, and the
           agent starts the session again).

It prints `ready SOCKET_PATH` once it listens, `dump PATH` for each dump request, and
`streaming KIND SESSION_ID` and `sent KIND SESSION_ID` when it begins to send a crafted signals
stream and when it was sent whole.
"""

import argparse
import itertools
import json
import os
import socket
import struct
import sys
import threading

MAGIC = b"DOTNET_IPC_V1\0"
HEADER = struct.Struct("<14sHBBH")
SERVER, OK, ERROR = 0xFF, 0x00, 0xFF
DUMP, EVENTPIPE, PROCESS = 0x01, 0x02, 0x04
UNKNOWN_COMMAND = 0x80131385


# --- Well-formed NetTrace (V5: "!FastSerialization.1" objects, uncompressed event headers) ---

LOGGING = "Microsoft-Extensions-Logging"
RUNTIME = "Microsoft-Windows-DotNETRuntime"
METRICS = "System.Diagnostics.Metrics"
RING = "Hostile-Ring"
INT32, STRING = 9, 18
# Every event's time: the stream's sync time (2026-01-02T03:04:05.006Z at tick 1000), so that
# retention by the target's own timestamps never lets one go.
TICK = 1000


class NetTrace:
    """Builds a stream object by object, 4-byte aligned from its start as the runtime writes."""

    def __init__(self, pid):
        self.out = bytearray(b"Nettrace" + struct.pack("<i", 20) + b"!FastSerialization.1")
        self.begin_object("Trace", 4, 4)
        self.out += struct.pack("<8H", 2026, 1, 5, 2, 3, 4, 5, 6)
        self.out += struct.pack("<qqIIII", TICK, 1_000_000_000, 8, pid, 2, 1_000_000)
        self.out += b"\x06"
        self.sequence = itertools.count(1)
        self.metadata_ids = itertools.count(1)

    def begin_object(self, name, version, minimum):
        self.out += bytes([5, 5, 1]) + struct.pack("<iii", version, minimum, len(name))
        self.out += name.encode() + b"\x06"

    def block(self, name, body):
        self.begin_object(name, 2, 2)
        self.out += struct.pack("<I", len(body))
        self.out += b"\0" * (-len(self.out) % 4)
        self.out += body + b"\x06"

    @staticmethod
    def events_body(events):
        body = bytearray(struct.pack("<HHqq", 20, 0, TICK, TICK))
        for metadata_id, sequence, activity, related, payload in events:
            unpadded = 80 + len(payload)
            padded = unpadded + (-unpadded % 4)
            body += struct.pack("<IIIQQIIq", padded - 4, metadata_id, sequence, 7, 7, 0, 0, TICK)
            body += activity + related + struct.pack("<I", len(payload)) + payload
            body += b"\0" * (padded - unpadded)
        return bytes(body)

    def metadata(self, provider, event_id, name, fields=(), version=0):
        """Declares an event: `fields` are (TypeCode, name) of a self-describing payload."""
        metadata_id = next(self.metadata_ids)
        record = struct.pack("<I", metadata_id) + utf16z(provider) + struct.pack("<I", event_id)
        record += utf16z(name) + struct.pack("<QII", 0, version, 4)
        record += struct.pack("<i", len(fields))
        for code, field in fields:
            record += struct.pack("<i", code) + utf16z(field)
        self.block("MetadataBlock", self.events_body([(0, 0, NIL, NIL, record)]))
        return metadata_id

    def event(self, metadata_id, payload, activity=None, related=None):
        """One event in a block of its own (blocks stay under the parser's 1 MiB)."""
        event = (metadata_id, next(self.sequence), activity or NIL, related or NIL, payload)
        self.block("EventBlock", self.events_body([event]))

    def finish(self):
        return bytes(self.out + b"\x01")


NIL = bytes(16)


def utf16z(text):
    return (text + "\0").encode("utf-16-le")


def guid(n):
    return struct.pack("<I", n) + bytes(12)


def scopes_stream(pid):
    """16 nested BeginScope(30 values of 16,000 characters), then 100 messages inside them."""
    trace = NetTrace(pid)
    start = trace.metadata(LOGGING, 6, "ActivityJsonStart",
                           [(INT32, "ID"), (INT32, "FactoryID"), (STRING, "LoggerName"),
                            (STRING, "ArgumentsJson")])
    message = trace.metadata(LOGGING, 5, "MessageJson",
                             [(INT32, "Level"), (INT32, "FactoryID"), (STRING, "LoggerName"),
                              (INT32, "EventId"), (STRING, "EventName"),
                              (STRING, "ExceptionJson"), (STRING, "ArgumentsJson"),
                              (STRING, "FormattedMessage")])
    for depth in range(16):
        values = {f"v{depth:02}{i:02}": chr(ord("a") + i % 26) * 16_000 for i in range(30)}
        payload = struct.pack("<ii", depth, 1) + utf16z("Hostile.Scopes")
        payload += utf16z(json.dumps(values))
        trace.event(start, payload, activity=guid(depth + 1), related=guid(depth))
    for n in range(100):
        payload = struct.pack("<ii", 2, 1) + utf16z("Hostile.Scopes") + struct.pack("<i", n)
        payload += utf16z("Inside") + utf16z("") + utf16z("{}") + utf16z(f"message {n}")
        trace.event(message, payload, activity=guid(16), related=guid(15))
    return trace.finish()


def exceptions_stream(pid):
    """200 first-chance exceptions whose type name and message are ~960 KB of UTF-16 together:
    characters that take three bytes in UTF-8."""
    trace = NetTrace(pid)
    thrown = trace.metadata(RUNTIME, 80, "ExceptionThrown_V1", version=1)
    for n in range(200):
        type_name = f"Hostile.E{n}." + "\u20ac" * 160_000
        message = "\u00e9\u20ac" * 160_000
        payload = utf16z(type_name) + utf16z(message)
        payload += struct.pack("<QIHH", 0x7F00_0000_1000, 0x80131500, 0, 0)
        trace.event(thrown, payload)
    return trace.finish()


def meters_stream(pid):
    """150 measurements of the shared metrics session, of meter Hostile.Meter, whose meter
    version and instrument name take 300 KB each in UTF-8 and whose tags are 120,000 empty
    pairs (`=`, 48 bytes each once split)."""
    trace = NetTrace(pid)
    fields = ["sessionId", "meterName", "meterVersion", "instrumentName", "unit", "tags",
              "rate", "value"]
    rate = trace.metadata(METRICS, 4, "CounterRateValuePublished",
                          [(STRING, f) for f in fields])
    version = "\u20ac" * 100_000
    instrument = "hostile." + "\u20ac" * 100_000
    tags = ",".join(["="] * 120_000)
    for n in range(150):
        values = ["SHARED", "Hostile.Meter", version, instrument, "{thing}", tags, str(n),
                  str(n * 10)]
        trace.event(rate, b"".join(utf16z(v) for v in values))
    return trace.finish()


def blocks_stream(pid):
    """80 event blocks of one ~1 MB event each, all at the same time: what a ring keeps."""
    trace = NetTrace(pid)
    event = trace.metadata(RING, 1, "Filler", [(STRING, "Text")])
    filler = utf16z("x" * 500_000)
    for _ in range(80):
        trace.event(event, filler)
    return trace.finish()


SIGNALS = {
    "scopes": (LOGGING, scopes_stream),
    "exceptions": (RUNTIME, exceptions_stream),
    "meters": (METRICS, meters_stream),
    "blocks": (RING, blocks_stream),
}


def names_provider(payload, provider):
    """Whether a CollectTracing payload enables `provider` (a length-prefixed UTF-16 string)."""
    units = provider + "\0"
    return struct.pack("<I", len(units)) + units.encode("utf-16-le") in payload


def start_time(pid):
    """Field 22 of /proc/PID/stat: the key in a runtime's socket name."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[22 - 3])


def utf16(text):
    units = (text + "\0").encode("utf-16-le")
    return struct.pack("<I", len(units) // 2) + units


def reply(conn, command_id, payload):
    conn.sendall(HEADER.pack(MAGIC, HEADER.size + len(payload), SERVER, command_id, 0) + payload)


def read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def process_info(pid):
    # Its own runtime cookie: an agent attaches to one runtime per cookie.
    cookie = struct.pack("<I", pid) + bytes(range(12))
    return (struct.pack("<Q", pid) + cookie + utf16("/usr/bin/dotnet Hostile.dll")
            + utf16("Linux") + utf16("x64"))


def dump_path(payload):
    (units,) = struct.unpack_from("<I", payload, 0)
    return payload[4:4 + 2 * units].decode("utf-16-le").rstrip("\0")


def plant(path, how):
    if how == "ok":
        with open(path, "wb") as f:
            f.write(b"FAKE-DUMP" * 100)
    elif how.startswith("symlink:"):
        os.symlink(how[len("symlink:"):], path)
    elif how == "fifo":
        os.mkfifo(path, 0o666)
    elif how.startswith("hardlink:"):
        os.link(how[len("hardlink:"):], path)
    else:
        sys.exit(f"unknown --dump {how}")


class Sessions:
    """Open EventPipe sessions by id: a StopTracing ends the one it names."""

    def __init__(self):
        self.ids = itertools.count(0x1234)
        self.lock = threading.Lock()
        self.stops = {}

    def open(self):
        with self.lock:
            session_id = next(self.ids)
            self.stops[session_id] = threading.Event()
            return session_id, self.stops[session_id]

    def stop(self, session_id):
        with self.lock:
            stop = self.stops.pop(session_id, None)
        if stop is not None:
            stop.set()


def serve(conn, args, pid, sessions):
    try:
        answer(conn, args, pid, sessions)
    except OSError:
        pass  # the agent hung up (it refused the stream): what a hostile runtime expects


def stream_signals(conn, args, payload, sessions):
    """Answers a CollectTracing with the crafted stream (or an empty one) and holds the
    session open as --signals says, until it is stopped or the agent hangs up."""
    session_id, stopped = sessions.open()
    reply(conn, OK, struct.pack("<Q", session_id))
    provider, _ = SIGNALS[args.signals]
    crafted = args.to_every_session or names_provider(payload, provider)
    stream = args.signal_stream if crafted else args.empty_stream
    if crafted:
        print(f"streaming {args.signals} {session_id}", flush=True)
    # All but the end-of-stream tag, which goes once the session ends.
    conn.sendall(stream[:-1])
    if crafted:
        print(f"sent {args.signals} {session_id}", flush=True)
    if not crafted or args.keep_open:
        conn.settimeout(0.2)
        while not stopped.is_set():
            try:
                if not conn.recv(1):
                    return
            except socket.timeout:
                pass
    conn.sendall(stream[-1:])


def answer(conn, args, pid, sessions):
    with conn:
        header = read_exact(conn, HEADER.size)
        if header is None:
            return
        magic, size, command_set, command_id, _ = HEADER.unpack(header)
        payload = read_exact(conn, size - HEADER.size) if size > HEADER.size else b""
        if magic != MAGIC or payload is None:
            return
        if (command_set, command_id) == (PROCESS, 0x00):
            reply(conn, OK, process_info(pid))
        elif (command_set, command_id) == (PROCESS, 0x01):
            reply(conn, OK, struct.pack("<I", 0))
        elif command_set == EVENTPIPE and command_id == 0x01:
            sessions.stop(struct.unpack_from("<Q", payload.ljust(8, b"\0"))[0])
            reply(conn, OK, payload[:8].ljust(8, b"\0"))
        elif command_set == EVENTPIPE and args.signals:
            stream_signals(conn, args, payload, sessions)
        elif command_set == EVENTPIPE and args.trace:
            reply(conn, OK, struct.pack("<Q", 0x1234))
            with open(args.trace, "rb") as f:
                while chunk := f.read(1 << 16):
                    conn.sendall(chunk)
        elif command_set == DUMP and args.dump:
            path = dump_path(payload)
            print(f"dump {path}", flush=True)
            plant(path, args.dump)
            reply(conn, OK, struct.pack("<I", 0))
        else:
            reply(conn, ERROR, struct.pack("<I", UNKNOWN_COMMAND))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket-dir", required=True)
    parser.add_argument("--as-pid", type=int)
    parser.add_argument("--trace")
    parser.add_argument("--dump")
    parser.add_argument("--signals", choices=sorted(SIGNALS))
    parser.add_argument("--to-every-session", action="store_true")
    parser.add_argument("--keep-open", action="store_true")
    args = parser.parse_args()
    named = args.as_pid or os.getpid()
    if args.signals:
        args.signal_stream = SIGNALS[args.signals][1](named)
        args.empty_stream = NetTrace(named).finish()
    sessions = Sessions()
    path = os.path.join(args.socket_dir, f"dotnet-diagnostic-{named}-{start_time(named)}-socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print(f"ready {path}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, args, named, sessions), daemon=True).start()


if __name__ == "__main__":
    main()
