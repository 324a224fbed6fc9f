"""A planted leak in --host full mode is found exactly, and a clean run shows
no suspect (tests/programs/leak_steps)."""

import json
import os
import re

import mltest

STEPS = 40
LEAK = 4096


class PlantedLeakFullMode(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        tmp = cls.class_tmpdir()
        cls.run_dir = os.path.join(tmp, "leak")
        cls.proc = cls.traced(cls.run_dir, [mltest.program("leak_steps"), STEPS, LEAK])
        cls.out = mltest.parse_kv(cls.proc.stdout)
        cls.report = cls.load_report(cls.run_dir) if cls.proc.returncode == 0 else None
        cls.line = int(cls.out.get("LEAK_LINE", "0"))
        cls.site = ("plant_leak", "leak_steps.cpp", cls.line)  # as mltest.site_parts() gives it
        # The site as the text report prints it (the function may be printed
        # qualified and with its parameters).
        cls.site_text = re.compile(r"\bplant_leak\b[^\n]* at leak_steps\.cpp:%d\n" % cls.line)

    def setUp(self):
        self.assertExit(self.proc, 0)

    def test_program_ran_traced_and_unchanged(self):
        self.assertEqual(self.out["TRACED"], "1")
        self.assertIn("DONE steps=%d leaked=%d " % (STEPS, STEPS * LEAK), self.proc.stdout)
        self.assertEqual(self.proc.stdout.count("STEP_DONE"), STEPS)

    def test_leak_line_is_the_planted_malloc(self):
        source = (mltest.SOURCE_DIR / "tests" / "programs" / "leak_steps.cpp").read_text().splitlines()
        self.assertEqual(self.out["LEAK_FILE"], "leak_steps.cpp")
        self.assertIn("malloc", source[self.line - 1])
        self.assertIn("PLANTED LEAK", source[self.line - 1])

    def test_one_process_with_marker_steps(self):
        r = self.report
        self.assertEqual(r["schema_version"], 1)
        self.assertEqual(len(r["processes"]), 1)
        self.assertEqual(r["problems"], [])
        self.assertEqual(r["root_pid"], r["pid"])
        self.assertEqual(r["processes"][0]["pid"], r["pid"])
        self.assertEqual(r["host_mode"], "full")
        self.assertEqual(r["step_source"], "marker")
        self.assertEqual(len(r["steps"]), STEPS)
        self.assertEqual([s["index"] for s in r["steps"]], list(range(1, STEPS + 1)))
        self.assertEqual({s["label"] for s in r["steps"]}, {"train"})
        self.assertEqual({s["source"] for s in r["steps"]}, {"marker"})
        self.assertEqual(r["verdict"]["kind"], "exit")
        self.assertEqual(r["verdict"]["exit_code"], 0)
        self.assertEqual(r["stats"]["dropped"], 0)
        self.assertEqual(r["stats"]["unknown_frees"], 0)
        self.assertEqual(r["stats"]["double_allocations"], 0)
        self.assertFalse(r["stats"]["truncated"])
        self.assertEqual(r["stats"]["frames_damaged"], 0)

    def test_live_bytes_grow_by_exactly_the_leak(self):
        # Full mode counts requested bytes; the short-lived allocations are all
        # freed before each marker.
        live = [s["live"]["host"] for s in self.report["steps"]]
        self.assertEqual([b - a for a, b in zip(live, live[1:])], [LEAK] * (STEPS - 1))
        # Per step: 500 vectors + their holder + 500 tokens + the leak.
        self.assertEqual({(s["allocations"], s["frees"]) for s in self.report["steps"][1:]}, {(1002, 1001)})

    def test_top_suspect_is_the_planted_leak(self):
        suspects = self.report["leak_suspects"]
        self.assertEqual(len(suspects), 1, [s["site"] for s in suspects])
        top = suspects[0]
        self.assertEqual(mltest.site_parts(top["site"]), self.site, top["site"])
        self.assertEqual(top["kind"], "host")
        self.assertEqual(top["bytes_per_step"], LEAK)
        self.assertAlmostEqual(top["bytes_per_step_exact"], LEAK, delta=1e-6)
        self.assertEqual(top["allocations_per_step"], 1.0)
        self.assertEqual(top["first_step"], 1)
        self.assertEqual(top["monotonicity"], 1.0)
        self.assertAlmostEqual(top["r_squared"], 1.0, places=9)
        self.assertEqual(top["series"], [LEAK * k for k in range(1, STEPS + 1)])
        frames = [f for f in top["stack"] if mltest.function_base(f["function"]) == "plant_leak"]
        self.assertEqual(len(frames), 1, top["stack"])
        self.assertEqual(os.path.basename(frames[0]["file"]), "leak_steps.cpp")
        self.assertEqual(frames[0]["line"], self.line)
        self.assertEqual(os.path.basename(frames[0]["module"]), "leak_steps")
        self.assertIn("main", [mltest.function_base(f["function"]) for f in top["stack"]])

    def test_exit_leaks_hold_the_leak(self):
        # The first block was made before the first marker: a start-up allocation.
        exit_sites = [s for s in self.report["exit_leaks"]["sites"] if mltest.site_parts(s["site"]) == self.site]
        self.assertEqual(len(exit_sites), 1)
        self.assertEqual(exit_sites[0]["bytes"], LEAK * (STEPS - 1))
        self.assertEqual(exit_sites[0]["count"], STEPS - 1)
        self.assertEqual(self.report["exit_leaks"]["bytes"], LEAK * (STEPS - 1))
        startup = [s for s in self.report["startup_allocations"]["sites"]
                   if mltest.site_parts(s["site"]) == self.site]
        self.assertEqual([(s["bytes"], s["count"]) for s in startup], [(LEAK, 1)])

    def test_text_report_names_the_site(self):
        with open(os.path.join(self.run_dir, "report.txt")) as f:
            text = f.read()
        self.assertIn("growth leak suspects: 1", text)
        self.assertIn("(%d B/step), 1.0 allocations/step" % LEAK, text)
        self.assertRegex(text, self.site_text)
        self.assertIn("steps: %d (source: marker)" % STEPS, text)
        self.assertIn("clean exit (code 0)", text)

    def test_report_command_matches_the_run_report(self):
        proc = self.memledger("report", self.run_dir)
        self.assertExit(proc, 0)
        with open(os.path.join(self.run_dir, "report.txt")) as f:
            self.assertEqual(proc.stdout, f.read())
        out = os.path.join(self.tmpdir(), "r.json")
        proc = self.memledger("report", "--format", "json", "-o", out, self.run_dir)
        self.assertExit(proc, 0)
        with open(out) as f:
            again = json.load(f)
        self.assertEqual(again["leak_suspects"], self.report["leak_suspects"])
        self.assertEqual(again["steps"], self.report["steps"])
        # A single trace file gives the same analysis.
        trace = os.path.join(self.run_dir, "trace.%d.mlt" % self.report["pid"])
        proc = self.memledger("report", "--format", "json", trace)
        self.assertExit(proc, 0)
        single = json.loads(proc.stdout)
        self.assertEqual(mltest.site_parts(single["leak_suspects"][0]["site"]), self.site)
        self.assertEqual(single["leak_suspects"][0]["bytes_per_step"], LEAK)


class CleanControlRun(mltest.TestCase):
    def test_no_leak_no_suspect(self):
        run_dir = os.path.join(self.tmpdir(), "clean")
        proc = self.traced(run_dir, [mltest.program("leak_steps"), STEPS, 0])
        self.assertExit(proc, 0)
        r = self.load_report(run_dir)
        self.assertEqual(r["leak_suspects"], [])
        self.assertEqual(len(r["steps"]), STEPS)
        self.assertEqual(r["step_source"], "marker")
        live = {s["live"]["host"] for s in r["steps"]}
        self.assertEqual(len(live), 1, "live bytes change although nothing leaks: %s" % sorted(live))
        self.assertEqual(r["exit_leaks"]["bytes"], 0)
        self.assertEqual(r["verdict"]["kind"], "exit")
        with open(os.path.join(run_dir, "report.txt")) as f:
            text = f.read()
        self.assertIn("growth leak suspects: 0", text)
        self.assertNotIn("plant_leak", text)


if __name__ == "__main__":
    mltest.main()
