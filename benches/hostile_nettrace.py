#!/usr/bin/env python3
"""Crafted NetTrace V6 streams that amplify in a parser without a memory budget, for the
"Hostile input: nettrace budget" section of BENCHMARKS.md.

    benches/hostile_nettrace.py KIND SIZE_MIB OUT

KIND:
  labels-one-block  one LabelList block of two-byte label lists (what issue 18 measured)
  labels            LabelList blocks of at most 1,000,000 bytes, same lists
  metadata          Metadata blocks of rows with a thousand one-letter fields, distinct ids
  stacks            StackBlocks of one deep stack each (100,000 frames, 800 KB), no sequence
                    point to free them
  counts            blocks whose counts claim billions of items the bytes do not hold (a
                    LabelList, a StackBlock), then the same again

Layout: perfview NetTraceFormat.md (V6); a label list `0x89 4` is one label (level 4) that ends
its list, a field `u16 size, varuint len, "a", type 9` describes an Int32.
"""

import struct
import sys

LABEL_LIST = 8
METADATA = 3
STACK = 5
MAX_BLOCK = 1_000_000


def block(kind, body):
    return struct.pack("<I", (kind << 24) | len(body)) + body


def header():
    out = b"Nettrace" + struct.pack("<III", 0, 6, 0)
    trace = struct.pack("<8H", 2026, 1, 5, 2, 3, 4, 5, 6)
    trace += struct.pack("<qqii", 1000, 1_000_000_000, 8, 0)
    return out + block(1, trace)


def label_block(first, count):
    return block(LABEL_LIST, struct.pack("<II", first, count) + b"\x89\x04" * count)


def varuint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def metadata_row(metadata_id, fields):
    row = varuint(metadata_id) + varuint(16) + b"Hostile-Provider" + varuint(1) + varuint(1) + b"E"
    field = b"\x01a\x09"
    row += struct.pack("<H", fields) + (struct.pack("<H", len(field)) + field) * fields
    row += struct.pack("<H", 0)
    return struct.pack("<H", len(row)) + row


def main():
    kind, size_mib, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    target = size_mib << 20
    out = bytearray(header())
    if kind == "labels-one-block":
        count = (target - len(out) - 16) // 2
        out += label_block(1, count)
    elif kind == "labels":
        first = 1
        per_block = (MAX_BLOCK - 8) // 2
        while len(out) < target:
            out += label_block(first, per_block)
            first += per_block
    elif kind == "metadata":
        row_id = 1
        while len(out) < target:
            rows = bytearray(struct.pack("<H", 0))
            while len(rows) < MAX_BLOCK - 6000:
                rows += metadata_row(row_id, 1000)
                row_id += 1
            out += block(METADATA, bytes(rows))
    elif kind == "stacks":
        first = 1
        frames = 100_000
        while len(out) < target:
            body = struct.pack("<III", first, 1, frames * 8) + struct.pack("<Q", 0x7F00_0000_1000) * frames
            out += block(STACK, body)
            first += 1
    elif kind == "counts":
        while len(out) < target:
            out += block(LABEL_LIST, struct.pack("<II", 1, 0xFFFF_FFFF) + b"\x89\x04")
            out += block(STACK, struct.pack("<III", 1, 0xFFFF_FFFF, 8) + b"\0" * 8)
    else:
        sys.exit(f"unknown kind {kind}: labels-one-block, labels, metadata, stacks or counts")
    out += block(0, b"")
    with open(path, "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main()
