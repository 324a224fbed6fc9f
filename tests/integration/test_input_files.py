"""What `memledger check` and `memledger diff` read (a run folder, a trace, a
report JSON, a policy file, a baseline) when it is not a regular file: a FIFO
must not hang them, and a folder, a device or a file too large to parse is
refused with a message that names the path (exit 2), before any of it is
read."""

import os
import subprocess

import mltest

# Every refusal comes at once; a hang shows as subprocess.TimeoutExpired.
TIMEOUT = 20
LIMITS = ("--max-growth-per-step", "1MiB")


class InputFiles(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        cls.run_dir = os.path.join(cls.tmp, "run")
        proc = cls.traced(cls.run_dir, [mltest.program("leak_steps"), 5, 4096])
        if proc.returncode != 0:
            raise AssertionError("memledger run: " + cls.describe(proc))

    def refused(self, proc, command, *parts):
        self.assertNoCrash(proc)
        self.assertExit(proc, 2)
        self.assertTrue(proc.stderr.startswith("memledger: %s: " % command), proc.stderr)
        for part in parts:
            self.assertIn(part, proc.stderr)

    def fifo(self, *names):
        path = os.path.join(self.tmpdir(), *names)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkfifo(path)
        return path

    def test_fifo_as_the_run(self):
        fifo = self.fifo("report.json")
        proc = self.memledger("check", fifo, *LIMITS, timeout=TIMEOUT)
        self.refused(proc, "check", fifo + ": not a regular file (a FIFO); not read")
        # Not named .json: it is not sniffed either.
        fifo = self.fifo("run")
        proc = self.memledger("diff", self.run_dir, fifo, timeout=TIMEOUT)
        self.refused(proc, "diff", fifo + ": not a regular file (a FIFO); not read")
        proc = self.memledger("diff", fifo, self.run_dir, timeout=TIMEOUT)
        self.refused(proc, "diff", fifo + ": not a regular file (a FIFO)")

    def test_fifo_named_report_json_in_a_folder(self):
        fifo = self.fifo("run", "report.json")
        folder = os.path.dirname(fifo)
        proc = self.memledger("check", folder, *LIMITS, timeout=TIMEOUT)
        self.refused(proc, "check", "report.json: not a regular file (a FIFO); not read")
        proc = self.memledger("diff", folder, self.run_dir, timeout=TIMEOUT)
        self.refused(proc, "diff", "report.json: not a regular file (a FIFO); not read")

    def test_folder_named_report_json(self):
        folder = self.tmpdir()
        os.mkdir(os.path.join(folder, "report.json"))
        proc = self.memledger("check", folder, *LIMITS, timeout=TIMEOUT)
        self.refused(proc, "check", "report.json: not a regular file (a folder); not read")
        proc = self.memledger("diff", self.run_dir, os.path.join(folder, "report.json"), timeout=TIMEOUT)
        # A folder is read as a run folder: it has no traces and no report.json.
        self.refused(proc, "diff", "no traces (trace.*.mlt) and no report.json in this folder")
        empty = self.tmpdir()
        proc = self.memledger("check", empty, *LIMITS, timeout=TIMEOUT)
        self.refused(proc, "check", empty + ": no traces (trace.*.mlt) and no report.json in this folder")

    def test_device_as_the_run(self):
        proc = self.memledger("diff", "/dev/zero", self.run_dir, timeout=TIMEOUT)
        self.refused(proc, "diff", "/dev/zero: not a regular file (a device); not read")

    def test_huge_report_json_refused_before_it_is_read(self):
        path = os.path.join(self.tmpdir(), "report.json")
        with open(path, "wb") as f:
            f.write(b"{")
            f.truncate(300 << 20)  # sparse: takes no disk
        proc = self.memledger("check", path, *LIMITS, timeout=TIMEOUT)
        self.refused(proc, "check", path + ": larger than 268435456 bytes; not read")

    def test_fifo_as_policy_and_baseline(self):
        fifo = self.fifo("policy.toml")
        proc = self.memledger("check", self.run_dir, "--policy", fifo, timeout=TIMEOUT)
        self.refused(proc, "check", "--policy: cannot read '%s': not a regular file (a FIFO)" % fifo)
        folder = os.path.join(self.tmpdir(), "policy.yaml")
        os.mkdir(folder)
        proc = self.memledger("check", self.run_dir, "--policy", folder, timeout=TIMEOUT)
        self.refused(proc, "check", "--policy: cannot read '%s': not a regular file (a folder)" % folder)
        fifo = self.fifo("base.json")
        proc = self.memledger("check", self.run_dir, "--baseline", fifo, timeout=TIMEOUT)
        self.refused(proc, "check", "baseline (--baseline): " + fifo + ": not a regular file (a FIFO)")

    def test_regular_inputs_still_read(self):
        report = os.path.join(self.run_dir, "report.json")
        proc = self.memledger("check", report, *LIMITS, timeout=mltest.TIMEOUT)
        self.assertExit(proc, 0)
        self.assertIn("memledger check: passed", proc.stdout)
        proc = self.memledger("diff", report, self.run_dir, timeout=mltest.TIMEOUT)
        self.assertExit(proc, 0)

    def test_full_disk_behind_stdout(self):
        for args in (["check", self.run_dir, *LIMITS], ["diff", self.run_dir, self.run_dir]):
            with open("/dev/full", "w") as full:
                proc = subprocess.run([mltest.MEMLEDGER, *args], stdout=full, stderr=subprocess.PIPE, text=True,
                                      env=mltest.clean_env(), timeout=mltest.TIMEOUT)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn("No space left on device", proc.stderr)


if __name__ == "__main__":
    mltest.main()
