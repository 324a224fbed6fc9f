"""SIGTERM while memledger's writer has work and no processor, as on a
machine short of processors: the handler's record of the signal is still
written (interposer/wait_budget.h). A busy loop holds one CPU, and the
writer, or the whole program, runs there at the idle scheduling class. Run
alone: the busy loop would slow the tests beside it."""

import json
import os
import signal
import subprocess
import sys
import time
import unittest

import mltest


# Holds one CPU; ends with the test that started it (or after 120 s), even
# when that test is killed.
BUSY_LOOP = """
import os, time
os.sched_setaffinity(0, {%d})
parent, end = os.getppid(), time.monotonic() + 120
while os.getppid() == parent and time.monotonic() < end:
    for _ in range(100000):
        pass
"""


class StarvedWriter(mltest.TestCase):
    """The handler waits for the writer while it is ready to run (up to its
    wall-clock limit) instead of giving up after 500 ms and losing the
    signal's record (tests/programs/signals term-in-loader)."""

    RUNS = 4

    def setUp(self):
        if not hasattr(os, "SCHED_IDLE"):
            self.skipTest("no SCHED_IDLE here")
        self.cpus = sorted(os.sched_getaffinity(0))
        self.hog_cpu = self.cpus[0]
        hog = subprocess.Popen([sys.executable, "-c", BUSY_LOOP % self.hog_cpu])
        self.addCleanup(hog.wait)
        self.addCleanup(hog.kill)

    def starve(self, pid_or_tid):
        os.sched_setaffinity(pid_or_tid, {self.hog_cpu})
        os.sched_setscheduler(pid_or_tid, os.SCHED_IDLE, os.sched_param(0))

    def starve_writer(self, pid):
        """Moves the writer thread of process `pid` to the busy CPU; how many
        it found (the thread names itself when it starts: a few tries)."""
        for _ in range(200):
            found = 0
            for tid in os.listdir("/proc/%d/task" % pid):
                try:
                    with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                        if f.read().strip() == "memledger":
                            self.starve(int(tid))
                            found += 1
                except (FileNotFoundError, ProcessLookupError):
                    pass
            if found:
                return found
            time.sleep(0.001)
        return 0

    def check_recorded(self, run_dir, returncode, describe):
        self.assertEqual(returncode, -signal.SIGTERM, describe)
        report = self.memledger("report", "--format", "json", run_dir)
        self.assertExit(report, 0)
        r = json.loads(report.stdout)
        self.assertEqual((r["verdict"]["kind"], r["verdict"].get("signal_name")), ("signal", "SIGTERM"),
                         r["verdict"]["summary"])
        self.assertEqual(len(r["steps"]), 3)

    def test_whole_program_starved(self):
        tmp = self.tmpdir()
        for i in range(self.RUNS):
            with self.subTest(run=i):
                run_dir = os.path.join(tmp, "run%d" % i)
                proc = subprocess.run([mltest.program("signals"), "term-in-loader"], capture_output=True, text=True,
                                      timeout=mltest.TIMEOUT, preexec_fn=lambda: self.starve(0),
                                      env=mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR=run_dir))
                self.check_recorded(run_dir, proc.returncode, self.describe(proc))

    def test_writer_alone_starved(self):
        # The program's thread runs free on the other CPUs; the writer is
        # moved to the busy one once the steps are done (the program then
        # holds the loader's lock for 50 ms before it raises SIGTERM).
        if len(self.cpus) < 2:
            self.skipTest("needs two CPUs")
        tmp = self.tmpdir()
        for i in range(self.RUNS):
            with self.subTest(run=i):
                run_dir = os.path.join(tmp, "run%d" % i)
                proc = subprocess.Popen([mltest.program("signals"), "term-in-loader"], stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True,
                                        preexec_fn=lambda: os.sched_setaffinity(0, set(self.cpus[1:])),
                                        env=mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR=run_dir))
                for line in proc.stdout:
                    if line.startswith("STEP_DONE 3"):
                        break
                starved = self.starve_writer(proc.pid)
                proc.stdout.read()
                proc.wait(timeout=mltest.TIMEOUT)
                self.assertEqual(starved, 1)
                self.check_recorded(run_dir, proc.returncode, "exit %s" % proc.returncode)


if __name__ == "__main__":
    mltest.main()
