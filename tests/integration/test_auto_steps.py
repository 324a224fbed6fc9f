"""Automatic steps: with no step marker, the report infers the training
loop's steps from the repeating allocation pattern, says so (source `auto`,
"inferred period N allocations per step ..."), and finds exactly the planted
number of steps on real programs: the native training loop of
tests/programs/train_leak.cpp and the framework clients of tests/clients
run with their markers removed. The planted leaks are still the top growth
suspects, and clean controls have none."""

import os
import re

import clients
import mltest

STEPS = 20


class AutoSteps(clients.ClientTestCase):
    def assertAutoSteps(self, report, steps, text=None, first_step_may_merge=False):
        self.assertEqual(report["step_source"], "auto", report["notes"])
        if first_step_may_merge:
            self.assertIn(len(report["steps"]), (steps - 1, steps), report["step_inference"])
            steps = len(report["steps"])
        else:
            self.assertEqual(len(report["steps"]), steps, report["step_inference"])
        self.assertTrue(all(s["source"] == "auto" for s in report["steps"]))
        self.assertRegex(report["step_inference"], r"^inferred period \d+ allocations per step")
        if text is not None:
            self.assertRegex(text, r"steps: %d \(source: auto \(inferred period \d+ allocations per step" % steps)

    def test_native_training_loop(self):
        run_dir = os.path.join(self.tmpdir(), "native")
        proc = self.traced(run_dir, [mltest.program("train_leak"), str(STEPS), "--no-markers"])
        self.assertExit(proc, 0)
        with open(os.path.join(run_dir, "report.txt")) as f:
            text = f.read()
        r = self.load_report(run_dir)
        self.assertAutoSteps(r, STEPS, text)
        top = r["leak_suspects"][0]
        self.assertEqual(mltest.site_parts(top["site"]), ("record_history", "train_leak.cpp", 34))
        self.assertEqual(top["bytes_per_step"], 65536)
        self.assertEqual(len(r["leak_suspects"]), 1, [s["site"] for s in r["leak_suspects"]])

    def test_markers_win(self):
        run_dir = os.path.join(self.tmpdir(), "marked")
        proc = self.traced(run_dir, [mltest.program("train_leak"), str(STEPS)])
        self.assertExit(proc, 0)
        r = self.load_report(run_dir)
        self.assertEqual(r["step_source"], "marker")
        self.assertEqual(r["step_inference"], "")

    def check_client(self, framework, leak, options=(), first_step_may_merge=False):
        clients.skip_unless(self, framework)
        run_dir = os.path.join(self.tmpdir(), framework + "-" + leak)
        run = clients.run_client(self, framework, run_dir, "--steps", STEPS, "--leak", leak, "--markers", "none",
                                 options=options)
        self.assertCompleted(run)
        self.assertAutoSteps(run.report, STEPS, first_step_may_merge=first_step_may_merge)
        if leak == "none":
            self.assertEqual([s["site"] for s in run.report["leak_suspects"]], [])
            return run, None
        return run, self.assertTopSuspectIsTheLeak(run)

    def test_torch_graph_leak(self):
        self.check_client("torch", "graph")

    def test_torch_loss_leak(self):
        self.check_client("torch", "loss")

    def test_torch_clean(self):
        self.check_client("torch", "none")

    def test_keras_generator_leak(self):
        self.check_client("tensorflow", "generator")

    # The batches made by a tf.py_function on tf.data's own threads: Python
    # runs there, so the leak is named at the function's own line.
    def test_keras_py_function_leak(self):
        run, top = self.check_client("tensorflow", "py_function")
        self.assertNamesPlantedLine(top, run)

    def test_keras_clean(self):
        self.check_client("tensorflow", "none")

    # JAX compiles on threads of its own, in bursts that repeat allocation
    # patterns too; the loop is the one anchored in Python code.
    def test_jax_cache_leak(self):
        self.check_client("jax", "cache")

    def test_jax_clean(self):
        self.check_client("jax", "none")

    # Outputs kept on XLA's threads, named at the loop's line by attribution,
    # in both host modes. In full mode, JAX registering its CPU devices
    # repeats more of what it allocates than the loop does, but under one
    # Python instruction: the loop steps through Python and wins. Full mode
    # records the first step's tracing and compilation in full, and now and
    # then a loop of the later steps' allocations outscores the one that
    # includes it: the first step is then part of start-up (19 steps).
    def test_jax_outputs_kept(self):
        run, top = self.check_client("jax", "outputs")
        self.assertAttributedToTheLoop(top, run)

    def test_jax_outputs_kept_full(self):
        run, top = self.check_client("jax", "outputs", options=("--host", "full"), first_step_may_merge=True)
        self.assertAttributedToTheLoop(top, run)


# A user's PyTorch loop with no marker, in the default sampled host mode:
# each step keeps its loss (with its graph) and a 128 KiB tensor. (At 64 KiB,
# half the default sample interval, a third of the steps in a row now and
# then had no sample of it, and the tail of its estimate looked level.)
SAMPLED_LOOP = """\
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for step in range(%d):
    x = torch.randn(512, 64)
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    kept.append(loss)
    kept.append(torch.ones(32768))
"""
SAMPLED_LOOP_STEPS = 30
SAMPLED_LOOP_LEAK_LINE = 13


class SampledLoop(mltest.TestCase):
    """Automatic steps in sampled host mode: every step ends at its own
    boundary, with the live total corrected by the exact totals read after
    the step's last recorded allocation (the 100 ms readings are far apart
    for steps this fast), the teardown after the last step is no step, and
    `check` fails the leak with its line named."""

    def run_loop(self):
        clients.skip_unless(self, "torch")
        tmp = self.tmpdir()
        script = os.path.join(tmp, "loop.py")
        with open(script, "w") as f:
            f.write(SAMPLED_LOOP % SAMPLED_LOOP_STEPS)
        run_dir = os.path.join(tmp, "run")
        proc = self.traced(run_dir, [clients.PYTHON_TORCH, script], options=())
        self.assertExit(proc, 0)
        return run_dir

    def test_torch_loop_without_markers(self):
        r = self.load_report(self.run_loop())
        self.assertEqual(r["host_mode"], "sampled")
        self.assertEqual(r["step_source"], "auto", r["notes"])
        self.assertEqual(len(r["steps"]), SAMPLED_LOOP_STEPS, r["step_inference"])
        live = [s["live"]["host"] for s in r["steps"]]
        repeats = sum(a == b for a, b in zip(live, live[1:]))
        self.assertEqual(repeats, 0, live)
        # Each step keeps about 130 KiB: the last one too (no teardown in it).
        gain = (live[-1] - live[2]) / (len(live) - 3)
        self.assertGreater(gain, 96 * 1024, live)
        self.assertLess(gain, 192 * 1024, live)
        self.assertGreater(live[-1] - live[-2], -256 * 1024, live)

    def test_check_fails_the_loop(self):
        run_dir = self.run_loop()
        check = self.memledger("check", run_dir, "--max-growth-per-step", "32KiB")
        self.assertEqual(check.returncode, 1, check.stdout + check.stderr)
        m = re.search(r"FAIL growth per step \(total\): ([\d.]+) KiB/step .*R\u00b2 ([\d.]+)[^)]*\); top suspect: (.*)",
                      check.stdout)
        self.assertIsNotNone(m, check.stdout)
        self.assertGreater(float(m.group(2)), 0.8, check.stdout)
        self.assertIn("loop.py:%d" % SAMPLED_LOOP_LEAK_LINE, m.group(3))


if __name__ == "__main__":
    mltest.main()
