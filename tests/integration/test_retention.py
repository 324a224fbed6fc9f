"""Retention paths: who keeps a growth suspect's memory alive.

A PyTorch loop keeps every step's output (256 KiB) in a module-level list, in
a dict attribute of a module-level object, or in a list local to the
function that runs the loop (which calls memledger.snapshot() before it
returns). Plain `memledger run -- CMD`, no markers: the Python module walks
the referrers of the program's large tensors at exit (or at the snapshot),
and the report prints the chain from the container to its named root under
the suspect. The clean control keeps nothing: no suspect, and no path.

A Keras model.fit whose callback keeps every batch's logits (TensorFlow
eager tensors) and tf.Variable copies of them in its attributes; a JAX loop
that keeps every step's output in a dict `outputs`, global or local."""

import os

import clients
import mltest

SCRIPT = os.path.join(clients.CLIENTS_DIR, "retention_client.py")
KERAS = os.path.join(clients.CLIENTS_DIR, "retention_keras_client.py")
JAX = os.path.join(clients.CLIENTS_DIR, "retention_jax_client.py")


def leak_line(mode, script=SCRIPT):
    """The client's line marked `# LEAK_SITE(mode)`."""
    with open(script) as f:
        return next(n for n, text in enumerate(f, 1) if "# LEAK_SITE(%s)" % mode in text)


def frames(suspect):
    return ["%s:%s" % (os.path.basename(f.get("file") or ""), f.get("line")) for f in suspect["stack"]]


class Retention(clients.ClientTestCase):
    def run_client(self, keep, *options, python=clients.PYTHON_TORCH, script=SCRIPT):
        run_dir = os.path.join(self.tmpdir(), "run")
        env = mltest.clean_env(MEMLEDGER_RETENTION_BUDGET="30", **clients.QUIET)
        proc = self.memledger("run", "-q", "-o", run_dir, *options, "--", python, script, "--keep", keep,
                              env=env, timeout=240)
        self.assertExit(proc, 0)
        self.assertIn("DONE", proc.stdout)
        report = self.load_report(run_dir)
        with open(os.path.join(run_dir, "report.txt")) as f:
            text = f.read()
        return report, text, run_dir

    def kept_by(self, report, count=1):
        """The paths of the suspect that has them (the outputs' site); with
        count > 1, the `count` suspects that have them."""
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertIsNotNone(process["stats"]["retention"], process["notes"])
        with_paths = [s for s in process["leak_suspects"] if s.get("kept_by")]
        self.assertEqual(len(with_paths), count, [(s["site"], s.get("kept_by")) for s in process["leak_suspects"]])
        return with_paths[0] if count == 1 else with_paths

    def test_global_list(self):
        clients.skip_unless(self, "torch")
        report, text, _ = self.run_client("global")
        suspect = self.kept_by(report)
        self.assertIn("retention_client.py:%d" % leak_line("output"), suspect["site"])
        top = suspect["kept_by"][0]
        self.assertEqual(top["hops"][0], "list `history` (40 items), global in __main__ (retention_client.py)")
        self.assertTrue(top["hops"][-1].startswith("Tensor (float32[64, 1024], requires_grad, grad_fn "), top)
        # Sampled mode records most 256 KiB blocks (and all that it does are matched).
        self.assertGreaterEqual(top["objects"], 20)
        self.assertIn("     kept by: list `history` (40 items), global in __main__ (retention_client.py)\n", text)
        self.assertIn("         ← Tensor (float32[64, 1024]", text)

    def test_attribute(self):
        clients.skip_unless(self, "torch")
        report, _, _ = self.run_client("attribute", "--host", "full")
        suspect = self.kept_by(report)
        self.assertIn("retention_client.py:%d" % leak_line("copy"), suspect["site"])
        top = suspect["kept_by"][0]
        self.assertEqual(top["hops"][:2], ["Trainer object `trainer`, global in __main__ (retention_client.py)",
                                           "attribute `cache`: dict (40 items)"])
        self.assertEqual(top["hops"][2], "Tensor (float32[64, 1024])")
        self.assertEqual(top["objects"], 40)  # full mode: every block
        self.assertEqual(top["bytes"], 40 * 64 * 1024 * 4)

    def test_local_at_snapshot(self):
        # The list dies when train() returns: the snapshot taken before that
        # is matched with the live set of its moment.
        clients.skip_unless(self, "torch")
        report, _, run_dir = self.run_client("local", "--host", "full")
        suspect = self.kept_by(report)
        top = suspect["kept_by"][0]
        self.assertRegex(top["hops"][0], r"^list `kept` \(40 items\), local in train \(retention_client\.py:\d+\)$")
        # The last step's output is also the local `out`: a path of its own.
        self.assertEqual(sum(k["objects"] for k in suspect["kept_by"]), 40, suspect["kept_by"])
        self.assertGreaterEqual(top["objects"], 39)
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertEqual(process["stats"]["retention"]["when"], "snapshot")

    def test_clean_and_switched_off(self):
        clients.skip_unless(self, "torch")
        report, _, run_dir = self.run_client("none")
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertEqual(process["leak_suspects"], [])
        self.assertEqual(process["stats"]["retention"]["when"], "exit")
        self.assertLess(process["stats"]["retention"]["seconds"], 30)
        report, _, run_dir = self.run_client("global", "--no-retention")
        self.assertEqual([f for f in os.listdir(run_dir) if f.startswith("retention.")], [])
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertIsNone(process["stats"]["retention"])
        self.assertTrue(process["leak_suspects"])
        self.assertEqual([s for s in process["leak_suspects"] if s.get("kept_by")], [])

    def test_keras_callback_keeps_logits(self):
        # Eager tensors and variables give their buffer's address through
        # DLPack (no copy); the callback is reached from the module-level
        # list the client passed to fit.
        clients.skip_unless(self, "tensorflow")
        # Sampled mode (full host mode is slow with TensorFlow) records every
        # block of the sample interval or more: 500 KiB blocks, all of them.
        report, text, _ = self.run_client("both", python=clients.PYTHON_ML, script=KERAS)
        suspects = self.kept_by(report, count=2)
        by_line = {}
        for suspect in suspects:
            for mode in ("logits", "variables"):
                if "retention_keras_client.py:%d" % leak_line(mode, KERAS) in frames(suspect):
                    by_line[mode] = suspect
        self.assertEqual(sorted(by_line), ["logits", "variables"], [frames(s)[:12] for s in suspects])
        root = ["list `callbacks` (2 items), global in __main__ (retention_keras_client.py)", "KeepLogits object"]
        top = by_line["logits"]["kept_by"][0]
        self.assertEqual(top["hops"], root + ["attribute `kept`: list (20 items)", "tf.Tensor (float32[128, 1000])"])
        self.assertEqual(top["objects"], 20)
        self.assertEqual(top["bytes"], 20 * 128 * 1000 * 4)
        top = by_line["variables"]["kept_by"][0]
        self.assertEqual(top["hops"][:3], root + ["attribute `copies`: list (20 items)"])
        self.assertRegex(top["hops"][3], r"^tf\.Variable `Variable(_\d+)?:0` \(float32\[128, 1000\]\)$")
        self.assertEqual(top["objects"], 20)
        self.assertIn("     kept by: list `callbacks` (2 items), global in __main__ (retention_keras_client.py)\n"
                      "         ← KeepLogits object\n"
                      "         ← attribute `kept`: list (20 items)\n", text)

    def test_jax_outputs_in_a_global_dict(self):
        clients.skip_unless(self, "jax")
        report, text, _ = self.run_client("global", python=clients.PYTHON_ML, script=JAX)
        suspect = self.kept_by(report)
        # Made on XLA's thread: attributed to the main thread's line of the moment.
        self.assertIn("retention_jax_client.py:%d" % leak_line("output", JAX), frames(suspect))
        top = suspect["kept_by"][0]
        self.assertEqual(top["hops"], ["dict `outputs` (20 items), global in __main__ (retention_jax_client.py)",
                                       "jax.Array (float32[256, 512])"])
        # Sampled mode records every block of the sample interval or more;
        # an output that XLA made while the main thread was elsewhere (the
        # first step's, compiled then) belongs to another site.
        self.assertGreaterEqual(top["objects"], 12)
        self.assertEqual(top["bytes"], top["objects"] * 256 * 512 * 4)
        self.assertIn("     kept by: dict `outputs` (20 items), global in __main__ (retention_jax_client.py)\n", text)

    def test_jax_outputs_in_a_local_dict(self):
        clients.skip_unless(self, "jax")
        report, _, _ = self.run_client("local", "--host", "full", python=clients.PYTHON_ML, script=JAX)
        suspect = self.kept_by(report)
        top = suspect["kept_by"][0]
        self.assertRegex(top["hops"][0],
                         r"^dict `outputs` \(20 items\), local in train_local \(retention_jax_client\.py:\d+\)$")
        self.assertEqual(top["hops"][1], "jax.Array (float32[256, 512])")
        self.assertGreaterEqual(top["objects"], 12)


if __name__ == "__main__":
    mltest.main()
