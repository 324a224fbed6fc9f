"""A loop that keeps every step's buffer in a module-level list until it is
sent SIGTERM, for memledger's retention paths at SIGTERM.

    retention_sigterm_client.py [--steps N] [--block none|native]

Each step appends a 256 KiB bytearray to the list `history` and ends a
memledger step. After N steps it prints `READY PID` and goes on (the test
waits a moment before it sends SIGTERM to a blocking one):
--block none: the loop goes on (one step every 20 ms) until the signal;
--block native: the main thread blocks in native code for good, holding
    the GIL (ctypes.PyDLL): it locks a mutex it already holds, a wait that
    no signal interrupts, so no Python runs again in the process.
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
    if args.block == "native":
        libc = ctypes.PyDLL(None)
        lock = libc.pthread_mutex_lock
        mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER, a normal mutex
        lock(mutex)
        print("READY %d" % os.getpid(), flush=True)
        lock(mutex)  # a normal mutex locked again by its owner: waits for ever
        print("NOT_REACHED", flush=True)
    print("READY %d" % os.getpid(), flush=True)
    while True:
        step()
        time.sleep(0.02)


if __name__ == "__main__":
    main()
