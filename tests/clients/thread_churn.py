"""Starts and joins one short-lived thread after another, each making a few
hundred allocations, as a program whose thread pool comes and goes does.

    thread_churn.py THREADS

Prints `maxrss_kib=N` (its own peak RSS) and DONE."""

import resource
import sys
import threading


def work():
    kept = [bytearray(1000) for _ in range(100)]
    return len(kept)


def main():
    for _ in range(int(sys.argv[1])):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    print("maxrss_kib=%d" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
