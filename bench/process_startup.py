#!/usr/bin/env python3
"""Per-process cost: a shell that runs /bin/true N times, untraced and under
`memledger run` (full and sampled host modes), in the same invocation,
interleaved round by round; then the report of one traced run is timed.

    python3 bench/process_startup.py [--build build] [--iterations 50] [--repeat 3]

Every iteration is one fork (the shell's) and one exec (/bin/true): each
gives a traced process its own trace, so a run leaves 2 x N + 1 traces. The
table gives the median wall time of --repeat runs, the extra cost per
process over untraced, and the time `memledger report` takes on the traces
of a full-mode run (text to /dev/null), per trace.

A benchmark, not a test: it always exits 0 once it has run. Python standard
library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def timed(args, env=None):
    start = time.perf_counter()
    proc = subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (proc.returncode, " ".join(args), proc.stderr[-2000:]))
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=str(REPO_ROOT / "build"), help="build folder (default: build)")
    parser.add_argument("--iterations", type=int, default=50, help="/bin/true runs per shell (default 50)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each configuration (default 3)")
    opts = parser.parse_args()
    memledger = Path(opts.build) / "tools" / "memledger"
    if not memledger.exists():
        sys.exit("no %s: build first (scripts/build.sh)" % memledger)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("MEMLEDGER_")}
    shell = ["bash", "-c", "for i in $(seq %d); do /bin/true; done" % opts.iterations]
    work = Path(tempfile.mkdtemp(prefix="memledger-startup-"))
    configs = {"untraced": None, "full": "full", "sampled": "sampled"}
    times = {name: [] for name in configs}
    report_times = []
    traces = 0
    try:
        for round_index in range(opts.repeat):
            names = list(configs)
            names = names[round_index % len(names):] + names[:round_index % len(names)]
            for name in names:
                if configs[name] is None:
                    times[name].append(timed(shell, env))
                    continue
                run_dir = work / ("%s-%d" % (name, round_index))
                times[name].append(timed([str(memledger), "run", "-q", "--no-report", "-o", str(run_dir),
                                          "--host", configs[name], "--", *shell], env))
                if name == "full":
                    traces = len([f for f in os.listdir(run_dir) if f.endswith(".mlt")])
                    start = time.perf_counter()
                    subprocess.run([str(memledger), "report", str(run_dir)], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, check=True)
                    report_times.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    processes = 2 * opts.iterations + 1
    base = statistics.median(times["untraced"])
    print("bash running /bin/true %d times (%d processes), median of %d runs" % (opts.iterations, processes,
                                                                                  opts.repeat))
    print("%-10s %10s %22s" % ("", "wall s", "extra ms per process"))
    for name in configs:
        t = statistics.median(times[name])
        extra = "" if name == "untraced" else "%.2f" % ((t - base) * 1000 / processes)
        print("%-10s %10.3f %22s" % (name, t, extra))
    r = statistics.median(report_times)
    print("report of a full-mode run: %.3f s for %d traces (%.1f ms per trace)" % (r, traces, r * 1000 / traces))


if __name__ == "__main__":
    main()
