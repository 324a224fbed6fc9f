"""A loop that keeps every step's buffer in a module-level list until it is
sent SIGTERM, for memledger's retention paths at SIGTERM.

    retention_sigterm_client.py [--steps N] [--block none|native]

Each step appends a 256 KiB bytearray to the list `history` and ends a
memledger step. After N steps it prints `READY PID` and goes on:
--block none: the loop goes on (one step every 20 ms) until the signal;
--block native: the main thread blocks in a native read of a pipe that
    never gets data, holding the GIL (ctypes.PyDLL): no Python runs until
    the read returns, and a restarted read never does.
It never ends by itself."""

import argparse
import ctypes
import os
import time

try:
    import memledger
except ImportError:  # run without `memledger run`
    memledger = None

history = []


def step():
    history.append(bytearray(256 * 1024))  # LEAK_SITE(history)
    if memledger is not None:
        memledger.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--block", choices=("none", "native"), default="none")
    args = parser.parse_args()
    for _ in range(args.steps):
        step()
    print("READY %d" % os.getpid(), flush=True)
    if args.block == "native":
        r, w = os.pipe()  # w stays open: the read never ends
        buf = ctypes.create_string_buffer(1)
        ctypes.PyDLL(None).read(r, buf, 1)
        print("NOT_REACHED", flush=True)
    while True:
        step()
        time.sleep(0.02)


if __name__ == "__main__":
    main()
