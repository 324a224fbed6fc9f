"""`memledger check` and `memledger diff` on real runs: a leaking and a clean
program on the host (tests/programs/leak_steps) and on the simulated GPU
(tests/sim_cuda), a Python program whose memory plateaus after a warm-up under
allocator noise, baselines at 10% and 1% more growth, the CI outputs (JUnit
XML validated against the schema Jenkins reads, tests/data/junit-10.xsd; the
JSON verdict; Markdown), policy files, and bad input (exit 2, naming the key
or value)."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import unittest
import xml.etree.ElementTree as ET

import mltest
from mltest import BUILD_DIR, SOURCE_DIR, clean_env, parse_kv

JUNIT_XSD = SOURCE_DIR / "tests" / "data" / "junit-10.xsd"
SIM_DIR = BUILD_DIR / "tests" / "sim_cuda"
SIM_DRIVER_DIR = SIM_DIR / "driver"
HAVE_SIM = (SIM_DRIVER_DIR / "libcuda.so.1").exists()

STEPS = 30
BASE_LEAK = 1 << 20  # per step, for the baseline runs

# A training loop in Python: a cache fills 1 MiB a step for 10 steps and then
# stays, a rotating set of buffers of random size (0-256 KiB each) stands for
# an allocator's noise at step ends, and LEAK_BYTES more stay alive each step.
PLATEAU_PROGRAM = textwrap.dedent('''
    import ctypes, random, sys

    steps, leak_bytes = int(sys.argv[1]), int(sys.argv[2])
    try:
        step = ctypes.CDLL(None).memledger_step
    except AttributeError:
        step = None
    rng = random.Random(7)
    cache, pool, leaked = [], [None] * 8, []
    for i in range(steps):
        batch = [bytearray(rng.randint(1000, 200000)) for _ in range(20)]
        if i < 10:
            cache.append(bytearray(1 << 20))
        pool[i % 8] = bytearray(rng.randint(0, 256 << 10))
        if leak_bytes:
            leaked.append(bytearray(leak_bytes))  # PLANTED LEAK
        del batch
        if step:
            step(b"train")
    print("DONE", steps)
''')


def sim_env():
    return clean_env(LD_LIBRARY_PATH=str(SIM_DRIVER_DIR), SIMCUDA_DEVICES="2", SIMCUDA_MEMORY_MB="512")


def xmllint_validate(path):
    """(ok, messages) of `xmllint --schema junit-10.xsd PATH`."""
    xmllint = shutil.which("xmllint")
    if xmllint is None:
        raise AssertionError("xmllint is missing (Debian libxml2-utils; scripts/install-deps.sh installs it)")
    proc = subprocess.run([xmllint, "--noout", "--schema", str(JUNIT_XSD), str(path)],
                          capture_output=True, text=True, timeout=mltest.TIMEOUT)
    return proc.returncode == 0, proc.stderr


class Check(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        cls.runs = {}
        cls.outputs = {}
        leak_steps = mltest.program("leak_steps")
        cls.record("host_leak", [leak_steps, STEPS, 65536])
        cls.record("host_clean", [leak_steps, STEPS, 0])
        cls.record("base", [leak_steps, STEPS, BASE_LEAK, "--no-work"])
        cls.record("up10", [leak_steps, STEPS, BASE_LEAK * 110 // 100, "--no-work"])
        cls.record("up1", [leak_steps, STEPS, BASE_LEAK * 101 // 100, "--no-work"])
        script = os.path.join(cls.tmp, "plateau.py")
        with open(script, "w") as f:
            f.write(PLATEAU_PROGRAM)
        cls.record("py_plateau", [sys.executable, script, STEPS, 0])
        cls.record("py_leak", [sys.executable, script, STEPS, 256 << 10])
        if HAVE_SIM:
            program = str(SIM_DIR / "programs" / "cuda_runtime_dynamic")
            for name, leak, mode, code in [("dev_leak", 3 << 20, "normal", 0), ("dev_clean", 0, "normal", 0),
                                           ("dev_oom", 3 << 20, "oom", 3)]:
                cls.record(name, [program, 12, leak, mode], options=("--host", "off"), env=sim_env(), code=code)

    @classmethod
    def record(cls, name, command, options=("--host", "full"), env=None, code=0):
        run_dir = os.path.join(cls.tmp, name)
        proc = cls.traced(run_dir, command, options=options, env=env)
        if proc.returncode != code:
            raise AssertionError("memledger run %s: %s" % (name, cls.describe(proc)))
        cls.runs[name] = run_dir
        cls.outputs[name] = parse_kv(proc.stdout)

    def check(self, name, *args, code=None):
        proc = self.memledger("check", self.runs.get(name, name), *args)
        self.assertNoCrash(proc)
        if code is not None:
            self.assertExit(proc, code)
        return proc

    def fail_lines(self, proc):
        return [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")]

    def leak_site(self, name):
        out = self.outputs[name]
        return "%s:%s" % (out["LEAK_FILE"], out["LEAK_LINE"])

    # -- a leaking and a clean program -------------------------------------------
    def test_host_leak_fails(self):
        proc = self.check("host_leak", "--max-growth-per-step", "16KiB", "--max-exit-leak", "512KiB",
                          "--max-peak", "64MiB", code=1)
        fails = self.fail_lines(proc)
        self.assertEqual(len(fails), 2, proc.stdout)
        growth, leak = fails
        self.assertRegex(growth, r"^FAIL growth per step \(total\): 64\.0 KiB/step > limit 16\.0 KiB/step "
                                 r"\(fit over steps 4-30, R² 1\.00\); top suspect: .*plant_leak.* at ")
        self.assertTrue(growth.endswith(self.leak_site("host_leak")), growth)
        # 29 steps of 64 KiB: the first step's block was allocated before the first marker.
        self.assertRegex(leak, r"^FAIL exit leak \(total\): 1\.81 MiB > limit 512 KiB; largest exit leak: .*plant_leak")
        self.assertIn("ok   peak live (total): ", proc.stdout)
        self.assertIn("memledger check: FAILED: 2 of 3 limits broken", proc.stdout)

    def test_host_clean_passes(self):
        proc = self.check("host_clean", "--max-growth-per-step", "16KiB", "--max-exit-leak", "512KiB",
                          "--max-peak", "64MiB", code=0)
        self.assertIn("ok   growth per step (total): 0 B/step <= limit 16.0 KiB/step", proc.stdout)
        self.assertIn("ok   exit leak (total): 0 B <= limit 512 KiB", proc.stdout)
        self.assertIn("memledger check: passed: all 3 limits hold", proc.stdout)

    def test_quiet_prints_broken_limits_only(self):
        proc = self.check("host_leak", "-q", "--max-growth-per-step", "16KiB", "--max-peak", "64MiB", code=1)
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), 2, proc.stdout)
        self.assertTrue(lines[0].startswith("FAIL growth per step"))
        self.assertEqual(self.check("host_clean", "-q", "--max-growth-per-step", "16KiB", code=0).stdout, "")

    @unittest.skipUnless(HAVE_SIM, "the simulated CUDA is not built (no CUDA 13 headers)")
    def test_device_leak_fails_and_clean_passes(self):
        limits = ("--max-growth-per-step", "device=1MiB", "--max-exit-leak", "device=1MiB", "--max-held", "device=1GiB")
        proc = self.check("dev_leak", *limits, code=1)
        fails = self.fail_lines(proc)
        self.assertEqual(len(fails), 2, proc.stdout)
        self.assertRegex(fails[0], r"^FAIL growth per step \(device\): 3\.00 MiB/step > limit 1\.00 MiB/step "
                                   r"\(fit over steps 2-12, R² 1\.00\); top suspect: .*plant_device_leak.* at ")
        self.assertTrue(fails[0].endswith(self.leak_site("dev_leak")), fails[0])
        self.assertRegex(fails[1], r"^FAIL exit leak \(device\): 33\.0 MiB > limit 1\.00 MiB; largest exit leak: "
                                   r".*plant_device_leak")
        clean = self.check("dev_clean", *limits, code=0)
        self.assertIn("ok   growth per step (device): 0 B/step <= limit 1.00 MiB/step", clean.stdout)

    @unittest.skipUnless(HAVE_SIM, "the simulated CUDA is not built (no CUDA 13 headers)")
    def test_device_oom_fails(self):
        proc = self.check("dev_oom", "--max-ooms", "0", code=1)
        out = self.outputs["dev_oom"]
        requested = int(out["OOM_REQUESTED"]) / (1 << 20)
        self.assertTrue(self.fail_lines(proc)[0].startswith(
            "FAIL OOM events: 1 > limit 0; first OOM: %g MiB requested on device 0 by main at " % requested),
            proc.stdout)
        self.check("dev_clean", "--max-ooms", "0", code=0)

    # -- noise handling ------------------------------------------------------------
    def test_plateau_and_noise_pass_a_leak_fails(self):
        proc = self.check("py_plateau", "--max-growth-per-step", "64KiB", code=0)
        self.assertRegex(proc.stdout, r"ok   growth per step \(total\): -?[0-9.]+ (B|KiB)/step <= limit 64\.0 KiB/step "
                                      r"\(fit over steps \d+-30, R² [0-9.]+, last half of the window\)")
        leak = self.check("py_leak", "--max-growth-per-step", "64KiB", code=1)
        line = self.fail_lines(leak)[0]
        figure = re.search(r"\): ([0-9.]+) KiB/step >", line)
        self.assertIsNotNone(figure, line)
        self.assertGreater(float(figure.group(1)), 192, line)  # 256 KiB/step planted, under noise
        self.assertLess(float(figure.group(1)), 320, line)

    # -- baselines -------------------------------------------------------------------
    def test_baseline_regression_at_10_percent_fails(self):
        proc = self.check("up10", "--baseline", self.runs["base"], "--tolerance", "5%", "--allow-different-command",
                          code=1)
        line = [l for l in self.fail_lines(proc) if "growth per step (total) vs baseline" in l]
        self.assertEqual(len(line), 1, proc.stdout)
        self.assertRegex(line[0], r"1\.10 MiB/step > limit 1\.05 MiB/step \(baseline 1\.00 MiB/step, \+10\.0%; "
                                  r"tolerance 5% \+ 4\.00 KiB/step; fit over steps 4-30")
        self.assertIn("top suspect: ", line[0])
        self.assertIn("baseline: %s" % self.runs["base"], proc.stdout)

    def test_baseline_change_of_1_percent_passes(self):
        # The baseline as its saved report JSON: read the same as its folder.
        proc = self.check("up1", "--baseline", os.path.join(self.runs["base"], "report.json"), "--tolerance", "5%",
                          "--allow-different-command", code=0)
        self.assertRegex(proc.stdout, r"ok   growth per step \(total\) vs baseline: 1\.01 MiB/step <= limit "
                                      r"1\.05 MiB/step \(baseline 1\.00 MiB/step, \+1\.0%")

    def test_baseline_from_another_command_line_is_refused(self):
        proc = self.check("up10", "--baseline", self.runs["base"], code=2)
        self.assertEqual(proc.stdout, "")
        self.assertIn("memledger: check: the baseline ran another command: argument 2 is '%d' here and '%d' in the "
                      "baseline" % (BASE_LEAK * 110 // 100, BASE_LEAK), proc.stderr)

    def test_baseline_from_a_policy_file(self):
        policy = os.path.join(self.tmpdir(), "ci.toml")
        with open(policy, "w") as f:
            f.write('baseline = "%s"\ntolerance = "5%%"\nallow_different_command = true\n' % self.runs["base"])
        proc = self.check("up10", "--policy", policy, code=1)
        self.assertIn("growth per step (total) vs baseline", proc.stdout)
        self.check("up1", "--policy", policy, code=0)

    # -- outputs for CI systems ----------------------------------------------------------
    def test_junit_validates_against_the_jenkins_schema(self):
        d = self.tmpdir()
        junit, verdict, markdown = (os.path.join(d, n) for n in ("junit.xml", "verdict.json", "summary.md"))
        proc = self.check("host_leak", "--max-growth-per-step", "16KiB", "--max-exit-leak", "512KiB",
                          "--max-peak", "64MiB", "--junit", junit, "--json", verdict, "--markdown", markdown, code=1)
        ok, messages = xmllint_validate(junit)
        self.assertTrue(ok, messages)
        suite = ET.parse(junit).getroot().find("testsuite")
        self.assertEqual(suite.get("tests"), "3")
        self.assertEqual(suite.get("failures"), "2")
        cases = suite.findall("testcase")
        self.assertEqual([c.get("name") for c in cases],
                         ["growth per step (total)", "peak live (total)", "exit leak (total)"])
        failure = cases[0].find("failure")
        self.assertTrue(failure.get("message").startswith("64.0 KiB/step > limit 16.0 KiB/step"), failure.get("message"))
        self.assertIn(self.leak_site("host_leak"), failure.get("message"))
        self.assertIsNone(cases[1].find("failure"))
        self.assertEqual(suite.find("system-out").text, proc.stdout)

        with open(verdict) as f:
            v = json.load(f)
        self.assertEqual((v["schema"], v["passed"], v["exit_code"], v["failures"]), ("memledger-check", False, 1, 2))
        growth = v["checks"][0]
        self.assertEqual((growth["id"], growth["figure"], growth["limit"]), ("growth_per_step.total", 65536, 16384))
        self.assertEqual(growth["fit"]["first_step"], 4)
        self.assertTrue(growth["site"]["name"].endswith(self.leak_site("host_leak")))

        with open(markdown) as f:
            md = f.read()
        self.assertTrue(md.startswith("### memledger check: failed\n"), md)
        self.assertRegex(md, r"\| \*\*FAIL\*\* \| growth per step \(total\) \| 64\.0 KiB/step \| 16\.0 KiB/step \| "
                             r"top suspect `.*plant_leak.*`")
        self.assertIn("| pass | peak live (total) |", md)

    def test_the_schema_check_rejects_invalid_junit(self):
        # The validator itself: JUnit XML that CI systems would reject must fail it.
        d = self.tmpdir()
        junit = os.path.join(d, "junit.xml")
        self.check("host_leak", "--max-growth-per-step", "16KiB", "--junit", junit, code=1)
        with open(junit) as f:
            good = f.read()
        for broken in (good.replace('<testcase name="growth per step (total)"', "<testcase"),  # name is required
                       good.replace(' tests="1" failures="1" errors="0" skipped', " skipped"),  # counts are required
                       good.replace("<failure ", "<failed ").replace("</failure>", "</failed>")):
            self.assertNotEqual(broken, good)
            path = os.path.join(d, "broken.xml")
            with open(path, "w") as f:
                f.write(broken)
            ok, _ = xmllint_validate(path)
            self.assertFalse(ok, broken)

    def test_passing_junit_validates(self):
        junit = os.path.join(self.tmpdir(), "junit.xml")
        self.check("host_clean", "--max-growth-per-step", "16KiB", "--junit", junit, code=0)
        ok, messages = xmllint_validate(junit)
        self.assertTrue(ok, messages)
        self.assertIsNone(ET.parse(junit).getroot().find("testsuite/testcase/failure"))

    # -- policy files --------------------------------------------------------------------
    def test_toml_and_yaml_policies(self):
        d = self.tmpdir()
        toml = os.path.join(d, "ci.toml")
        yaml = os.path.join(d, "ci.yaml")
        with open(toml, "w") as f:
            f.write('warmup_steps = 5\nmax_growth_per_step = "16KiB"\n\n[host]\nmax_exit_leak = "512KiB"\n')
        with open(yaml, "w") as f:
            f.write("warmup_steps: 5\nmax_growth_per_step: 16KiB\nhost:\n  max_exit_leak: 512KiB\n")
        outputs = []
        for policy in (toml, yaml):
            proc = self.check("host_leak", "--policy", policy, code=1)
            self.assertIn("FAIL growth per step (total): 64.0 KiB/step > limit 16.0 KiB/step (fit over steps 6-30",
                          proc.stdout)
            self.assertIn("FAIL exit leak (host): ", proc.stdout)
            outputs.append(proc.stdout)
        self.assertEqual(outputs[0], outputs[1])
        # Flags override the file.
        proc = self.check("host_leak", "--policy", yaml, "--max-growth-per-step", "1MiB", "--max-exit-leak",
                          "host=64MiB", code=0)
        self.assertIn("ok   growth per step (total): 64.0 KiB/step <= limit 1.00 MiB/step", proc.stdout)

    # -- bad input: exit 2, naming the key or value ---------------------------------------------
    def test_bad_policy_files(self):
        d = self.tmpdir()
        cases = [
            ("unknown.toml", 'max_growth_per_step = "16KiB"\nmax_gruth = 3\n', ":2: max_gruth: unknown key 'max_gruth'"),
            ("unknown.yaml", "device:\n  max_peek: 1GiB\n", ":2: device.max_peek: unknown key 'max_peek' in device"),
            ("twice.yaml", "max_peak: 1GiB\nmax_peak: 2GiB\n", ":2: max_peak: given twice (first on line 1)"),
            ("twice.toml", 'max_peak = "1GiB"\nmax_peak = "2GiB"\n', ":2: not valid TOML: "),
            ("size.toml", 'max_peak = "1.5 GB"\n[device]\nmax_held = "12XB"\n',
             ":3: device.max_held: '12XB' is not a size"),
            ("kind.yaml", "gpu:\n  max_peak: 1GiB\n", ":1: gpu: unknown memory kind or role 'gpu'"),
            ("scope.toml", "[host]\nmax_ooms = 1\n", ":2: host.max_ooms: no OOM events figure exists for host memory"),
            ("tolerance.toml", 'max_peak = "1GiB"\ntolerance = "5%"\n',
             ":2: tolerance: a tolerance needs a baseline to compare with"),
            ("share.yaml", "host:\n  max_fragmentation_share: 130%\n", ":2: host.max_fragmentation_share: '130%' is more "
                                                                         "than 100%"),
            ("policy.ini", "max_peak = 1\n", "'%s': the file name says neither TOML nor YAML"),
        ]
        for file_name, text, expected in cases:
            path = os.path.join(d, file_name)
            with open(path, "w") as f:
                f.write(text)
            proc = self.check("host_leak", "--policy", path, code=2)
            self.assertEqual(proc.stdout, "", file_name)
            self.assertIn(expected.replace("%s", path) if "%s" in expected else path + expected, proc.stderr)
            if file_name.startswith("twice"):
                self.assertIn("max_peak", proc.stderr)
        proc = self.check("host_leak", "--policy", os.path.join(d, "missing.toml"), code=2)
        self.assertIn("--policy: cannot read '%s'" % os.path.join(d, "missing.toml"), proc.stderr)

    def test_bad_flags(self):
        cases = [
            (("--max-peak", "12XB"), "memledger: check: --max-peak: '12XB' is not a size"),
            (("--max-growth-per-step", "-1MiB"), "--max-growth-per-step: '-1MiB' is negative"),
            (("--max-growth-per-step", "gpu=1MiB"), "--max-growth-per-step: unknown memory kind or role 'gpu'"),
            (("--max-held", "managed=1GiB"), "--max-held: no peak held figure exists for managed memory"),
            (("--max-peak", "1MiB", "--max-peak", "2MiB"), "--max-peak: given twice with different values ('1MiB' and "
                                                           "'2MiB')"),
            (("--max-peak", "1MiB", "--tolerance", "5%"), "--tolerance: a tolerance needs a baseline"),
            (("--baseline", "x", "--tolerance", "150"), "--tolerance: '150' is ambiguous"),
            (("--warmup-steps", "three", "--max-peak", "1MiB"), "--warmup-steps: 'three' is not a whole number"),
            (("--max-suspects", "1.5"), "--max-suspects: '1.5' is not a whole number"),
            ((), "no limits given"),
            (("--max-peak",), "option --max-peak needs a value"),
            (("--frobnicate",), "unknown option --frobnicate"),
            (("--max-peak", "1MiB", "--junit", "/nonexistent-dir/j.xml"), "--junit: cannot write /nonexistent-dir/j.xml"),
        ]
        for args, expected in cases:
            proc = self.check("host_leak", *args, code=2)
            self.assertIn(expected, proc.stderr, args)
            self.assertEqual(proc.stdout, "", args)

    def test_bad_inputs(self):
        d = self.tmpdir()
        not_report = os.path.join(d, "other.json")
        with open(not_report, "w") as f:
            json.dump({"schema": "memledger-check"}, f)
        empty_dir = os.path.join(d, "empty")
        os.mkdir(empty_dir)
        cases = [
            (os.path.join(d, "missing"), "missing: no such file or folder"),
            (not_report, "not a memledger report (schema 'memledger-check'"),
            (empty_dir, "no traces (trace.*.mlt) and no report.json in this folder"),
        ]
        for path, expected in cases:
            proc = self.check(path, "--max-peak", "1MiB", code=2)
            self.assertIn(expected, proc.stderr)
        proc = self.check("host_leak", "--baseline", not_report, code=2)
        self.assertIn("baseline (--baseline): %s: not a memledger report" % not_report, proc.stderr)

    # -- diff --------------------------------------------------------------------------------
    def test_diff_shows_series_and_changed_sites(self):
        proc = self.memledger("diff", self.runs["base"], self.runs["up10"])
        self.assertExit(proc, 0)
        text = proc.stdout
        self.assertRegex(text, r"growth per step \(total\) +1\.00 MiB/step +1\.10 MiB/step +\+102 KiB/step \(\+10\.0%\)")
        self.assertRegex(text, r"\n +30 +30\.1 MiB +33\.1 MiB +\+3\.00 MiB\n")  # the last step, side by side
        self.assertIn("sites whose growth per step changed most", text)
        self.assertRegex(text, r"\+102 KiB/step +1\.00 MiB/step +1\.10 MiB/step +host +.*plant_leak")

        proc = self.memledger("diff", "--format", "json", self.runs["base"], self.runs["up10"])
        self.assertExit(proc, 0)
        diff = json.loads(proc.stdout)
        self.assertEqual(diff["schema"], "memledger-diff")
        self.assertEqual(len(diff["series"]["host"]), STEPS)
        last = diff["series"]["host"][-1]
        self.assertEqual(last["b"] - last["a"], STEPS * (BASE_LEAK * 110 // 100 - BASE_LEAK))
        site = diff["growth_sites"][0]
        self.assertIn("plant_leak", site["site"])
        self.assertAlmostEqual(site["change"], BASE_LEAK * 110 // 100 - BASE_LEAK, delta=1)

    def test_diff_usage_errors(self):
        proc = self.memledger("diff", self.runs["base"])
        self.assertExit(proc, 2)
        self.assertIn("give two runs", proc.stderr)
        proc = self.memledger("diff", "--format", "html", self.runs["base"], self.runs["up1"])
        self.assertExit(proc, 2)
        self.assertIn("--format must be text or json, not 'html'", proc.stderr)


if __name__ == "__main__":
    mltest.main()
