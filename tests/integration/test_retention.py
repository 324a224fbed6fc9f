"""Retention paths: who keeps a growth suspect's memory alive.

A PyTorch loop keeps every step's output (256 KiB) in a module-level list, in
a dict attribute of a module-level object, or in a list local to the
function that runs the loop (which calls memledger.snapshot() before it
returns). Plain `memledger run -- CMD`, no markers: the Python module walks
the referrers of the program's large tensors at exit (or at the snapshot),
and the report prints the chain from the container to its named root under
the suspect. The clean control keeps nothing: no suspect, and no path."""

import os

import clients
import mltest

SCRIPT = os.path.join(clients.CLIENTS_DIR, "retention_client.py")


def leak_line(mode):
    """The client's line marked `# LEAK_SITE(mode)`."""
    with open(SCRIPT) as f:
        return next(n for n, text in enumerate(f, 1) if "# LEAK_SITE(%s)" % mode in text)


class Retention(clients.ClientTestCase):
    def run_client(self, keep, *options):
        run_dir = os.path.join(self.tmpdir(), "run")
        env = mltest.clean_env(MEMLEDGER_RETENTION_BUDGET="30", **clients.QUIET)
        proc = self.memledger("run", "-q", "-o", run_dir, *options, "--", clients.PYTHON_TORCH, SCRIPT, "--keep", keep,
                              env=env, timeout=240)
        self.assertExit(proc, 0)
        self.assertIn("DONE", proc.stdout)
        report = self.load_report(run_dir)
        with open(os.path.join(run_dir, "report.txt")) as f:
            text = f.read()
        return report, text, run_dir

    def kept_by(self, report):
        """The paths of the suspect that has them (the outputs' site)."""
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertIsNotNone(process["stats"]["retention"], process["notes"])
        with_paths = [s for s in process["leak_suspects"] if s.get("kept_by")]
        self.assertEqual(len(with_paths), 1, [(s["site"], s.get("kept_by")) for s in process["leak_suspects"]])
        return with_paths[0]

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


if __name__ == "__main__":
    mltest.main()
