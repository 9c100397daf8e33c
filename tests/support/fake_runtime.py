#!/usr/bin/env python3
"""A hostile .NET runtime for tests/hostile_targets.rs (Python 3 stdlib only).

It listens on a connect-mode diagnostic socket and speaks the diagnostics IPC protocol
(dotnet/diagnostics documentation/design-docs/ipc-protocol.md) well enough to be attached to,
then misbehaves as told:

    fake_runtime.py --socket-dir DIR [--as-pid PID] [--trace FILE]
                    [--dump ok|symlink:PATH|fifo|hardlink:PATH]

--as-pid   name the socket after another process (a spoofed socket), with its start time
--trace    the bytes sent after every CollectTracing reply (a crafted nettrace stream)
--dump     what is put at the path of a GenerateCoreDump request before answering S_OK:
           a small dump (ok), a symbolic link to PATH, a FIFO, or a hard link to PATH

It prints `ready SOCKET_PATH` once it listens, and `dump PATH` for each dump request.
"""

import argparse
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
    cookie = bytes(range(16))
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


def serve(conn, args, pid):
    try:
        answer(conn, args, pid)
    except OSError:
        pass  # the agent hung up (it refused the stream): what a hostile runtime expects


def answer(conn, args, pid):
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
            reply(conn, OK, payload[:8].ljust(8, b"\0"))
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
    args = parser.parse_args()
    named = args.as_pid or os.getpid()
    path = os.path.join(args.socket_dir, f"dotnet-diagnostic-{named}-{start_time(named)}-socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print(f"ready {path}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, args, named), daemon=True).start()


if __name__ == "__main__":
    main()
