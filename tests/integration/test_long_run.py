"""A very long run: the JSON report's size must not grow with the number of
steps. A synthetic trace of 20 000 steps (two stacks leaking 4 KiB and 1 KiB
a step, written with tests/fuzz/make_corpus.py's record writers) gives a
report of at most 1000 step rows per process that says it was thinned, names
the steps it kept, and still judges every step: `memledger check` reads the
same growth and step count from the thinned report.json as from the trace."""

import json
import os
import re
import sys

import mltest

sys.path.insert(0, str(mltest.SOURCE_DIR / "tests" / "fuzz"))
import make_corpus as mc  # noqa: E402

STEPS = 20000
STEPS_PER_FRAME = 4000
MAX_ROWS = 1000
# The whole JSON report (the root's fields appear twice: at the top and in
# processes[]): 1000 rows of about 300 bytes each, twice, and the rest. It
# was about 60 MB before rows were thinned.
MAX_REPORT_BYTES = 2 << 20
LEAKS = ((1, 0x401000, 4096), (2, 0x402000, 1024))  # stack id, its one frame, bytes per step


def stack_record(stack, ip):
    return b"\x03" + mc.varint(stack) + mc.varint(1) + mc.varint(mc.zz(ip))


def long_trace():
    """A header, then frames of STEPS_PER_FRAME steps; each frame's first
    record carries its sequence number, time and address whole (deltas start
    from 0 in every frame)."""
    out = bytearray(mc.header("long_run 20000"))
    seq = ts = addr = 0
    for index, first in enumerate(range(0, STEPS, STEPS_PER_FRAME)):
        payload = bytearray()
        if index == 0:
            for stack, ip, _ in LEAKS:
                payload += stack_record(stack, ip)
        last_seq = last_ts = last_addr = 0
        for k in range(first, first + STEPS_PER_FRAME):
            for stack, _, size in LEAKS:
                seq, ts, addr = seq + 1, ts + 1000, addr + 8192
                payload += mc.alloc(seq - last_seq, ts - last_ts, addr - last_addr, size, stack)
                last_seq, last_ts, last_addr = seq, ts, addr
            seq, ts = seq + 1, ts + 1000
            payload += mc.step(seq - last_seq, ts - last_ts, k + 1)
            last_seq, last_ts = seq, ts
        if first + STEPS_PER_FRAME >= STEPS:
            payload += mc.exit_record(0) + mc.end_record()
        out += mc.frame(index, bytes(payload))
    return bytes(out)


class LongRun(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        cls.trace = os.path.join(cls.tmp, "trace.4242.mlt")
        with open(cls.trace, "wb") as f:
            f.write(long_trace())
        proc = cls.memledger("report", "--format", "json", cls.trace)
        if proc.returncode != 0:
            raise AssertionError("memledger report: " + cls.describe(proc))
        cls.text = proc.stdout
        cls.report_json = os.path.join(cls.tmp, "report.json")
        with open(cls.report_json, "w") as f:
            f.write(cls.text)
        cls.report = json.loads(cls.text)

    def test_report_size_is_bounded_and_says_it_was_thinned(self):
        self.assertLess(len(self.text), MAX_REPORT_BYTES)
        r = self.report
        self.assertEqual(r["step_rows"]["steps"], STEPS)
        self.assertTrue(r["step_rows"]["thinned"])
        self.assertEqual(r["step_rows"]["limit"], MAX_ROWS)
        rows = r["step_rows"]["rows"]
        self.assertLessEqual(rows, MAX_ROWS)
        self.assertGreater(rows, MAX_ROWS * 9 // 10)
        positions = r["step_rows"]["positions"]
        self.assertEqual(len(positions), rows)
        self.assertEqual(positions, sorted(set(positions)))
        self.assertEqual((positions[0], positions[-1]), (1, STEPS))
        self.assertEqual(len(r["steps"]), rows)
        # Each row is the step it names (steps are numbered from 1 here).
        self.assertEqual([s["index"] for s in r["steps"]], positions)
        for s, at in zip(r["steps"][:50], positions):
            self.assertEqual(s["live"]["host"], at * (4096 + 1024))
        note = [n for n in r["notes"] if "of their rows" in n]
        self.assertEqual(len(note), 1, r["notes"])
        self.assertTrue(note[0].startswith("20000 steps: the JSON report holds %d of their rows (at most 1000" % rows),
                        note[0])
        self.assertEqual(r["processes"][0]["step_rows"], r["step_rows"])

    def test_figures_are_over_every_step(self):
        r = self.report
        # The two sites may be one row (their stacks name no line of code),
        # each stack a variant; every series is at the rows' steps.
        stacks = []
        for row in r["leak_suspects"]:
            self.assertEqual(len(row["series"]), r["step_rows"]["rows"])
            self.assertEqual(row["series"][-1], row["live_at_end"])
            for v in row.get("variants", [row]):
                self.assertEqual(len(v["series"]), r["step_rows"]["rows"])
                self.assertEqual(v["series"][-1], STEPS * v["bytes_per_step"])
                stacks.append(v["bytes_per_step"])
        self.assertEqual(sorted(stacks), [1024, 4096])
        self.assertAlmostEqual(r["growth_per_step"]["bytes_per_step"], 5120, delta=1)
        self.assertEqual(r["growth_per_step"]["last_step"], STEPS)

    def test_check_reads_the_thinned_report_as_the_trace(self):
        args = ("--max-growth-per-step", "4KiB", "--min-steps", str(STEPS), "--max-held", "1TiB")
        lines = {}
        for source in (self.trace, self.report_json):
            proc = self.memledger("check", source, *args)
            self.assertExit(proc, 1)
            lines[source] = [re.sub(r"^memledger check: [^:]*:", "", line) for line in proc.stdout.splitlines()]
            self.assertIn("ok   steps recorded: 20000 >= limit 20000", proc.stdout)
            self.assertIn("FAIL growth per step (total): 5.00 KiB/step > limit 4.00 KiB/step", proc.stdout)
        self.assertEqual(lines[self.trace], lines[self.report_json])

    def test_damaged_positions_are_refused(self):
        r = json.loads(self.text)
        r["processes"] = [r["processes"][0]]
        r["processes"][0]["step_rows"]["positions"][5] = 1
        path = os.path.join(self.tmpdir(), "report.json")
        with open(path, "w") as f:
            json.dump(r, f)
        proc = self.memledger("check", path, "--max-growth-per-step", "4KiB")
        self.assertExit(proc, 2)
        self.assertIn("step_rows.positions is not a rising list of steps", proc.stderr)


if __name__ == "__main__":
    mltest.main()
