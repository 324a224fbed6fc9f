"""The CUDA stack in the report (environment block) and the findings made of
it, on the simulated CUDA (tests/sim_cuda):

    a driver older than the runtime    SIMCUDA_DRIVER_VERSION=12020 under the CUDA 13.0 runtime:
                                       the first call fails with cudaErrorInsufficientDriver
    two runtime majors in one process  runtime/cuda12's libcudart.so.12 beside libcudart.so.13
    a crash inside the driver          SIMCUDA_CRASH_IN_ALLOC=1: cuMemAlloc faults in libcuda
    a CUDA build on a machine without  SIMCUDA_NO_DRIVER=1: no libcuda.so.1 to load, and a libcupti
    a driver                           that faults when started without one (tests/cupti/
                                       fake_cupti.cpp, FAKE_CUPTI=driver=needed)

and a framework's own out-of-memory error (JAX's RESOURCE_EXHAUSTED on the
CPU, a real one) named by the verdict through the Python module's
exception hook.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import clients
from mltest import BUILD_DIR, MEMLEDGER, TIMEOUT, TestCase, clean_env
from test_cuda_hooks import DRIVER_DIR, SIM_DIR, sim_env, sim_program

RUNTIME_13 = SIM_DIR / "runtime" / "libcudart.so.13"
RUNTIME_12 = SIM_DIR / "runtime" / "cuda12" / "libcudart.so.12"
SIM_CUDNN = SIM_DIR / "libraries" / "libcudnn.so.9"
SIM_CUBLAS = SIM_DIR / "libraries" / "libcublas.so.13"
FAKE_CUPTI = os.environ.get("MLTEST_LIBRARY_fake_cupti", str(BUILD_DIR / "tests" / "cupti" / "libfake_cupti.so"))


@unittest.skipUnless((DRIVER_DIR / "libcuda.so.1").exists(), "the simulated CUDA is not built (no CUDA 13 headers)")
class CudaEnvironment(TestCase):
    def run_traced(self, argv, environment=None, **env):
        """`environment`: the whole environment, in place of the simulated
        CUDA's (sim_env) with `env` added."""
        run_dir = tempfile.mkdtemp(prefix="memledger-env-")
        self.addCleanup(shutil.rmtree, run_dir, ignore_errors=True)
        proc = subprocess.run([MEMLEDGER, "run", "-q", "--host", "off", "-o", run_dir, "--", *argv],
                              capture_output=True, text=True, timeout=TIMEOUT,
                              env=environment if environment is not None else sim_env(**env))
        text = subprocess.run([MEMLEDGER, "report", run_dir], capture_output=True, text=True, timeout=TIMEOUT).stdout
        self.run_dir = run_dir
        return proc, self.load_report(run_dir), text

    def library(self, report, name):
        found = [lib for lib in report["environment"]["libraries"] if lib["name"] == name]
        self.assertTrue(found, report["environment"])
        return found

    def test_driver_older_than_the_runtime(self):
        # The case: the report said only "exited with code 1".
        proc, report, text = self.run_traced([sim_program("cuda_runtime_dynamic"), "3", "1048576", "normal"],
                                             SIMCUDA_DRIVER_VERSION="12020")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("cudaErrorInsufficientDriver", proc.stderr)
        verdict = report["verdict"]
        self.assertEqual(verdict["kind"], "cuda_mismatch", verdict["summary"])
        summary = verdict["summary"]
        for part in ("runtime 13.0", "CUDA 12.2", "cudaGetDeviceCount failed with cudaErrorInsufficientDriver (35)",
                     "install an NVIDIA driver", "(exited with code 1)"):
            self.assertIn(part, summary)
        env = report["environment"]
        self.assertEqual(env["driver_cuda"], "12.2")
        self.assertEqual(env["init_error"], "cudaGetDeviceCount 35")
        self.assertEqual([lib["version"] for lib in self.library(report, "libcudart")], ["13.0"])
        self.assertIn("stop verdict: " + summary, text)
        self.assertIn("environment:\n  CUDA driver: supports CUDA 12.2\n", text)
        with open(os.path.join(self.run_dir, "report.html")) as f:
            html = f.read()
        self.assertIn("<h3>Environment</h3><div class=\"card\"><ul><li>CUDA driver: supports CUDA 12.2</li>", html)

    def test_environment_of_a_clean_run(self):
        proc, report, text = self.run_traced([sim_program("cuda_runtime_dynamic"), "2", "1048576", "normal"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        env = report["environment"]
        self.assertEqual(env["driver_cuda"], "13.0")
        self.assertEqual(env["devices"], ["0: SimCUDA GPU 0, 512.0 MiB", "1: SimCUDA GPU 1, 512.0 MiB"])
        runtime = self.library(report, "libcudart")
        self.assertEqual([(lib["version"], lib["major"], os.path.basename(lib["path"])) for lib in runtime],
                         [("13.0", 13, "libcudart.so.13")])
        self.assertEqual(env["findings"], [])
        self.assertEqual(report["verdict"]["kind"], "exit")
        self.assertIn("CUDA driver: supports CUDA 13.0; GPUs: 0: SimCUDA GPU 0, 512.0 MiB; 1: SimCUDA GPU 1, "
                      "512.0 MiB", text)

    def test_two_runtime_majors(self):
        script = textwrap.dedent(f"""
            import ctypes
            new = ctypes.CDLL({str(RUNTIME_13)!r})
            old = ctypes.CDLL({str(RUNTIME_12)!r})
            count = ctypes.c_int()
            assert new.cudaGetDeviceCount(ctypes.byref(count)) == 0
            versions = []
            for rt in (new, old):
                v = ctypes.c_int()
                assert rt.cudaRuntimeGetVersion(ctypes.byref(v)) == 0
                versions.append(v.value)
            print("VERSIONS", versions)
        """)
        proc, report, _ = self.run_traced([sys.executable, "-c", script])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("VERSIONS [13000, 12080]", proc.stdout)
        runtimes = self.library(report, "libcudart")
        self.assertEqual(sorted((lib["version"], lib["major"]) for lib in runtimes), [("12.8", 12), ("13.0", 13)])
        finding = [n for n in report["notes"] if n.startswith("two major versions of libcudart")]
        self.assertEqual(len(finding), 1, report["notes"])
        self.assertIn("12.8 (%s)" % RUNTIME_12, finding[0])
        self.assertIn("13.0 (%s)" % RUNTIME_13, finding[0])
        self.assertIn("install one CUDA major", finding[0])
        # The process did not die of it: the verdict stays the exit.
        self.assertEqual(report["verdict"]["summary"], "clean exit (code 0)")

    def test_forked_child_notes_its_own_stack(self):
        # The child's trace is its own: the facts noted before the fork are
        # not in it, so it notes them again at its first step end.
        script = textwrap.dedent(f"""
            import ctypes, os
            rt = ctypes.CDLL({str(RUNTIME_13)!r})
            assert rt.cudaGetDeviceCount(ctypes.byref(ctypes.c_int())) == 0
            pid = os.fork()
            if pid == 0:
                ctypes.CDLL(None).memledger_step(b"child")
                os._exit(0)
            os.waitpid(pid, 0)
        """)
        proc, report, _ = self.run_traced([sys.executable, "-c", script])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(len(report["processes"]), 2)
        for p in report["processes"]:
            self.assertEqual(p["environment"]["driver_cuda"], "13.0", p["pid"])
            self.assertEqual([lib["version"] for lib in p["environment"]["libraries"] if lib["name"] == "libcudart"],
                             ["13.0"], p["pid"])

    def cupti_script(self):
        """A CUDA build of a framework as it starts: it loads its CUPTI (the
        stand-in, under the real one's file name), then the runtime, and asks
        for the GPUs. Prints the runtime's answer."""
        folder = tempfile.mkdtemp(prefix="memledger-cupti-")
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        cupti = os.path.join(folder, "libcupti.so.13")
        shutil.copy(FAKE_CUPTI, cupti)
        return cupti, textwrap.dedent(f"""
            import ctypes
            ctypes.CDLL({cupti!r})
            rt = ctypes.CDLL({str(RUNTIME_13)!r})
            print("COUNT", rt.cudaGetDeviceCount(ctypes.byref(ctypes.c_int())))
        """)

    @unittest.skipUnless(os.path.exists(FAKE_CUPTI), "the stand-in CUPTI is not built (no CUPTI headers)")
    def test_cupti_is_not_started_without_a_driver(self):
        # PyTorch's CUDA wheels on a machine without a GPU: they bring pip's
        # CUPTI 13.2, whose cuptiGetVersion overflows the stack where no
        # driver loads, and the first CUDA call fails (cudaErrorInsufficientDriver).
        cupti, script = self.cupti_script()
        no_driver = clean_env(FAKE_CUPTI="driver=needed", SIMCUDA_NO_DRIVER="1")
        no_driver.pop("LD_LIBRARY_PATH", None)
        # The stand-in faults as that CUPTI does, so this test can fail.
        untraced = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL(%r).cuptiGetVersion("
                                   "ctypes.byref(ctypes.c_uint32()))" % cupti],
                                  capture_output=True, timeout=TIMEOUT, env=no_driver)
        self.assertEqual(untraced.returncode, -11, untraced.stderr)
        proc, report, text = self.run_traced([sys.executable, "-c", script], environment=no_driver)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("COUNT 35", proc.stdout)
        self.assertEqual(report["verdict"]["summary"], "clean exit (code 0)")
        env = report["environment"]
        self.assertEqual(env["init_error"], "cudaGetDeviceCount 35")
        self.assertEqual([(lib["version"], lib["path"]) for lib in self.library(report, "libcupti")], [("", cupti)])
        self.assertIn("libcupti.so.13 (version not asked without a working CUDA driver; build id ", text)
        # No driver to be too old: the note says there is none.
        self.assertEqual(len(env["findings"]), 1, env["findings"])
        self.assertTrue(env["findings"][0].startswith("no NVIDIA driver: cudaGetDeviceCount failed with "
                                                      "cudaErrorInsufficientDriver (35) and no libcuda.so.1 was loaded"),
                        env["findings"])
        self.assertIn(env["findings"][0], report["notes"])

    def test_step_ends_without_a_driver_leave_the_heap_alone(self):
        # A CUDA build on a machine without a driver ends steps: each step end
        # looks for the driver's pool calls. A failed dl call there would
        # leave blocks that the C library frees later for the program (its
        # error message, the thread's dlerror state): frees of blocks never
        # seen allocated, on tcmalloc as on glibc.
        from test_allocators import ALLOCATORS
        script = textwrap.dedent(f"""
            import ctypes
            rt = ctypes.CDLL({str(RUNTIME_13)!r})
            print("COUNT", rt.cudaGetDeviceCount(ctypes.byref(ctypes.c_int())))
            step = ctypes.CDLL(None).memledger_step
            for i in range(3):
                kept = [bytearray(4096) for _ in range(10)]
                step(None)
        """)
        for preload in ("", ALLOCATORS["tcmalloc"]):
            if preload and not os.path.exists(preload):
                continue
            env = clean_env(SIMCUDA_NO_DRIVER="1", LD_PRELOAD=preload)
            env.pop("LD_LIBRARY_PATH", None)
            run_dir = tempfile.mkdtemp(prefix="memledger-env-")
            self.addCleanup(shutil.rmtree, run_dir, ignore_errors=True)
            proc = subprocess.run([MEMLEDGER, "run", "-q", "--host", "full", "-o", run_dir, "--", sys.executable, "-c",
                                   script], capture_output=True, text=True, timeout=TIMEOUT, env=env)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("COUNT 35", proc.stdout)
            report = self.load_report(run_dir)
            self.assertEqual(len(report["steps"]), 3)
            self.assertEqual(report["stats"]["unknown_frees"], 0, (preload, report["notes"]))

    def test_no_driver_at_all(self):
        # A program that needs the GPU, on a machine without the driver.
        proc, report, text = self.run_traced([sim_program("cuda_runtime_dynamic"), "3", "1048576", "normal"],
                                             SIMCUDA_NO_DRIVER="1")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        verdict = report["verdict"]
        self.assertEqual(verdict["kind"], "cuda_mismatch", verdict["summary"])
        self.assertEqual(verdict["summary"],
                         "no NVIDIA driver: cudaGetDeviceCount failed with cudaErrorInsufficientDriver (35) and no "
                         "libcuda.so.1 was loaded, so the CUDA runtime 13.0 (libcudart.so.13) had no GPU to use; to run "
                         "on a GPU, install an NVIDIA driver that supports CUDA 13.0 or newer (or put its libcuda.so.1 "
                         "on the library path) (exited with code 1)")
        self.assertEqual(report["environment"]["driver_cuda"], "")
        self.assertNotIn("needs a newer driver", text)

    @unittest.skipUnless(os.path.exists(FAKE_CUPTI), "the stand-in CUPTI is not built (no CUPTI headers)")
    def test_cupti_version_once_the_driver_answers(self):
        cupti, script = self.cupti_script()
        proc, report, text = self.run_traced([sys.executable, "-c", script], FAKE_CUPTI="driver=needed")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("COUNT 0", proc.stdout)
        versions = [lib["version"] for lib in self.library(report, "libcupti")]
        self.assertEqual(len(versions), 1)
        self.assertRegex(versions[0], r"^API [0-9]+$")
        self.assertIn("libcupti.so.13 " + versions[0] + "  " + cupti, text)

    def test_crash_inside_the_driver(self):
        proc, report, text = self.run_traced([sim_program("cuda_driver_linked"), "2", "1048576", "normal"],
                                             SIMCUDA_CRASH_IN_ALLOC="1")
        self.assertEqual(proc.returncode, 128 + 11, proc.stderr)
        verdict = report["verdict"]
        self.assertEqual(verdict["kind"], "crash")
        self.assertIn("crashed with SIGSEGV at address 0x10: crashed inside the CUDA driver (libcuda.so.1); "
                      "driver for CUDA 13.0; see the versions in the environment block", verdict["summary"])
        self.assertIn("fault_inside_driver", " ".join(f.get("function", "") for f in verdict["crash_stack"]))

    def run_with_release(self, module_release, library_release):
        """The simulated driver loaded as libcuda.so.LIBRARY_RELEASE (through
        a libcuda.so.1 link, as a driver installs it), with a kernel module
        version file of MODULE_RELEASE in place of /proc/driver/nvidia/version
        (MEMLEDGER_TEST_NVIDIA_VERSION_FILE; None: no such file)."""
        folder = tempfile.mkdtemp(prefix="memledger-release-")
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        real = os.path.join(folder, "libcuda.so." + library_release)
        shutil.copy(DRIVER_DIR / "libcuda.so.1", real)
        os.symlink(os.path.basename(real), os.path.join(folder, "libcuda.so.1"))
        version = os.path.join(folder, "version")
        if module_release is not None:
            with open(version, "w") as f:
                f.write("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  "
                        "(dvs-builder@U16-I3-B03-4-3)  Tue Jul 22 18:49:56 UTC 2025\n"
                        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n" % module_release)
        script = textwrap.dedent(f"""
            import ctypes
            ctypes.CDLL({os.path.join(folder, "libcuda.so.1")!r})
            rt = ctypes.CDLL({str(RUNTIME_13)!r})
            assert rt.cudaGetDeviceCount(ctypes.byref(ctypes.c_int())) == 0
        """)
        return self.run_traced([sys.executable, "-c", script], MEMLEDGER_TEST_NVIDIA_VERSION_FILE=version)

    def test_driver_release(self):
        proc, report, text = self.run_with_release("580.65.06", "580.65.06")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        env = report["environment"]
        self.assertEqual((env["driver_release"], env["driver_library_release"]), ("580.65.06", "580.65.06"))
        self.assertIn("environment:\n  CUDA driver: 580.65.06, supports CUDA 13.0; GPUs: ", text)
        self.assertEqual(env["findings"], [])
        # Without the kernel module's file, libcuda's file name tells.
        proc, report, text = self.run_with_release(None, "575.57.08")
        self.assertEqual(report["environment"]["driver_release"], "")
        self.assertIn("CUDA driver: libcuda 575.57.08, supports CUDA 13.0", text)

    def test_kernel_module_and_libcuda_of_different_releases(self):
        proc, report, text = self.run_with_release("580.65.06", "575.57.08")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("CUDA driver: 580.65.06, libcuda 575.57.08, supports CUDA 13.0", text)
        finding = "the NVIDIA kernel module is release 580.65.06 but libcuda is release 575.57.08"
        self.assertEqual([f for f in report["environment"]["findings"] if f.startswith(finding)], 
                         [f for f in report["notes"] if f.startswith(finding)])
        self.assertEqual(len([f for f in report["notes"] if f.startswith(finding)]), 1, report["notes"])

    def test_crash_inside_the_driver_names_its_release(self):
        folder = tempfile.mkdtemp(prefix="memledger-release-")
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        version = os.path.join(folder, "version")
        with open(version, "w") as f:
            f.write("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:50 UTC 2025\n")
        proc, report, _ = self.run_traced([sim_program("cuda_driver_linked"), "2", "1048576", "normal"],
                                          SIMCUDA_CRASH_IN_ALLOC="1", MEMLEDGER_TEST_NVIDIA_VERSION_FILE=version)
        self.assertEqual(proc.returncode, 128 + 11, proc.stderr)
        self.assertIn("crashed inside the CUDA driver 580.65.06 (libcuda.so.1); driver for CUDA 13.0",
                      report["verdict"]["summary"])

    def create_handle(self, library, call, exit_on_failure, linked=False, **env):
        """Initialises the simulated runtime, then calls the library's
        handle-creating call through ctypes: by dlsym on the library, as
        TensorFlow and XLA reach cuDNN and cuBLAS, or `linked`, by its name
        in the global scope, as a framework linked against it (PyTorch)."""
        script = textwrap.dedent(f"""
            import ctypes, sys
            rt = ctypes.CDLL({str(RUNTIME_13)!r})
            assert rt.cudaGetDeviceCount(ctypes.byref(ctypes.c_int())) == 0
            lib = ctypes.CDLL({str(library)!r}, mode=ctypes.RTLD_GLOBAL)
            if {linked!r}:
                lib = ctypes.CDLL(None)
            handle = ctypes.c_void_p()
            status = getattr(lib, {call!r})(ctypes.byref(handle))
            print("STATUS", status)
            sys.exit(1 if status and {exit_on_failure!r} else 0)
        """)
        return self.run_traced([sys.executable, "-c", script], **env)

    @unittest.skipUnless(SIM_CUDNN.exists(), "the simulated cuDNN is not built (no cuDNN headers)")
    def test_cudnn_9_is_not_asked_before_the_program_uses_it(self):
        # A framework linked against cuDNN 9 that has not called it yet:
        # cudnnGetVersion would load libcudnn_graph.so.9 into the program.
        script = textwrap.dedent(f"""
            import ctypes
            cudnn = ctypes.CDLL({str(SIM_CUDNN)!r}, mode=ctypes.RTLD_GLOBAL)
            rt = ctypes.CDLL({str(RUNTIME_13)!r})
            assert rt.cudaGetDeviceCount(ctypes.byref(ctypes.c_int())) == 0
            ctypes.CDLL(None).memledger_step(b"a step before any cuDNN call")

            def graph_loaded():
                return any("libcudnn_graph" in line for line in open("/proc/self/maps"))

            print("GRAPH BEFORE", graph_loaded())
            if {{use}}:
                assert cudnn.cudnnCreate(ctypes.byref(ctypes.c_void_p())) == 0
                ctypes.CDLL(None).memledger_step(b"a step after")
        """)
        proc, report, text = self.run_traced([sys.executable, "-c", script.replace("{use}", "False")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("GRAPH BEFORE False", proc.stdout)
        self.assertEqual([lib["version"] for lib in self.library(report, "libcudnn")], [""])
        self.assertIn("libcudnn.so.9 (version not asked before the program's first cuDNN call; build id ", text)
        # Once the program has made its cuDNN call, the next look asks.
        proc, report, text = self.run_traced([sys.executable, "-c", script.replace("{use}", "True")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("GRAPH BEFORE False", proc.stdout)
        versions = [lib["version"] for lib in self.library(report, "libcudnn")]
        self.assertEqual(len(versions), 1, versions)
        self.assertRegex(versions[0], r"^9\.\d+\.\d+$")
        self.assertIn("libcudnn.so.9 %s  %s" % (versions[0], SIM_CUDNN), text)

    @unittest.skipUnless(SIM_CUDNN.exists(), "the simulated cuDNN is not built (no cuDNN headers)")
    def test_cudnn_create_version_mismatch(self):
        proc, report, text = self.create_handle(SIM_CUDNN, "cudnnCreate", True, SIMCUDA_CUDNN_CREATE_STATUS="1002")
        self.assertIn("STATUS 1002", proc.stdout)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        env = report["environment"]
        self.assertEqual(env["create_errors"],
                         ["cudnnCreate 1002 CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH\t%s" % SIM_CUDNN])
        cudnn = self.library(report, "libcudnn")
        self.assertRegex(cudnn[0]["version"], r"^9\.\d+\.\d+$")
        verdict = report["verdict"]
        self.assertEqual(verdict["kind"], "cuda_mismatch", verdict["summary"])
        self.assertTrue(verdict["summary"].startswith(
            "cudnnCreate failed with CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH (1002): cuDNN %s (libcudnn.so.9) does "
            "not fit the rest of the CUDA stack (runtime 13.0, driver for CUDA 13.0)" % cudnn[0]["version"]),
            verdict["summary"])
        self.assertTrue(verdict["summary"].endswith("(exited with code 1)"), verdict["summary"])
        self.assertIn("  cudnnCreate failed: CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH (1002)\n", text)

    @unittest.skipUnless(SIM_CUBLAS.exists(), "the simulated cuBLAS is not built (no cuBLAS headers)")
    def test_cublas_create_not_initialized_survived(self):
        # The program goes on without cuBLAS: a note, the verdict stays the exit.
        proc, report, _ = self.create_handle(SIM_CUBLAS, "cublasCreate_v2", False, SIMCUDA_CUBLAS_CREATE_STATUS="1")
        self.assertIn("STATUS 1", proc.stdout)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(report["verdict"]["summary"], "clean exit (code 0)")
        version = self.library(report, "libcublas")[0]["version"]
        finding = ("cublasCreate_v2 failed with CUBLAS_STATUS_NOT_INITIALIZED (1): cuBLAS %s (libcublas.so.13) could "
                   "not start (runtime 13.0, driver for CUDA 13.0)" % version)
        self.assertEqual([n for n in report["notes"] if n.startswith("cublasCreate_v2 failed")][0][:len(finding)],
                         finding)

    @unittest.skipUnless(SIM_CUDNN.exists(), "the simulated cuDNN is not built (no cuDNN headers)")
    def test_cudnn_create_that_succeeds_is_no_finding(self):
        # cuDNN 9's libcudnn.so.9 hands cudnnCreate to libcudnn_graph.so.9's,
        # found by dlsym: by either way in, the call must reach it once.
        for linked in (False, True):
            with self.subTest(linked=linked):
                proc, report, _ = self.create_handle(SIM_CUDNN, "cudnnCreate", True, linked=linked)
                self.assertIn("STATUS 0", proc.stdout, proc.stderr)
                self.assertEqual(report["verdict"]["summary"], "clean exit (code 0)")
                self.assertEqual(report["environment"]["create_errors"], [])
                self.assertEqual(report["environment"]["findings"], [])
                self.assertRegex(self.library(report, "libcudnn")[0]["version"], r"^9\.")

    def test_crash_outside_cuda_names_no_library(self):
        script = "import ctypes; ctypes.CDLL(%r).cudaGetDeviceCount(ctypes.byref(ctypes.c_int())); " \
                 "ctypes.string_at(16)" % str(RUNTIME_13)
        proc, report, _ = self.run_traced([sys.executable, "-c", script])
        self.assertEqual(report["verdict"]["kind"], "crash", proc.stderr)
        self.assertNotIn("crashed inside", report["verdict"]["summary"])
        self.assertEqual(report["environment"]["driver_cuda"], "13.0")


class FrameworkOutOfMemory(TestCase):
    def test_jax_resource_exhausted_named_in_the_verdict(self):
        clients.skip_unless(self, "jax")
        script = textwrap.dedent("""
            import jax.numpy as jnp
            import memledger
            memledger.step()
            jnp.zeros((1 << 48,), dtype=jnp.uint8).block_until_ready()
        """)
        run_dir = tempfile.mkdtemp(prefix="memledger-jax-oom-")
        self.addCleanup(shutil.rmtree, run_dir, ignore_errors=True)
        proc = subprocess.run([MEMLEDGER, "run", "-q", "--host", "off", "-o", run_dir, "--", clients.PYTHON_ML, "-c",
                               script], capture_output=True, text=True, timeout=180, env=clean_env(**clients.QUIET))
        self.assertEqual(proc.returncode, 1, proc.stderr[-2000:])
        report = self.load_report(run_dir)
        verdict = report["verdict"]
        # No CUDA here: the framework's own allocator refused it.
        self.assertEqual(verdict["kind"], "framework_oom", verdict["summary"])
        self.assertTrue(verdict["summary"].startswith("out of memory in JAX (256.0 TiB could not be allocated): the "
                                                      "program raised "), verdict["summary"])
        self.assertIn("RESOURCE_EXHAUSTED: Out of memory allocating 281474976710656 bytes", verdict["summary"])
        self.assertIn("(exited with code 1)", verdict["summary"])
        jax = report["environment"]["frameworks"]["jax"]
        self.assertRegex(jax["version"], r"^\d+\.\d+")
        self.assertRegex(jax["jaxlib"], r"^\d+\.\d+")
        self.assertEqual(jax["cuda"], "None")


if __name__ == "__main__":
    unittest.main(verbosity=2)
