"""SIGKILL in full mode under load: four threads allocate without pause while
the machine's cores are busy with other work, and the main thread ends a step
every 20 ms (tests/programs/busy_steps). After each kill, every step that
ended more than 100 ms before it is in the report (DESIGN.md: the writer
flushes at every step marker, also when it is behind)."""

import glob
import os
import signal
import subprocess
import time

import mltest

GRACE_NS = 100_000_000
KILLS = 6


class KilledUnderLoad(mltest.TestCase):
    def burn(self):
        """One busy process per core, for the length of the test."""
        burners = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 2)]

        def stop():
            for b in burners:
                b.kill()
                b.wait()
        self.addCleanup(stop)

    def kill_one(self, run_dir):
        proc = subprocess.Popen(
            [mltest.MEMLEDGER, "run", "-q", "-o", run_dir, "--host", "full", "--",
             mltest.program("busy_steps"), "4", "20"],
            env=mltest.clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
        try:
            traced_pid = None
            deadline = time.monotonic() + 20
            while traced_pid is None and time.monotonic() < deadline:
                traces = glob.glob(os.path.join(run_dir, "trace.*.mlt"))
                if traces:
                    traced_pid = int(os.path.basename(traces[0]).split(".")[1])
                else:
                    time.sleep(0.01)
            self.assertIsNotNone(traced_pid, "no trace appeared in %s" % run_dir)
            time.sleep(1.2)
            kill_ns = time.monotonic_ns()
            os.kill(traced_pid, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=mltest.TIMEOUT)
        finally:
            if proc.poll() is None:
                mltest.kill_session(proc.pid)
                proc.communicate()
        self.assertEqual(proc.returncode, 128 + signal.SIGKILL, stderr)
        done = [tuple(map(int, line.split()[1:3])) for line in stdout.splitlines() if line.startswith("STEP_DONE ")]
        old_enough = [i for i, t in done if t < kill_ns - GRACE_NS]
        reported = len(self.load_report(run_dir)["steps"])
        newest_ms = (kill_ns - max((t for i, t in done if i <= reported), default=kill_ns)) / 1e6
        return (max(old_enough) if old_enough else 0), reported, newest_ms

    def test_steps_survive_sigkill_under_load(self):
        self.burn()
        results = [self.kill_one(os.path.join(self.tmpdir(), "killed")) for _ in range(KILLS)]
        summary = ", ".join("%d/%d (newest %.0f ms old)" % (r, w, age) for w, r, age in results)
        print("\nreported/wanted steps per kill: " + summary)
        self.assertTrue(all(w > 0 for w, _, _ in results), "no step older than 100 ms: " + summary)
        missing = [(w, r) for w, r, _ in results if r < w]
        self.assertEqual(missing, [], "reported/wanted steps per kill: " + summary)


if __name__ == "__main__":
    mltest.main()
