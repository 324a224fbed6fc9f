"""The GPU suite: real programs on a real NVIDIA GPU under memledger.

Skips itself (exit 77, which meson reports as SKIP) with a visible message when
no GPU is present. Each client plants a per-step device leak of 4 MiB that the
report must find, and a forced out-of-memory that must give the cuda_oom verdict.
Environment: MEMLEDGER (the memledger binary); MEMLEDGER_GPU_REPORTS, a folder
that keeps each run's report.json, named after its test; MEMLEDGER_GPU_TIMEOUT,
seconds a traced run may take (600).
"""
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
MEMLEDGER = os.environ.get("MEMLEDGER", os.path.join(HERE, "..", "..", "build", "tools", "memledger"))
LEAK = 4 << 20
STEPS = 20


def gpu_present():
    if shutil.which("nvidia-smi") is None:
        return False, "nvidia-smi not found"
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if r.returncode != 0 or "GPU" not in r.stdout:
        return False, "nvidia-smi lists no GPU"
    return True, r.stdout.strip()


TIMEOUT = float(os.environ.get("MEMLEDGER_GPU_TIMEOUT", "600"))


def calling_test():
    for frame in inspect.stack():
        if frame.function.startswith("test_"):
            return f"{type(frame.frame.f_locals['self']).__name__}.{frame.function}"
    return "run"


def keep_report(run_dir):
    keep = os.environ.get("MEMLEDGER_GPU_REPORTS")
    if not keep or not os.path.exists(os.path.join(run_dir, "report.json")):
        return
    os.makedirs(keep, exist_ok=True)
    name = calling_test()
    target = os.path.join(keep, f"{name}.json")
    n = 2
    while os.path.exists(target):
        target = os.path.join(keep, f"{name}.{n}.json")
        n += 1
    shutil.copyfile(os.path.join(run_dir, "report.json"), target)


def run_traced(args, *extra, env=None):
    run_dir = tempfile.mkdtemp(prefix="memledger-gpu-")
    cmd = [MEMLEDGER, "run", "-q", "--host", "off", "-o", run_dir, *extra, "--", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    keep_report(run_dir)
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    shutil.rmtree(run_dir, ignore_errors=True)
    return proc, report


def device_suspects(report):
    return [s for s in report["leak_suspects"] if s["kind"] in ("device", "managed")]


class GpuCase(unittest.TestCase):
    def check_leak(self, report, tolerance):
        suspects = device_suspects(report)
        self.assertTrue(suspects, f"no device growth suspect: {report['notes']}")
        top = suspects[0]
        self.assertAlmostEqual(top["bytes_per_step"], LEAK, delta=LEAK * tolerance,
                               msg=f"top device suspect {top['site']}")
        self.assertEqual(report["step_source"], "marker")
        self.assertEqual(len(report["steps"]), STEPS)

    def check_oom(self, proc, report):
        self.assertEqual(report["verdict"]["kind"], "cuda_oom", report["verdict"]["summary"])
        self.assertTrue(report["ooms"])
        self.assertGreater(report["ooms"][-1]["requested"], 0)


class NvccStaticRuntime(GpuCase):
    @classmethod
    def setUpClass(cls):
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not os.path.exists(nvcc):
            raise unittest.SkipTest("nvcc not found")
        cls.exe = os.path.join(tempfile.mkdtemp(prefix="memledger-nvcc-"), "cuda_static_leak")
        subprocess.run([nvcc, "-O1", "-g", "-o", cls.exe, os.path.join(HERE, "cuda_static_leak.cu"), "-ldl"],
                       check=True)

    def test_leak_found_through_cuGetProcAddress(self):
        proc, report = run_traced([self.exe, str(STEPS), str(LEAK)])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_leak(report, 0.0)
        self.assertIn("plant_device_leak", report["leak_suspects"][0]["site"])

    def test_oom(self):
        proc, report = run_traced([self.exe, "3", str(LEAK), "oom"])
        self.assertEqual(proc.returncode, 3, proc.stderr)
        self.check_oom(proc, report)


def need_module(name):
    if importlib.util.find_spec(name) is None:
        raise unittest.SkipTest(f"Python module {name} not installed")


class PyTorch(GpuCase):
    @classmethod
    def setUpClass(cls):
        need_module("torch")

    def torch(self, mode, *extra, conf=None, newer_conf=None, **variables):
        env = dict(os.environ, **variables)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        if newer_conf:
            env["PYTORCH_ALLOC_CONF"] = newer_conf
        return run_traced([sys.executable, os.path.join(HERE, "torch_leak.py"), str(STEPS), mode], *extra, env=env)

    def test_default_caching_allocator(self):
        # Segments, not tensors: growth is per segment (PyTorch rounds large
        # blocks into 20 MiB or 2 MiB-multiple segments), so the rate is approximate.
        proc, report = self.torch("leak")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_leak(report, 0.5)
        self.assertTrue(report["caching_allocator_hidden"])

    def test_leak_mode_cuda_malloc_async(self):
        proc, report = self.torch("leak", "--leak-mode")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_leak(report, 0.0)

    def test_leak_mode_over_the_newer_variable(self):
        # PYTORCH_ALLOC_CONF wins over PYTORCH_CUDA_ALLOC_CONF in newer
        # PyTorch: leak mode sets both, so expandable segments are not used.
        proc, report = self.torch("leak", "--leak-mode", newer_conf="expandable_segments:True")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_leak(report, 0.0)
        self.assertFalse(any(s.get("reserved_address_space", 0) > 0 for s in report["steps"]))

    def test_nccl_vmm_buffers_freed_by_their_last_reference(self):
        # NCCL frees a buffer by retain, release, unmap, release: every free
        # matches an allocation, and nothing grows.
        proc, report = self.torch("nccl", NCCL_CUMEM_ENABLE="1")
        if proc.returncode != 0 and "nccl" in proc.stderr.lower() and "not available" in proc.stderr.lower():
            self.skipTest("PyTorch without NCCL")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(report["stats"].get("unknown_frees", 0), 0, report["stats"])
        self.assertFalse(device_suspects(report), report["leak_suspects"])

    def test_cuda_graph_memory_counted_at_replay(self):
        # Each step captures a new graph and keeps its 4 MiB output: nothing
        # is allocated at capture, each replay allocates, and the growth is a
        # graph-owned suspect at the capture site.
        proc, report = self.torch("graph", "--leak-mode")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_leak(report, 0.5)
        top = device_suspects(report)[0]
        self.assertTrue(top.get("graph_owned"), top)
        self.assertIn("torch_leak.py", top["site"])

    def test_expandable_segments(self):
        proc, report = self.torch("leak", conf="expandable_segments:True")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_leak(report, 0.5)
        self.assertTrue(any(s.get("reserved_address_space", 0) > 0 for s in report["steps"]))

    def test_oom_default(self):
        proc, report = self.torch("oom")
        self.assertEqual(proc.returncode, 1)
        self.check_oom(proc, report)

    def test_oom_leak_mode(self):
        proc, report = self.torch("oom", "--leak-mode")
        self.assertEqual(proc.returncode, 1)
        self.check_oom(proc, report)


class Jax(GpuCase):
    @classmethod
    def setUpClass(cls):
        need_module("jax")

    def test_leak_mode_allocator_leak(self):
        # Leak mode picks cuda_async where this JAX accepts it: every buffer
        # is then a pool allocation, no caching allocator hides them. The
        # JAX CUDA plugin loads its runtime RTLD_LOCAL: the runtime hooks
        # must reach it (no cudaErrorInsufficientDriver).
        proc, report = run_traced([sys.executable, os.path.join(HERE, "jax_leak.py"), str(STEPS), "leak"],
                                  "--leak-mode")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("INSUFFICIENT_DRIVER", proc.stderr.upper().replace(" ", "_"))
        self.check_leak(report, 0.05)
        self.assertFalse(report.get("caching_allocator_hidden"), report["notes"])

    def test_oom(self):
        proc, report = run_traced([sys.executable, os.path.join(HERE, "jax_leak.py"), "3", "oom"], "--leak-mode")
        self.assertNotEqual(proc.returncode, 0)
        self.check_oom(proc, report)


class CuPy(GpuCase):
    @classmethod
    def setUpClass(cls):
        need_module("cupy")

    def test_leak(self):
        proc, report = run_traced([sys.executable, os.path.join(HERE, "cupy_leak.py"), str(STEPS), "leak"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_leak(report, 0.0)

    def test_oom(self):
        proc, report = run_traced([sys.executable, os.path.join(HERE, "cupy_leak.py"), "3", "oom"])
        self.assertNotEqual(proc.returncode, 0)
        self.check_oom(proc, report)


if __name__ == "__main__":
    ok, why = gpu_present()
    if not ok:
        print(f"GPU suite skipped: no NVIDIA GPU on this machine ({why})")
        sys.exit(77)
    print(f"GPU suite on: {why}")
    unittest.main(verbosity=2)
