#!/usr/bin/env python3
"""Writes the hand-made hostile traces of tests/fuzz/hostile, which
test_hostile_traces.py reports on under a memory limit (the small ones are
also fuzz seeds in tests/fuzz/corpus). Each is small on disk and claims far
more than it holds. Needs the zstd command for the compressed ones.

    tests/fuzz/make_corpus.py [OUT_DIR]      (default: tests/fuzz/hostile)

The layout is interposer/trace_format.h's."""

import os
import struct
import subprocess
import sys
import zlib

FRAME_MAGIC = 0x4D4C4652
PYTHON_BIT = 1 << 63


def varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def zz(v):
    return (v << 1) ^ (v >> 63) if v >= 0 else ((-v) << 1) - 1


def string(s):
    if isinstance(s, str):
        s = s.encode()
    return varint(len(s)) + s


def header(command="hostile", host_mode="full"):
    text = ("pid=4242\nppid=1\ncommand=%s\nhost_mode=%s\nsample_interval=131072\nstart_mono_ns=1\n"
            % (command, host_mode)).encode()
    return b"MLEDGER\n" + struct.pack("<II", 2, len(text)) + text


_compressed = {}


def frame(index, payload, compress=False):
    stored = payload
    flags = 0
    if compress:
        if payload not in _compressed:
            _compressed[payload] = subprocess.run(["zstd", "-19", "-q", "-c"], input=payload, stdout=subprocess.PIPE,
                                                  check=True).stdout
        stored = _compressed[payload]
        flags = 1
    return struct.pack("<6I", FRAME_MAGIC, flags, len(stored), len(payload), zlib.crc32(stored), index) + stored


def alloc(seq_delta, ts_delta, addr_delta, size, stack, weight=None, flags=0):
    return (b"\x01" + varint(zz(seq_delta)) + varint(zz(ts_delta)) + varint(0) + varint(0) + varint(0) +
            varint(zz(addr_delta)) + varint(size) + varint(stack) + varint(flags) +
            varint(size if weight is None else weight))


def step(seq_delta, ts_delta, index):
    return b"\x06" + varint(zz(seq_delta)) + varint(zz(ts_delta)) + varint(0) + varint(index) + varint(0) + varint(0)


def exit_record(status):
    return b"\x0a" + varint(1000) + varint(zz(status))


def end_record():
    return b"\x0e" + varint(1001)


def python_module_60k():
    """A Python record whose module string is 60 KB, and stacks of Python
    frames that all show it: each shown frame used to copy the string."""
    payload = bytearray()
    payload += b"\x17" + varint(1) + string("3.11.2") + string("m" * 60000) + string("")
    payload += b"\x16" + varint(1) + string("train.py") + string("loop") + varint(7) + varint(0) + string("")
    for stack in range(1, 41):
        word = PYTHON_BIT | (1 << 32) | stack
        payload += b"\x03" + varint(stack) + varint(256) + varint(zz(word - (1 << 64))) + b"\x00" * 255
    addr = 0x10000
    for stack in range(1, 41):
        payload += alloc(1, 1, addr if stack == 1 else 64, 64, stack)
    payload += exit_record(0) + end_record()
    return header("python_module_60k") + frame(0, bytes(payload))


def allocation_bomb():
    """640 compressed frames of 95 thousand identical allocation records
    each: 61 M allocations claimed by some 60 KB."""
    one = alloc(1, 1, 16, 16, 0)
    body = one * ((1 << 20) // len(one))
    out = header("allocation_bomb")
    for i in range(640):
        out += frame(i, body, compress=True)
    return out


def step_bomb():
    """Compressed frames of step records only: 9 M steps claimed."""
    one = step(1, 1, 0)
    body = one * ((1 << 20) // len(one))
    out = header("step_bomb")
    for i in range(64):
        out += frame(i, body, compress=True)
    return out


def deep_stack_claims():
    """Stacks that claim more frames than the file holds, and strings that
    claim more bytes: refused, never reserved."""
    payload = b"\x03" + varint(7) + varint(1 << 60) + b"\x00" * 16
    first = header("deep_stack_claims") + frame(0, payload)
    payload = b"\x05" + varint(3) + varint(1 << 40) + b"x" * 16
    return first + frame(1, payload) + frame(2, exit_record(0) + end_record())


def terminal_escapes():
    """A command line and a Python function name holding terminal escape
    sequences (a title change, a screen clear)."""
    title = "\x1b]2;owned\x07"
    payload = bytearray()
    payload += b"\x16" + varint(1) + string("evil\x1b[2J.py") + string("f" + title) + varint(3) + varint(0) + string("")
    payload += b"\x17" + varint(1) + string("3.11.2") + string("libpython") + string("")
    word = PYTHON_BIT | (1 << 32)
    payload += b"\x03" + varint(1) + varint(1) + varint(zz(word - (1 << 64)))
    payload += alloc(1, 1, 0x1000, 4096, 1)
    payload += exit_record(0) + end_record()
    return header("run" + title + "\x1fx", host_mode="full") + frame(0, bytes(payload))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile")
    os.makedirs(out, exist_ok=True)
    for name, make in [("python_module_60k", python_module_60k), ("allocation_bomb", allocation_bomb),
                       ("step_bomb", step_bomb), ("deep_stack_claims", deep_stack_claims),
                       ("terminal_escapes", terminal_escapes)]:
        data = make()
        with open(os.path.join(out, "hostile-%s.mlt" % name), "wb") as f:
            f.write(data)
        print("%s: %d bytes" % (name, len(data)))


if __name__ == "__main__":
    main()
