"""The CUPTI module on a real NVIDIA GPU (see tests/integration/test_cupti.py
for what runs without one). Skips itself (exit 77, meson SKIP) without a GPU.

- CUPTI's MEMORY2 records match the hooks' allocations one for one, on the
  nvcc-built CUDA C++ client and on PyTorch in leak mode (cudaMallocAsync);
- steps from torch.cuda.nvtx ranges (--steps nvtx:) and from kernel launches
  (--steps kernel:, CUPTI callbacks);
- torch.profiler in the same process gets CUPTI and works; the report says
  from when on memledger went on with its hooks only;
- CUPTI on adds at most 2% to PyTorch's step time in leak mode.
Environment: MEMLEDGER (the memledger binary).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from test_gpu import HERE, LEAK, STEPS, gpu_present, need_module, run_traced


def torch_run(mode, *options, steps=STEPS):
    return run_traced([sys.executable, os.path.join(HERE, "torch_cupti.py"), str(steps), mode], *options)


class CuptiMatchesHooks(unittest.TestCase):
    def check_cross_check(self, report):
        c = report["cupti"]
        self.assertEqual(c["status"], "active", c["message"])
        self.assertTrue(c["compared"])
        self.assertEqual(c["dropped"], 0)
        self.assertGreaterEqual(c["matched"], STEPS, c)
        # Every device allocation of the program is seen by both sides.
        self.assertEqual(c["hooks_only"]["count"], 0, c["hooks_only"])
        self.assertEqual(c["size_differences"], 0)

    def test_cuda_cpp_client(self):
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not os.path.exists(nvcc):
            self.skipTest("nvcc not found")
        exe = os.path.join(tempfile.mkdtemp(prefix="memledger-nvcc-"), "cuda_static_leak")
        subprocess.run([nvcc, "-O1", "-g", "-o", exe, os.path.join(HERE, "cuda_static_leak.cu"), "-ldl"], check=True)
        proc, report = run_traced([exe, str(STEPS), str(LEAK)], "--cupti", "on")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("CUPTI is not used", proc.stderr)
        self.check_cross_check(report)

    def test_pytorch_leak_mode(self):
        need_module("torch")
        proc, report = torch_run("leak", "--cupti", "on", "--leak-mode")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_cross_check(report)

    def test_nvtx_steps(self):
        need_module("torch")
        proc, report = torch_run("leak", "--steps", "nvtx:^train_step", "--leak-mode")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(report["step_source"], "nvtx")
        self.assertEqual(len(report["steps"]), STEPS)
        top = [s for s in report["leak_suspects"] if s["kind"] == "device"][0]
        self.assertEqual(top["bytes_per_step"], LEAK)

    def test_kernel_steps(self):
        need_module("torch")
        # The fused Adam's update kernel runs once per step (a run of
        # launches counts once).
        proc, report = torch_run("leak", "--cupti", "on", "--steps", "kernel:[Aa]dam", "--leak-mode")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(report["step_source"], "kernel")
        self.assertIn(len(report["steps"]), (STEPS, STEPS + 1))

    def test_coexists_with_torch_profiler(self):
        need_module("torch")
        proc, report = torch_run("profiler", "--cupti", "on", "--leak-mode")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        events = re.search(r"PROFILER_EVENTS=(\d+)", proc.stdout)
        self.assertTrue(events and int(events.group(1)) > 0, proc.stdout + proc.stderr)
        self.assertIn("handed over", report["cupti"]["end"])
        self.assertTrue(any("handed over" in n for n in report["notes"]), report["notes"])
        top = [s for s in report["leak_suspects"] if s["kind"] == "device"][0]
        self.assertEqual(top["bytes_per_step"], LEAK)

    def test_overhead_at_most_two_percent(self):
        need_module("torch")

        def median_step(*options):
            proc, _ = torch_run("timing", "--leak-mode", *options, steps=200)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            return float(re.search(r"STEP_TIME_US=([\d.]+)", proc.stdout).group(1))

        off = min(median_step("--cupti", "off") for _ in range(3))
        on = min(median_step("--cupti", "on") for _ in range(3))
        print(f"step time: CUPTI off {off:.1f} us, on {on:.1f} us ({(on / off - 1) * 100:+.2f}%)")
        self.assertLessEqual(on, off * 1.02)


if __name__ == "__main__":
    ok, why = gpu_present()
    if not ok:
        print(f"GPU CUPTI suite skipped: no NVIDIA GPU on this machine ({why})")
        sys.exit(77)
    print(f"GPU CUPTI suite on: {why}")
    unittest.main(verbosity=2)
