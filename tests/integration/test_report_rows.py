"""The rows people read: one row per line of the user's code. A Python line
that keeps a bytearray, a bytes object and a list each step allocates through
several native stacks below that one line; the report gives it one growth
suspect and one exit-leak row, with the figures summed, the number of stacks
merged and each stack kept under the row, and `memledger check` counts that
row once. The text report's stacks show the user's frames and fold each run
of library frames (the standard library's json, the interpreter, libc) into
one line; JSON, HTML and `--full-stacks` keep every frame."""

import re

import collections
import os
import sys
import textwrap

import mltest

PROGRAM = textwrap.dedent('''
    import ctypes, json, os

    libc = ctypes.CDLL(None)
    step = libc.memledger_step
    step.argtypes = [ctypes.c_char_p]
    kept = []
    DOC = json.dumps(list(range(2_000)))


    def grow(i):
        kept.append((bytearray(40_000), b"x" * (50_000 + i), list(range(6_000))))  # ROW_LINE
        kept.append(json.loads(DOC))  # STDLIB_LINE


    for i in range(12):
        grow(i)
        step(None)
    os._exit(0)  # everything kept is live at exit
''')
ROW_LINE = next(n for n, line in enumerate(PROGRAM.splitlines(), 1) if "ROW_LINE" in line)
ROW_SITE = "grow at rows.py:%d" % ROW_LINE
STDLIB_LINE = next(n for n, line in enumerate(PROGRAM.splitlines(), 1) if "STDLIB_LINE" in line)
STDLIB_SITE = "grow at rows.py:%d" % STDLIB_LINE


class ReportRows(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        cls.script = os.path.join(cls.tmp, "rows.py")
        with open(cls.script, "w") as f:
            f.write(PROGRAM)
        cls.run_dir = os.path.join(cls.tmp, "run")
        cls.proc = cls.traced(cls.run_dir, [sys.executable, cls.script])

    def setUp(self):
        self.assertExit(self.proc, 0)
        self.report = self.load_report(self.run_dir)

    def assertOneRowPerLine(self, rows, what):
        names = collections.Counter((r["kind"], r["site"]) for r in rows)
        self.assertEqual([n for n, c in names.items() if c > 1], [], what + ": a line in more than one row")

    def row(self, rows, site=ROW_SITE):
        # The heap's row: pymalloc's arenas mapped below the same line are a
        # row of the kind `mapped`.
        found = [r for r in rows if r["site"] == site and r["kind"] == "host"]
        self.assertEqual(len(found), 1, [r["site"] for r in rows])
        return found[0]

    def test_growth_suspects(self):
        suspects = self.report["leak_suspects"]
        self.assertOneRowPerLine(suspects, "growth suspects")
        row = self.row(suspects)
        # The bytearray, the bytes and the list: at least three native stacks.
        self.assertGreaterEqual(row["stacks_merged"], 3, row)
        variants = row["variants"]
        self.assertEqual(len(variants), row["stacks_merged"])
        self.assertTrue(all(v["site"] == ROW_SITE for v in variants))
        self.assertAlmostEqual(row["bytes_per_step_exact"], sum(v["bytes_per_step_exact"] for v in variants), delta=1)
        self.assertEqual(len({tuple((f["function"], f["address"]) for f in v["stack"]) for v in variants}), len(variants))
        # At least the bytearray's 40,000 B and the bytes' 50,000 B a step.
        self.assertGreaterEqual(row["bytes_per_step_exact"], 90_000, row)
        self.assertLessEqual(row["bytes_per_step_exact"], 150_000, row)
        # The row's own stack is its fastest-growing one.
        self.assertEqual(row["stack"], max(variants, key=lambda v: v["bytes_per_step_exact"])["stack"])
        self.assertEqual(len(row["series"]), len(self.report["steps"]))
        self.assertGreater(row["r_squared"], 0.95)

    def test_exit_leaks(self):
        sites = self.report["exit_leaks"]["sites"]
        self.assertOneRowPerLine(sites, "exit leaks")
        self.assertOneRowPerLine(self.report["startup_allocations"]["sites"], "start-up allocations")
        row = self.row(sites)
        self.assertGreaterEqual(row["stacks_merged"], 3, row)
        self.assertEqual(row["bytes"], sum(v["bytes"] for v in row["variants"]))
        self.assertEqual(row["count"], sum(v["count"] for v in row["variants"]))
        self.assertGreaterEqual(row["bytes"], 11 * 90_000)  # kept after the first step

    def test_text_and_html(self):
        with open(os.path.join(self.run_dir, "report.txt")) as f:
            text = f.read()
        growth = text[text.index("growth leak suspects:"):text.index("exit leaks")]
        if "\nwhat grew from" in growth:  # the growth view's rows follow the suspects
            growth = growth[:growth.index("\nwhat grew from")]
        self.assertEqual(growth.count(ROW_SITE + "  ("), 1, growth)
        self.assertRegex(growth, r"%s  \(\d+ stacks merged; the largest below\)" % ROW_SITE)
        leaks = text[text.index("exit leaks"):text.index("one-off start-up")]
        self.assertEqual(leaks.count(ROW_SITE) - leaks.count("mappings at " + ROW_SITE), 1, leaks)
        self.assertRegex(leaks, r"at %s  \(\d+ stacks merged\)" % ROW_SITE)
        with open(os.path.join(self.run_dir, "report.html")) as f:
            html = f.read()
        self.assertRegex(html, r"<details class=\"variants\"><summary>\d+ stacks merged</summary>")

    def test_check_counts_rows(self):
        # Two lines grow: ROW_LINE and STDLIB_LINE.
        proc = self.memledger("check", self.run_dir, "--max-suspects", "2")
        self.assertExit(proc, 0)
        self.assertIn("growth suspects (total): 2 <= limit 2", proc.stdout)
        proc = self.memledger("check", self.run_dir, "--max-exit-leak", "100KiB")
        self.assertExit(proc, 1)
        self.assertIn("largest exit leak: %s" % ROW_SITE, proc.stdout)


    def suspect_text(self, text, site):
        """The lines of the text report's growth suspect named `site`: its
        heading and its stack."""
        growth = text[text.index("growth leak suspects:"):text.index("exit leaks")]
        if "\nwhat grew from" in growth:  # the growth view's rows follow the suspects
            growth = growth[:growth.index("\nwhat grew from")]
        blocks = re.split(r"\n  #\d+ ", growth)
        found = [b for b in blocks if "\n     %s" % site in b]
        self.assertEqual(len(found), 1, growth)
        return [line for line in found[0].splitlines() if line.strip()]

    def test_text_stacks_fold_library_frames(self):
        with open(os.path.join(self.run_dir, "report.txt")) as f:
            lines = [l.strip() for l in self.suspect_text(f.read(), STDLIB_SITE)[2:]]
        # The suspect's role (and why) come before its stack.
        lines = [l for l in lines if not l.startswith(("role: ", "why: "))]
        row = self.row(self.report["leak_suspects"], STDLIB_SITE)
        stack = row["stack"]
        # The JSON keeps every frame: json's three, the program's two, the interpreter's.
        self.assertEqual([f["function"] for f in stack[:3]], ["JSONDecoder.raw_decode", "JSONDecoder.decode", "loads"])
        self.assertTrue(any(f["function"] == "_PyEval_EvalFrameDefault" for f in stack), stack)
        # The text: json's frames folded, the program's lines, the interpreter and libc folded.
        self.assertEqual(lines[0], "\u2026 3 frames in the Python standard library \u2026", lines)
        self.assertRegex(lines[1], r"^grow  .*rows\.py:%d$" % STDLIB_LINE)
        self.assertRegex(lines[2], r"^<module>  .*rows\.py:\d+$")
        self.assertRegex(lines[3], r"^\u2026 \d+ frames in python3\.\d+.*, libc \u2026$")
        self.assertLess(len(lines), len(stack))
        self.assertNotIn("_PyEval_EvalFrameDefault", "\n".join(lines))
        # --full-stacks and the HTML page show every frame.
        proc = self.memledger("report", self.run_dir, "--full-stacks")
        self.assertExit(proc, 0)
        full = [l for l in self.suspect_text(proc.stdout, STDLIB_SITE)[2:]
                if not l.strip().startswith(("role: ", "why: "))]
        self.assertEqual(len(full), len(stack))
        self.assertNotIn("\u2026", "\n".join(full))
        with open(os.path.join(self.run_dir, "report.html")) as f:
            self.assertIn("_PyEval_EvalFrameDefault", f.read())


if __name__ == "__main__":
    mltest.main()
