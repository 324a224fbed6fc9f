"""The growth view: what grew between two step ends, by site, with no
start-up in it. A marked program leaking 8 KiB a step in full mode: the
default window (the end of the warm-up to the last step) and a chosen one
(--growth-window A:B) give exact bytes and counts in JSON and in the folded
export (--at growth); malformed or empty windows are one-line usage errors,
and a window past a process's steps is said, not drawn."""

import json
import os

import mltest

STEPS = 12
LEAK = 8192


class GrowthView(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.run_dir = os.path.join(cls.class_tmpdir(), "run")
        proc = cls.traced(cls.run_dir, [mltest.program("leak_steps"), str(STEPS), str(LEAK)])
        assert proc.returncode == 0, cls.describe(proc)

    def view(self, *options):
        proc = self.memledger("report", self.run_dir, "--format", "json", *options)
        self.assertExit(proc, 0)
        return json.loads(proc.stdout)["growth_view"]

    def test_default_window(self):
        g = self.view()
        warmup = json.loads(self.memledger("report", self.run_dir, "--format", "json").stdout)["warmup_steps"]
        self.assertEqual((g["from_step"], g["to_step"]), (max(1, warmup), STEPS))
        self.assertEqual(g["note"], "")
        self.assertFalse(g["estimated"])
        self.assertEqual(len(g["sites"]), 1, [s["site"] for s in g["sites"]])
        site = g["sites"][0]
        self.assertEqual(mltest.site_parts(site["site"])[1:], ("leak_steps.cpp", 49))
        self.assertEqual(site["bytes"], (STEPS - g["from_step"]) * LEAK)
        self.assertEqual(site["count"], STEPS - g["from_step"])
        self.assertEqual(g["bytes"], site["bytes"])

    def test_chosen_window(self):
        g = self.view("--growth-window", "3:8")
        self.assertEqual((g["from_step"], g["to_step"]), (3, 8))
        self.assertEqual([(s["bytes"], s["count"]) for s in g["sites"]], [(5 * LEAK, 5)])

    def test_folded_export(self):
        proc = self.memledger("report", self.run_dir, "--format", "folded", "--at", "growth", "--growth-window", "2:10")
        self.assertExit(proc, 0)
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].startswith("[host];"), lines[0])
        self.assertIn("plant_leak", lines[0])
        self.assertTrue(lines[0].endswith(" %d" % (8 * LEAK)), lines[0])

    def test_window_past_the_steps(self):
        g = self.view("--growth-window", "4:99")
        self.assertEqual(g["sites"], [])
        self.assertEqual(g["note"], "steps 4 to 99 are not within its %d steps" % STEPS)

    def test_bad_windows(self):
        for window in ("5:5", "8:3", "0:4", "3", "x:3", "3:", ""):
            with self.subTest(window=window):
                proc = self.memledger("report", self.run_dir, "--growth-window", window)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                lines = proc.stderr.splitlines()
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertIn("--growth-window", lines[0])


if __name__ == "__main__":
    mltest.main()
