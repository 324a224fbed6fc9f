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

    def test_python_stacks_while_the_writer_is_starved(self):
        # In full mode a thread leaves its new stacks with Python frames to
        # the writer (interposer/stack_spill.h). With the writer starved, the
        # thread's buffer of them fills: the thread waits for room, gives up
        # once the writer makes none for a millisecond, and interns the
        # stacks itself. The program must end as fast as the ring's own
        # waits allow, every allocation with its stack: the same (bytes,
        # stack) pairs as a run where the thread interns every stack.
        if len(self.cpus) < 2:
            self.skipTest("needs two CPUs")
        program = os.path.join(self.tmpdir(), "stacks.py")
        with open(program, "w") as f:
            f.write(NEW_STACKS)
        seen = {}
        for value in ("0", "1"):
            run_dir = os.path.join(self.tmpdir(), "run")
            env = mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR=run_dir, MEMLEDGER_HOST="full",
                                   MEMLEDGER_WRITER_STACKS=value, PYTHONHASHSEED="0")
            proc = subprocess.Popen(["/usr/bin/python3", program], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=env,
                                    preexec_fn=lambda: os.sched_setaffinity(0, set(self.cpus[1:])))
            try:
                self.assertEqual(proc.stdout.readline(), "READY\n")
                if value == "1":
                    self.assertEqual(self.starve_writer(proc.pid), 1)
                out, _ = proc.communicate("go\n", timeout=mltest.TIMEOUT)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            self.assertEqual((proc.returncode, out), (0, "done 3000\n"))
            trace = [f for f in os.listdir(run_dir) if f.startswith("trace.")]
            self.assertEqual(len(trace), 1)
            seen[value] = mltest.allocation_stacks(os.path.join(run_dir, trace[0]))
        mine, writers = seen["0"], seen["1"]
        total = sum(writers.values())
        planted = sum(n for (size, stack), n in writers.items() if stack and stack[0].startswith("py:")
                      and 1000 <= int(size) < 1100)
        self.assertGreaterEqual(planted, 3000)
        differ = sum((mine - writers).values()) + sum((writers - mine).values())
        self.assertLess(differ, total // 100, "allocations whose stack differs: %d of %d" % (differ, total))


# 3,000 stacks with Python frames, each new (50 lines at 60 depths), of about
# 70 words: three times what a thread's buffer holds. The program waits for
# a line on stdin before them, while the test starves the writer.
NEW_STACKS = """
import sys
kept = []
exec("def leaf(k):\\n" + "\\n".join("    if k == %d: kept.append(bytearray(%d))" % (k, 1000 + k)
                                      for k in range(50)), globals())


def down(n, k):
    return down(n - 1, k) if n else leaf(k)


print("READY", flush=True)
sys.stdin.readline()
made = 0
for depth in range(0, 120, 2):
    for k in range(50):
        down(depth, k)
        made += 1
    del kept[:]
print("done", made, flush=True)
"""


if __name__ == "__main__":
    mltest.main()
