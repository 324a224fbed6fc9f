"""Phases and sampled exit leaks. A program that builds a 64 MiB "model" at
start-up, frees it, then leaks small blocks in each of ten marked steps: the
peak is named "before the first step" (not "in step 1") in text, HTML and
JSON; in sampled host mode the exit leak's bytes are an estimate and say so,
with their ± (one standard deviation of the sampling model)."""

import os
import re
import sys
import textwrap

import mltest

PROGRAM = textwrap.dedent('''
    import ctypes, os, time

    libc = ctypes.CDLL(None)
    step = libc.memledger_step
    step.argtypes = [ctypes.c_char_p]

    model = bytearray(64 << 20)  # start-up: the peak
    time.sleep(0.3)
    del model
    kept = []
    for i in range(10):
        time.sleep(0.02)
        kept.extend(bytearray(2_000) for _ in range(400))  # LEAK_LINE
        step(None)
    os._exit(0)  # everything kept is live at exit
''')
LEAK_LINE = next(n for n, line in enumerate(PROGRAM.splitlines(), 1) if "LEAK_LINE" in line)


class ReportPhases(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        cls.script = os.path.join(cls.tmp, "phases.py")
        with open(cls.script, "w") as f:
            f.write(PROGRAM)
        cls.run_dir = os.path.join(cls.tmp, "run")
        cls.proc = cls.traced(cls.run_dir, [sys.executable, cls.script], options=("--host", "sampled"))

    def setUp(self):
        self.assertExit(self.proc, 0)
        self.report = self.load_report(self.run_dir)
        with open(os.path.join(self.run_dir, "report.txt")) as f:
            self.text = f.read()

    def test_peak_before_the_first_step(self):
        self.assertEqual(len(self.report["steps"]), 10)
        peak = self.report["peak"]
        # Every kind, as in full mode: the 64 MiB buffer and Python's own
        # arenas and code mappings.
        self.assertGreaterEqual(peak["bytes"], 64 << 20)
        self.assertLess(peak["bytes"], 80 << 20)
        self.assertEqual(peak["step"], 1)
        self.assertEqual(peak["phase"], "before the first step")
        self.assertRegex(self.text, r"peak live: [67]\d\.\d MiB before the first step\n")
        with open(os.path.join(self.run_dir, "report.html")) as f:
            html = f.read()
        self.assertIn("peak live, before the first step", html)
        self.assertIn("Live bytes at the peak (before the first step)", html)

    def test_sampled_exit_leak_is_estimated(self):
        leaks = self.report["exit_leaks"]
        row = [s for s in leaks["sites"] if s["site"] == "<genexpr> at phases.py:%d" % LEAK_LINE and s["kind"] == "host"]
        self.assertEqual(len(row), 1, [s["site"] for s in leaks["sites"]])
        row = row[0]
        self.assertTrue(row["estimated"])
        self.assertGreater(row["bytes_error"], 0)
        # 9 steps after the first of 400 blocks of 2,000 B (about 2,016 B each
        # as malloc_usable_size counts them), within four standard deviations.
        truth = 9 * 400 * 2_000
        self.assertLess(abs(row["bytes"] - truth), 4 * row["bytes_error"] + 0.05 * truth, row)
        self.assertLess(row["bytes_error"], 0.5 * truth)
        # The total's deviation takes in every site's variance, summed in
        # another order than the row's: equal to the last bits when the row
        # is all there is.
        self.assertGreaterEqual(leaks["bytes_error"], row["bytes_error"] * (1 - 1e-12))
        header = re.search(r"exit leaks \(live at exit, allocated after the first step\): (.*)\n", self.text).group(1)
        self.assertRegex(header, r"^[\d.]+ ± [\d.]+ [KM]iB estimated in about \d+ allocations")
        self.assertRegex(self.text, r"\n  [\d.]+ ± [\d.]+ [KM]iB estimated in about \d+ at <genexpr> at phases\.py:%d" % LEAK_LINE)


if __name__ == "__main__":
    mltest.main()
