"""A full disk (a 400 KiB tmpfs) in `--host full` mode: the program runs
unchanged and its exit code comes through; the tracer stops with one message
and keeps what reached the disk readable; the verdict is the exit status
waitpid saw; a report that cannot be written is said to be missing, never
announced, and no empty report files are left. Skipped, with the reason,
where a tmpfs cannot be mounted (needs root)."""

import os
import subprocess

import mltest

STEPS = 400


class DiskFull(mltest.TestCase):
    def setUp(self):
        self.mount = self.tmpdir()
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k,mode=0700", "tmpfs", self.mount],
                           check=True, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.CalledProcessError) as e:
            self.skipTest("cannot mount a small tmpfs for the full disk (%s)"
                          % (getattr(e, "stderr", "") or e).strip())
        self.addCleanup(subprocess.run, ["umount", "-l", self.mount], capture_output=True, timeout=20)

    def test_full_disk(self):
        run_dir = os.path.join(self.mount, "run")
        command = [mltest.program("leak_steps"), str(STEPS), "4096", "--exit-code", "17"]
        direct = self.run_cmd(command)
        self.assertExit(direct, 17)
        proc = self.memledger("run", "-o", run_dir, "--host", "full", "--", *command)
        self.assertExit(proc, 17)
        self.assertIn("DONE steps=%d" % STEPS, proc.stdout)
        self.assertEqual(len(proc.stdout.splitlines()), len(direct.stdout.splitlines()))

        lines = mltest.memledger_lines(proc.stderr)
        stopped = [l for l in lines if "tracing stopped" in l]
        self.assertEqual(len(stopped), 1, proc.stderr)
        self.assertIn("No space left on device", stopped[0])
        # The verdict is waitpid's, not "stopped without warning".
        self.assertTrue(any("exited with code 17" in l for l in lines), proc.stderr)
        self.assertFalse(any("without warning" in l for l in lines), proc.stderr)
        names = set(os.listdir(run_dir))
        if any(l.startswith("memledger: report: ") for l in lines):
            # Announced: then every report file is whole.
            for name in ("report.txt", "report.json", "report.html"):
                self.assertGreater(os.path.getsize(os.path.join(run_dir, name)), 0, name)
            self.assertEqual(self.load_report(run_dir)["verdict"]["exit_code"], 17)
        else:
            self.assertTrue(any(l.startswith("memledger: no report written: cannot write ") for l in lines),
                            proc.stderr)
            self.assertFalse(names & {"report.txt", "report.json", "report.html"}, names)

        # What reached the disk reads back whole, with the true exit status.
        r = mltest.json.loads(self.memledger("report", "--format", "json", run_dir).stdout)
        self.assertEqual((r["verdict"]["kind"], r["verdict"]["exit_code"]), ("exit", 17), r["verdict"]["summary"])
        self.assertEqual(r["stats"]["frames_damaged"], 0)
        self.assertFalse(r["stats"]["truncated"])
        self.assertGreater(len(r["steps"]), 0)
        self.assertLess(len(r["steps"]), STEPS)
        self.assertEqual(len([n for n in r["notes"] if "trace ends at" in n]), 1, r["notes"])


if __name__ == "__main__":
    mltest.main()
