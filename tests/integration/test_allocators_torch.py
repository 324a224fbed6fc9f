"""Replacement allocators under a PyTorch script (tests/clients/
torch_allocator.py on Debian's python3-torch): preloaded in front of
`memledger run` (full host mode) and behind libmemledger.so (sampled), the
script keeps its allocator, exits as untraced, and its kept tensor per step
is found at its line (within 5% in full mode). Each traced run imports
PyTorch under the tracer: one per mode and launch path, not the cross
product, keeps the file under a few minutes."""

import os

import clients
import mltest
from test_allocators import ALLOCATORS

SCRIPT = os.path.join(clients.CLIENTS_DIR, "torch_allocator.py")
PACKAGE_DIR = os.environ.get("MLTEST_PYTHON_PACKAGE", str(mltest.SOURCE_DIR / "tools" / "python"))


class TorchOnAllocator(mltest.TestCase):
    untraced_runs = {}  # allocator -> the script's run without memledger

    def setUp(self):
        clients.skip_unless(self, "torch")

    def run_script(self, library, how, host):
        run_dir = os.path.join(self.tmpdir(), "run")
        command = [clients.PYTHON_TORCH, SCRIPT]
        if how == "untraced":
            return self.run_cmd(command, env=mltest.clean_env(LD_PRELOAD=library, **clients.QUIET), timeout=180), None
        if how == "front":
            env = mltest.clean_env(LD_PRELOAD=library, **clients.QUIET)
            proc = self.traced(run_dir, command, options=("--host", host), env=env, timeout=240)
        else:
            env = mltest.clean_env(LD_PRELOAD="%s:%s" % (mltest.LIBRARY, library), MEMLEDGER_DIR=run_dir,
                                   MEMLEDGER_HOST=host, PYTHONPATH=PACKAGE_DIR,
                                   **clients.QUIET)
            proc = self.run_cmd(command, env=env, timeout=240)
            out = os.path.join(run_dir, "report.json")
            self.assertExit(self.memledger("report", run_dir, "--format", "json", "-o", out), 0)
        return proc, self.load_report(run_dir)

    def check(self, allocator, how, host):
        library = ALLOCATORS[allocator]
        if not os.path.exists(library):
            self.skipTest("%s not installed (scripts/install-deps.sh installs it)" % library)
        if allocator not in self.untraced_runs:
            self.untraced_runs[allocator] = self.run_script(library, "untraced", host)[0]
        direct = self.untraced_runs[allocator]
        self.assertExit(direct, 0)
        self.assertIn("SERVED_BY=%s" % allocator, direct.stdout)
        proc, report = self.run_script(library, how, host)
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout, direct.stdout)
        values = mltest.parse_kv(proc.stdout)
        leak = int(values["LEAK_BYTES"])
        self.assertEqual(report["verdict"]["exit_code"], 0)
        self.assertEqual(report["stats"]["unknown_frees"], 0)
        suspects = report["leak_suspects"]
        self.assertTrue(suspects, report["notes"])
        top = suspects[0]
        frames = ["%s:%s" % (os.path.basename(f.get("file") or ""), f.get("line")) for f in top["stack"]]
        self.assertEqual(frames[0], "%s:%s" % (values["LEAK_FILE"], values["LEAK_LINE"]), top["site"])
        if host == "full":
            self.assertAlmostEqual(top["bytes_per_step_exact"], leak, delta=0.05 * leak)
        else:
            self.assertGreater(top["bytes_per_step_exact"], 0.75 * leak)
            self.assertLess(top["bytes_per_step_exact"], 1.5 * leak)

    def test_jemalloc_in_front_full(self):
        self.check("jemalloc", "front", "full")

    def test_jemalloc_behind_sampled(self):
        self.check("jemalloc", "behind", "sampled")

    def test_tcmalloc_in_front_full(self):
        self.check("tcmalloc", "front", "full")

    def test_tcmalloc_behind_sampled(self):
        self.check("tcmalloc", "behind", "sampled")

    def test_mimalloc_in_front_sampled(self):
        self.check("mimalloc", "front", "sampled")

    def test_mimalloc_behind_full(self):
        self.check("mimalloc", "behind", "full")


if __name__ == "__main__":
    mltest.main()
