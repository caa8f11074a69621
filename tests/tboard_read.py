#!/usr/bin/env python3
"""tboard_read.py — reads TensorBoard event files with the Python standard library alone, independently of
pith's writer (src/train/tboard.c): TFRecord framing with both masked CRC-32C checks, and the protobuf wire
format of Event{wall_time=1, step=2, file_version=3, summary=5{value=1{tag=1, simple_value=2}}}.
Prints one JSON line per event: {"step": S, "wall_time": T, "file_version": "..."} or {..., "values": {tag: v}}.
A file that ends inside a record (a killed run) reads up to its last whole record and says so on stderr;
a CRC that does not match is an error (exit 1).
usage: tboard_read.py FILE"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def fields(buf):
    """Yields (field number, wire type, value) of one message; len-delimited values are bytes."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def event(buf):
    out = {"step": 0}
    for num, wt, v in fields(buf):
        if num == 1 and wt == 1:
            out["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wt == 0:
            out["step"] = v - (1 << 64) if v >> 63 else v
        elif num == 3 and wt == 2:
            out["file_version"] = v.decode()
        elif num == 5 and wt == 2:
            vals = out.setdefault("values", {})
            for n2, w2, val in fields(v):
                if n2 != 1 or w2 != 2:
                    continue
                tag, x = None, 0.0  # proto3 leaves out a value of 0
                for n3, w3, f in fields(val):
                    if n3 == 1 and w3 == 2:
                        tag = f.decode()
                    elif n3 == 2 and w3 == 5:
                        x = struct.unpack("<f", f)[0]
                vals[tag] = x
    return out


def main():
    data = open(sys.argv[1], "rb").read()
    i = 0
    while i < len(data):
        if i + 12 > len(data):
            break
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        if struct.unpack("<I", data[i + 8:i + 12])[0] != masked(head):
            sys.exit(f"{sys.argv[1]}: record at byte {i}: length CRC does not match")
        if i + 12 + n + 4 > len(data):
            break
        body = data[i + 12:i + 12 + n]
        if struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] != masked(body):
            sys.exit(f"{sys.argv[1]}: record at byte {i}: data CRC does not match")
        print(json.dumps(event(body)))
        i += 16 + n
    if i < len(data):
        print(f"{sys.argv[1]}: truncated after byte {i} ({len(data) - i} bytes of a partial record)", file=sys.stderr)


main()
