"""Automatic steps: with no step marker, the report infers the training
loop's steps from the repeating allocation pattern, says so (source `auto`,
"inferred period N allocations per step ..."), and finds exactly the planted
number of steps on real programs: the native training loop of
tests/programs/train_leak.cpp and the framework clients of tests/clients
run with their markers removed. The planted leaks are still the top growth
suspects, and clean controls have none."""

import os

import clients
import mltest

STEPS = 20


class AutoSteps(clients.ClientTestCase):
    def assertAutoSteps(self, report, steps, text=None):
        self.assertEqual(report["step_source"], "auto", report["notes"])
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

    def check_client(self, framework, leak):
        clients.skip_unless(self, framework)
        run_dir = os.path.join(self.tmpdir(), framework + "-" + leak)
        run = clients.run_client(self, framework, run_dir, "--steps", STEPS, "--leak", leak, "--markers", "none")
        self.assertCompleted(run)
        self.assertAutoSteps(run.report, STEPS)
        if leak == "none":
            self.assertEqual([s["site"] for s in run.report["leak_suspects"]], [])
        else:
            self.assertTopSuspectIsTheLeak(run)

    def test_torch_graph_leak(self):
        self.check_client("torch", "graph")

    def test_torch_loss_leak(self):
        self.check_client("torch", "loss")

    def test_torch_clean(self):
        self.check_client("torch", "none")

    def test_keras_generator_leak(self):
        self.check_client("tensorflow", "generator")

    def test_keras_clean(self):
        self.check_client("tensorflow", "none")

    # JAX compiles on threads of its own, in bursts that repeat allocation
    # patterns too; the loop is the one anchored in Python code.
    def test_jax_cache_leak(self):
        self.check_client("jax", "cache")

    def test_jax_clean(self):
        self.check_client("jax", "none")


if __name__ == "__main__":
    mltest.main()
