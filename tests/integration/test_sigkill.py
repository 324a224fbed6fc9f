"""SIGKILL in the middle of a run: memledger exits 137, the report says the
process was killed, and every step that ended more than 100 ms before the
kill is in the report (the writer flushes at least every 50 ms)."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import mltest

GRACE_NS = 100_000_000  # DESIGN.md: steps older than 100 ms survive a SIGKILL
LEAK = 4096


class KilledMidRun(mltest.TestCase):
    def test_sigkill(self):
        run_dir = os.path.join(self.tmpdir(), "killed")
        proc = subprocess.Popen(
            [mltest.MEMLEDGER, "run", "-q", "-o", run_dir, "--host", "full", "--",
             mltest.program("leak_steps"), "100000", str(LEAK), "--sleep-ms", "50"],
            env=mltest.clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
        try:
            # The traced process is memledger's child; its pid names its trace.
            traced_pid = None
            deadline = time.monotonic() + 20
            while traced_pid is None and time.monotonic() < deadline:
                traces = glob.glob(os.path.join(run_dir, "trace.*.mlt"))
                if traces:
                    traced_pid = int(os.path.basename(traces[0]).split(".")[1])
                else:
                    time.sleep(0.01)
            self.assertIsNotNone(traced_pid, "no trace appeared in %s" % run_dir)
            self.assertNotEqual(traced_pid, proc.pid)
            time.sleep(1.5)
            kill_ns = time.monotonic_ns()
            os.kill(traced_pid, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=mltest.TIMEOUT)
        finally:
            if proc.poll() is None:
                mltest.kill_session(proc.pid)
                proc.communicate()
        self.assertEqual(proc.returncode, 128 + signal.SIGKILL, stderr)

        # STEP_DONE i t_ns: step i's marker was called before t_ns (CLOCK_MONOTONIC,
        # the clock of time.monotonic_ns()).
        done = [tuple(map(int, line.split()[1:3])) for line in stdout.splitlines() if line.startswith("STEP_DONE ")]
        old_enough = [i for i, t in done if t < kill_ns - GRACE_NS]
        self.assertGreaterEqual(len(old_enough), 10, "the program made too little progress before the kill")

        r = self.load_report(run_dir)
        self.assertEqual(r["pid"], traced_pid)
        v = r["verdict"]
        self.assertIn(v["kind"], ("killed", "host_oom_kill"), v["summary"])
        self.assertEqual(v["signal"], signal.SIGKILL)
        self.assertEqual(v["signal_name"], "SIGKILL")
        steps = r["steps"]
        self.assertEqual([s["index"] for s in steps], list(range(1, len(steps) + 1)))
        self.assertGreaterEqual(len(steps), max(old_enough),
                                "steps up to %d ended more than 100 ms before the kill; the report has %d"
                                % (max(old_enough), len(steps)))
        # A marker may have been recorded just before the kill, before its STEP_DONE line.
        self.assertLessEqual(len(steps), len(done) + 1)
        live = [s["live"]["host"] for s in steps]
        self.assertEqual({b - a for a, b in zip(live, live[1:])}, {LEAK})
        # The frames up to the kill are intact; only the tail may be torn.
        self.assertEqual(r["stats"]["frames_damaged"], 0)

    def test_killed_python_report_is_whole(self):
        # A Python process killed in full mode: everything it made is still
        # live, here 2,000 sites 30 Python calls deep, from a trace of about
        # 135 KB that keeps them as a tree of shared frames. Their frames are
        # all shown: the bound on the frames kept against a trace's size is
        # for traces damaged or made up.
        script = os.path.join(self.tmpdir(), "deep.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""
                import os, signal
                keep = []
                def a(d, k): return step(d, k)
                def b(d, k): return step(d, k)
                def c(d, k): return step(d, k)
                fns = [a, b, c]
                def step(d, k):
                    if d == 0:
                        keep.append(bytearray(1000))  # past the small-object allocator: malloc
                        return
                    return fns[k % 3](d - 1, k // 3)
                for k in range(2000):
                    step(30, k)
                os.kill(os.getpid(), signal.SIGKILL)
            """))
        run_dir = os.path.join(self.tmpdir(), "python")
        proc = self.traced(run_dir, [sys.executable, script])
        self.assertExit(proc, 128 + signal.SIGKILL)
        r = self.load_report(run_dir)
        self.assertEqual([n for n in r["notes"] if "only some of their frames" in n], [], r["notes"])
        sites = r["exit_leaks"]["sites"]
        self.assertTrue(sites)
        self.assertTrue(all(s["stack"] for s in sites), [s for s in sites if not s["stack"]][:2])


if __name__ == "__main__":
    mltest.main()
