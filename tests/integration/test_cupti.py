"""The CUPTI module (cupti_tracer/) on a machine without a GPU.

The simulated CUDA (tests/sim_cuda) gives the programs a driver; the real
libcupti of the CUDA install finds no usable device behind it, and a stand-in
libcupti (tests/cupti/fake_cupti.cpp) plays the other cases: another CUDA
major version, another tool holding the subscriber slot, a failing call, and
an active CUPTI delivering records. In every case the run and the device leak
report are those of the hooks alone, with at most one line on stderr, and the
report says what became of CUPTI. NVTX steps need no GPU at all.
"""
import json
import os
import pathlib

import mltest
from mltest import BUILD_DIR, clean_env, memledger_lines, parse_kv

SIM_DIR = BUILD_DIR / "tests" / "sim_cuda"
DRIVER_DIR = SIM_DIR / "driver"
PROGRAM = SIM_DIR / "programs" / "cuda_runtime_dynamic"
MODULE = os.environ.get("MLTEST_CUPTI_MODULE", str(BUILD_DIR / "cupti_tracer" / "libmemledger_cupti.so"))
FAKE_CUPTI = os.environ.get("MLTEST_LIBRARY_fake_cupti", str(BUILD_DIR / "tests" / "cupti" / "libfake_cupti.so"))
HANDOVER_PROGRAM = os.environ.get("MLTEST_PROGRAM_cupti_handover", str(BUILD_DIR / "tests" / "cupti" / "cupti_handover"))
HANDOVER_LOCAL_PROGRAM = os.environ.get("MLTEST_PROGRAM_cupti_handover_local",
                                        str(BUILD_DIR / "tests" / "cupti" / "cupti_handover_local"))
CUPTI_CLIENT = os.environ.get("MLTEST_LIBRARY_cupti_client", str(BUILD_DIR / "tests" / "cupti" / "libcupti_client.so"))
NVTX_PROGRAM = os.environ.get("MLTEST_PROGRAM_nvtx_steps", str(BUILD_DIR / "tests" / "cupti" / "nvtx_steps"))
STEPS = 10
LEAK = 3 << 20


def sim_env(**extra):
    return clean_env(LD_LIBRARY_PATH=str(DRIVER_DIR), SIMCUDA_DEVICES="2", SIMCUDA_MEMORY_MB="512", **extra)


def leak_summary(report):
    """What the hooks found: the figures that must not change with CUPTI."""
    suspects = [s for s in report["leak_suspects"] if s["kind"] == "device"]
    return {
        "steps": len(report["steps"]),
        "live": [s["live"].get("device", 0) for s in report["steps"]],
        "suspect": (suspects[0]["bytes_per_step"], suspects[0]["site"]) if suspects else None,
        "exit_leak": report["exit_leaks"]["bytes"],
        "verdict": report["verdict"]["kind"],
    }


@mltest.unittest.skipUnless(pathlib.Path(MODULE).exists(), "the CUPTI module is not built (no CUDA 13 headers)")
@mltest.unittest.skipUnless((DRIVER_DIR / "libcuda.so.1").exists(), "the simulated CUDA is not built")
class CuptiWithoutGpu(mltest.TestCase):
    baseline = None

    def run_sim(self, *options, env=None):
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, [PROGRAM, STEPS, LEAK, "normal"], ("--host", "off", *options),
                           env=env or sim_env())
        self.assertExit(proc, 0)
        self.assertIn(f"DONE steps={STEPS}", proc.stdout)
        return proc, self.load_report(run_dir)

    def hooks_only(self):
        if CuptiWithoutGpu.baseline is None:
            proc, report = self.run_sim("--cupti", "off")
            self.assertEqual(memledger_lines(proc.stderr), [])
            CuptiWithoutGpu.baseline = report
        return CuptiWithoutGpu.baseline

    def assert_unchanged(self, report):
        expected = leak_summary(self.hooks_only())
        self.assertEqual(expected["suspect"], (LEAK, expected["suspect"][1]))
        self.assertEqual(leak_summary(report), expected)

    def assert_one_line(self, proc, *fragments):
        lines = memledger_lines(proc.stderr)
        self.assertEqual(len(lines), 1, proc.stderr)
        for fragment in fragments:
            self.assertIn(fragment, lines[0])
        return lines[0]

    def assert_note(self, report, line):
        text = line[len("memledger: "):]
        self.assertIn(text, report["notes"])
        self.assertEqual(report["cupti"]["message"], text)
        self.assertFalse(report["cupti"]["compared"])

    # -- the real libcupti, no usable device -----------------------------------
    def test_off_is_silent_and_noted(self):
        report = self.hooks_only()
        self.assertEqual(report["cupti"]["status"], "off")
        self.assertIn("CUPTI is off (--cupti off): device memory is seen by the CUDA hooks only", report["notes"])

    def test_on_says_why_in_one_line(self):
        proc, report = self.run_sim("--cupti", "on")
        line = self.assert_one_line(proc, "memledger: CUPTI is not used: ",
                                    "device memory is seen by the CUDA hooks only")
        self.assertIn(report["cupti"]["status"], ("unavailable", "failed"))
        self.assert_note(report, line)
        self.assert_unchanged(report)
        with open(os.path.join(os.path.dirname(report["trace"]), "report.txt")) as f:
            self.assertIn("CUPTI: " + report["cupti"]["status"], f.read())

    def test_auto_is_the_same_run(self):
        proc, report = self.run_sim("--cupti", "auto")
        lines = memledger_lines(proc.stderr)
        # auto stays silent only where no libcupti exists at all.
        self.assertLessEqual(len(lines), 1, proc.stderr)
        if lines:
            self.assert_note(report, lines[0])
        self.assertNotEqual(report["cupti"]["status"], "none")
        self.assert_unchanged(report)

    def test_missing_path(self):
        proc, report = self.run_sim("--cupti-path", "/nonexistent/libcupti.so.13")
        line = self.assert_one_line(proc, "/nonexistent/libcupti.so.13 does not exist (--cupti-path)")
        self.assertEqual(report["cupti"]["status"], "unavailable")
        self.assert_note(report, line)
        self.assert_unchanged(report)

    def test_folder_without_cupti(self):
        empty = self.tmpdir()
        proc, report = self.run_sim("--cupti-path", empty)
        self.assert_note(report, self.assert_one_line(proc, f"no libcupti in {empty} (--cupti-path)"))

    def test_module_missing(self):
        env = sim_env(MEMLEDGER_CUPTI_MODULE="/nonexistent/libmemledger_cupti.so")
        proc, report = self.run_sim("--cupti", "on", env=env)
        line = self.assert_one_line(proc, "memledger's CUPTI module was not found or does not load",
                                    "/nonexistent/libmemledger_cupti.so")
        self.assert_note(report, line)
        self.assert_unchanged(report)

    # -- the stand-in libcupti ---------------------------------------------------
    def run_fake(self, mode, *options):
        return self.run_sim("--cupti-path", FAKE_CUPTI, *options, env=sim_env(FAKE_CUPTI=mode))

    def test_other_major_version(self):
        for version, major in (("120900", 12), ("28", 12), ("140000", 14)):
            with self.subTest(version=version):
                proc, report = self.run_fake("version=" + version)
                line = self.assert_one_line(proc, f"is CUPTI API version {version} (CUDA {major})",
                                            "memledger's CUPTI module was built for CUDA 13")
                self.assertEqual(report["cupti"]["status"], "unavailable")
                self.assert_note(report, line)
                self.assert_unchanged(report)

    def test_held_by_another_tool(self):
        proc, report = self.run_fake("held=CUPTI for Nsight Systems")
        line = self.assert_one_line(proc, "CUPTI is held by CUPTI for Nsight Systems",
                                    "goes on with its CUDA hooks only")
        self.assertEqual(report["cupti"]["status"], "held")
        self.assertEqual(report["cupti"]["holder"], "CUPTI for Nsight Systems")
        self.assert_note(report, line)
        self.assert_unchanged(report)

    def test_failing_calls(self):
        for call, named in (("cuptiActivityEnable", "cuptiActivityEnable(MEMORY2)"),
                            ("cuptiActivityRegisterCallbacks", "cuptiActivityRegisterCallbacks"),
                            ("cuptiEnableCallback", "cuptiEnableCallback(kernel launches)")):
            with self.subTest(call=call):
                proc, report = self.run_fake("fail=" + call, "--steps", "kernel:^optimizer")
                line = self.assert_one_line(proc, f"{named} failed with CUPTI_ERROR_NOT_SUPPORTED")
                self.assertEqual(report["cupti"]["status"], "failed")
                self.assert_note(report, line)
                self.assert_unchanged(report)

    def test_active_records_reach_the_report(self):
        proc, report = self.run_fake("active")
        self.assertEqual(memledger_lines(proc.stderr), [])
        self.assert_unchanged(report)
        c = report["cupti"]
        self.assertEqual(c["status"], "active")
        self.assertTrue(c["compared"])
        self.assertIn("from " + FAKE_CUPTI, c["message"])
        self.assertEqual(c["end"], "CUPTI collection ended at exit")
        # The stand-in's records, delivered by the forced flush at exit.
        self.assertEqual((c["allocations"], c["releases"], c["pool_records"], c["dropped"]), (2, 1, 1, 3))
        self.assertEqual(c["cupti_only"]["count"], 1)
        only = c["cupti_only"]["allocations"][0]
        self.assertEqual((only["address"], only["bytes"], only["pc"], only["kind"], only["cupti_kind"]),
                         ("0xdead00000", 1 << 20, "0x1234", "device", "device"))
        # The module static is no disagreement: no allocation call made it.
        statics = c["module_statics"]
        self.assertEqual((statics["count"], statics["bytes"]), (1, 2304))
        static = statics["allocations"][0]
        self.assertEqual((static["address"], static["cupti_kind"], static["name"], static["pc"]),
                         ("0xdead80000", "device_static", "fake_module_table", "0x0"))
        duration = report["duration_ns"]
        self.assertTrue(0 < only["ts_ns"] <= duration + 10**9, (only["ts_ns"], duration))
        # The stand-in saw none of the program's allocations: all are the hooks' alone.
        hook_allocations = sum(s["allocations"] for s in report["steps"])
        self.assertGreaterEqual(c["hooks_only"]["count"], STEPS)
        self.assertEqual(c["matched"], 0)
        self.assertTrue(c["hooks_only"]["allocations"][0]["site"])
        self.assertTrue(any("CUPTI lost 3 activity records" in n for n in report["notes"]), report["notes"])
        self.assertTrue(any("seen only by CUPTI" in n for n in report["notes"]), report["notes"])
        self.assertGreater(hook_allocations, 0)

    def test_program_profiler_takes_cupti_over(self):
        """The program's own CUPTI client (here a program linked against the
        stand-in) subscribes half-way: it gets the slot, memledger flushes,
        lets go, and goes on with the hooks; the report says so."""
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, [HANDOVER_PROGRAM, STEPS, 1 << 20],
                           ("--host", "off", "--cupti-path", FAKE_CUPTI), env=sim_env(FAKE_CUPTI="active"))
        self.assertExit(proc, 0)
        self.assertEqual(parse_kv(proc.stdout)["SUBSCRIBE"], "0")  # CUPTI_SUCCESS for the program's client
        self.assertEqual(memledger_lines(proc.stderr), [])
        report = self.load_report(run_dir)
        c = report["cupti"]
        self.assertTrue(c["compared"])
        self.assertIn("handed over to another tool", c["end"])
        self.assertIn(c["end"], report["notes"])
        # The flush at the handover delivered the stand-in's records.
        self.assertEqual((c["allocations"], c["cupti_only"]["count"], c["module_statics"]["count"]), (2, 1, 1))
        # Only the allocations made while memledger held CUPTI are compared.
        self.assertEqual(c["hooks_only"]["count"], STEPS // 2)
        self.assertEqual(len(report["steps"]), STEPS)
        self.assertEqual(report["leak_suspects"][0]["bytes_per_step"], 1 << 20)

    def test_profiler_loaded_local_takes_cupti_over(self):
        """The same, with the client as PyTorch's: a library loaded RTLD_LOCAL
        (Python's import of libtorch_cuda.so) that needs libcupti, which is
        then outside the global scope. Its cuptiSubscribe still reaches
        memledger first, and then the libcupti the client itself links."""
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, [HANDOVER_LOCAL_PROGRAM, STEPS, 1 << 20, CUPTI_CLIENT],
                           ("--host", "off", "--cupti-path", FAKE_CUPTI), env=sim_env(FAKE_CUPTI="active"))
        self.assertExit(proc, 0)
        self.assertEqual(parse_kv(proc.stdout)["SUBSCRIBE"], "0")  # CUPTI_SUCCESS for the program's client
        self.assertEqual(memledger_lines(proc.stderr), [])
        c = self.load_report(run_dir)["cupti"]
        self.assertIn("handed over to another tool", c["end"])
        self.assertEqual((c["allocations"], c["cupti_only"]["count"], c["module_statics"]["count"]), (2, 1, 1))
        self.assertEqual(c["hooks_only"]["count"], STEPS // 2)

    def test_second_subscriber_is_refused(self):
        """Without memledger letting go, the stand-in refuses a second
        subscriber as CUPTI does: the hand-over is what frees the slot."""
        script = ("import ctypes\n"
                  f"cupti = ctypes.CDLL({FAKE_CUPTI!r})\n"
                  "first, second = ctypes.c_void_p(), ctypes.c_void_p()\n"
                  "print('FIRST=%d' % cupti.cuptiSubscribe(ctypes.byref(first), None, None))\n"
                  "print('SECOND=%d' % cupti.cuptiSubscribe(ctypes.byref(second), None, None))\n"
                  "cupti.cuptiUnsubscribe(first)\n"
                  "print('AFTER=%d' % cupti.cuptiSubscribe(ctypes.byref(second), None, None))\n")
        proc = self.run_cmd(["python3", "-c", script], env=clean_env(FAKE_CUPTI="active"))
        self.assertEqual(parse_kv(proc.stdout), {"FIRST": "0", "SECOND": "39", "AFTER": "0"})

    def test_dump_names_cupti_records(self):
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, [PROGRAM, 2, LEAK, "normal"], ("--host", "off", "--cupti-path", FAKE_CUPTI),
                           env=sim_env(FAKE_CUPTI="active"))
        self.assertExit(proc, 0)
        trace = next(pathlib.Path(run_dir).glob("trace.*.mlt"))
        dump = self.memledger("dump", trace)
        self.assertExit(dump, 0)
        self.assertIn("cupti_status", dump.stdout)
        self.assertIn("cupti_alloc", dump.stdout)
        self.assertIn("addr=0xdead00000", dump.stdout)
        self.assertNotIn("malformed", dump.stdout)

    def test_injection_variables(self):
        """`memledger run` makes the module the CUDA injection library when no
        other tool has; it never points NVTX at libcupti."""
        script = ("import os\n"
                  "print('CUDA=' + os.environ.get('CUDA_INJECTION64_PATH', ''))\n"
                  "print('NVTX=' + os.environ.get('NVTX_INJECTION64_PATH', ''))\n")
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, ["python3", "-c", script], ("--host", "off"))
        self.assertExit(proc, 0)
        out = parse_kv(proc.stdout)
        self.assertEqual(os.path.realpath(out["CUDA"]), os.path.realpath(MODULE))
        self.assertEqual(out["NVTX"], "")
        env = clean_env(CUDA_INJECTION64_PATH="/opt/other/tool.so")
        proc = self.traced(self.tmpdir(), ["python3", "-c", script], ("--host", "off"), env=env)
        self.assertEqual(parse_kv(proc.stdout)["CUDA"], "/opt/other/tool.so")
        proc = self.traced(self.tmpdir(), ["python3", "-c", script], ("--host", "off", "--cupti", "off"))
        self.assertEqual(parse_kv(proc.stdout)["CUDA"], "")


@mltest.unittest.skipUnless(pathlib.Path(NVTX_PROGRAM).exists(), "the NVTX test program is not built")
class NvtxSteps(mltest.TestCase):
    def run_nvtx(self, *args, options=(), env=None):
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, [NVTX_PROGRAM, *args], ("--host", "full", *options), env=env)
        self.assertExit(proc, 0)
        return proc, self.load_report(run_dir)

    def check_steps(self, report, steps):
        self.assertEqual(report["step_source"], "nvtx")
        self.assertEqual(len(report["steps"]), steps)
        self.assertEqual([s["label"] for s in report["steps"]], [f"train_step {i + 1}" for i in range(steps)])
        suspects = [s for s in report["leak_suspects"] if s["kind"] == "host"]
        self.assertTrue(suspects, report["notes"])
        self.assertEqual(suspects[0]["bytes_per_step"], 65536)
        self.assertIn("keep_history", suspects[0]["site"])

    def test_push_pop_ranges(self):
        proc, report = self.run_nvtx("12", options=("--steps", "nvtx:^train_step"))
        self.assertEqual(memledger_lines(proc.stderr), [])
        self.check_steps(report, 12)

    def test_start_end_ranges(self):
        _, report = self.run_nvtx("9", "start-end", options=("--steps", "nvtx:^train_step"))
        self.check_steps(report, 9)

    def test_nested_range_is_the_step(self):
        _, report = self.run_nvtx("6", options=("--steps", "nvtx:^data_load$"))
        self.assertEqual(report["step_source"], "nvtx")
        self.assertEqual([s["label"] for s in report["steps"]], ["data_load"] * 6)

    def test_without_pattern_no_nvtx_steps(self):
        _, report = self.run_nvtx("6")
        self.assertNotIn("nvtx", report["step_source"])

    def test_slot_taken_by_another_tool(self):
        env = clean_env(NVTX_INJECTION64_PATH="/nonexistent/nsys/libToolsInjection64.so")
        proc, report = self.run_nvtx("6", options=("--steps", "nvtx:^train_step"), env=env)
        lines = memledger_lines(proc.stderr)
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertIn("NVTX_INJECTION64_PATH is already set (/nonexistent/nsys/libToolsInjection64.so)", lines[0])
        self.assertNotIn("nvtx", report["step_source"])

    def test_usage_errors(self):
        for options, message in ((("--steps", "epoch:x"), "--steps takes nvtx:REGEX or kernel:REGEX"),
                                 (("--steps", "nvtx:"), "--steps takes nvtx:REGEX or kernel:REGEX"),
                                 (("--steps", "nvtx:(unclosed"), "not a valid regular expression"),
                                 (("--steps", "nvtx:a", "--steps", "nvtx:b"), "--steps nvtx: given twice"),
                                 (("--cupti", "maybe"), "--cupti must be auto, on or off"),
                                 (("--cupti", "off", "--steps", "kernel:adam"), "needs CUPTI"),
                                 (("--cupti", "off", "--cupti-path", "/x"), "--cupti-path with --cupti off")):
            with self.subTest(options=options):
                proc = self.memledger("run", *options, "--", "true")
                self.assertExit(proc, 2)
                self.assertIn(message, proc.stderr)


if __name__ == "__main__":
    mltest.main()
