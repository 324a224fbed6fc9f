"""Worker processes without steps: growth over time windows and the
frameworks' process roles.

Plain `memledger run -- python3 workers_client.py ...` (default options, no
marker anywhere): a PyTorch DataLoader whose dataset caches every sample in
its two workers (fork and spawn start methods), and a multiprocessing.Pool
whose tasks keep their results. Each worker has no step of any kind, so the
report judges it over equal time windows: the whole-job verdict names the
growing worker by its role and the planted line, with a rate per second.
Two gloo ranks launched as torchrun does, one of which grows: its steps are
found without markers and the verdict names the rank. The training loop that
iterates the DataLoader has a step per batch (source "loader", from the
Python module's hook on torch.utils.data), in sampled mode and without
markers, so a leak in the loop itself is judged per step. The clean controls
do the same work and keep nothing: no suspect anywhere."""

import os
import re
import socket

import clients
import mltest

SCRIPT = os.path.join(clients.CLIENTS_DIR, "workers_client.py")
SAMPLES = 800
BATCHES = SAMPLES // 16  # the client's batch size


def leak_line(mode):
    """The client's line marked `# LEAK_SITE(mode)`."""
    with open(SCRIPT) as f:
        return next(n for n, text in enumerate(f, 1) if "# LEAK_SITE(%s)" % mode in text)


class Workers(clients.ClientTestCase):
    def run_workers(self, *args):
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.memledger("run", "-q", "-o", run_dir, "--", clients.PYTHON_TORCH, SCRIPT, "--samples",
                              str(SAMPLES), *args, env=mltest.clean_env(**clients.QUIET), timeout=240)
        self.assertExit(proc, 0)
        self.assertIn("DONE", proc.stdout)
        report = self.load_report(run_dir)
        with open(os.path.join(run_dir, "report.txt")) as f:
            text = f.read()
        return report, text

    def workers(self, report, role):
        rows = [r for r in report["job"]["rows"] if r["python_role"] == role]
        self.assertEqual(len(rows), 2, [(r["label"], r["python_role"]) for r in report["job"]["rows"]])
        self.assertEqual(sorted(r["role_index"] for r in rows), [0, 1])
        for r in rows:
            self.assertEqual(r["role_count"], 2)
            self.assertTrue(r["role"].startswith("%s %d of 2" % (role, r["role_index"])), r["role"])
        return rows

    def assert_worker_leak(self, report, text, role, mode):
        line = leak_line(mode)
        site = "workers_client.py:%d" % line
        conclusion = report["job"]["conclusion"]
        self.assertRegex(conclusion, r"^%s [01] of 2 \(pid \d+\) grows fastest: [\d.]+ [KMG]iB/s" % role, conclusion)
        self.assertIn(site, conclusion)
        self.assertIn("whole job: " + conclusion, text)
        for row in self.workers(report, role):
            self.assertTrue(row["time_windows"])
            self.assertEqual(row["suspects"], 1, row)
            self.assertIn(site, row["top_site"])
            process = report["processes"][row["process"]]
            self.assertEqual(process["step_source"], "time")
            self.assertRegex(process["step_inference"], r"^20 equal time windows of [\d.e-]+ s over the")
            self.assertFalse(process["growth_per_step"]["judged"])
            top = process["leak_suspects"][0]
            self.assertGreater(top["bytes_per_second"], 0)
            self.assertAlmostEqual(top["bytes_per_second"] * top["window_seconds"], top["bytes_per_step_exact"])
            # Each worker keeps about half the samples, 64 KiB each, by the
            # end of its work: the fitted growth over the 18 windows after
            # the warm-up is of that order. The fit is a slope over time: a
            # worker that grows only in part of its windows (descheduled on
            # a loaded machine, a spawned one still importing torch) reads
            # above its average (1.13x to 1.15x on an idle machine, 1.50x
            # once with the whole suite beside it); twice is a wrong figure.
            kept = SAMPLES / 2 * 65536
            grown = top["bytes_per_step_exact"] * 18
            self.assertGreater(grown, 0.5 * kept, top["site"])
            self.assertLess(grown, 2.0 * kept, top["site"])

    def assert_loader_steps(self, report):
        """The main process iterates the DataLoader: a step per batch."""
        root = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertEqual(root["step_source"], "loader", root["step_inference"])
        self.assertEqual(len(root["steps"]), BATCHES)
        return root

    def assert_clean(self, report, role):
        for row in self.workers(report, role):
            self.assertEqual(row["copied_on_write"], 0, row)
        if role == "DataLoader worker":
            self.assert_loader_steps(report)
        for p in report["processes"]:
            self.assertEqual([s["site"] for s in p["leak_suspects"]], [], p["pid"])
        self.assertRegex(report["job"]["conclusion"], r"^no process grows")

    def assert_per_training_step(self, report, text):
        """The workers' growth per step of the training loop that takes their
        batches: each worker makes half of each 16-sample batch, 64 KiB kept
        per sample, so about 512 KiB per training step."""
        root = report["processes"][report["job"]["rows"][0]["process"]]
        for row in self.workers(report, "DataLoader worker"):
            self.assertEqual(row["parent_pid"], root["pid"], row)
            self.assertGreater(row["suspect_bytes_per_parent_step"], 0.5 * 8 * 65536, row)
            self.assertLess(row["suspect_bytes_per_parent_step"], 1.5 * 8 * 65536, row)
        self.assertRegex(report["job"]["conclusion"], r"[KMG]iB/s \([\d.]+ KiB per step of pid %d\) in 1 suspect"
                         % root["pid"])

    def assert_inherited(self, report):
        """A forked worker starts from the main process's heap: its frees of
        inherited blocks are no unknown frees."""
        root = report["processes"][report["job"]["rows"][0]["process"]]
        for row in self.workers(report, "DataLoader worker"):
            process = report["processes"][row["process"]]
            inherited = process["stats"]["inherited"]
            self.assertEqual(inherited["parent"], root["pid"], inherited)
            self.assertGreater(inherited["host_live_at_fork"], 8 << 20, inherited)
            self.assertGreater(inherited["blocks"], 0, inherited)
            self.assertTrue([n for n in process["notes"] if n.startswith("forked from pid %d: it inherited" % root["pid"])],
                            process["notes"])

    def test_dataloader_fork(self):
        clients.skip_unless(self, "torch")
        report, text = self.run_workers("--mode", "dataloader", "--start", "fork", "--leak", "cache")
        self.assert_worker_leak(report, text, "DataLoader worker", "cache")
        self.assertRegex(text, r"== process \d+ \(DataLoader worker\): ")
        self.assertEqual(self.assert_loader_steps(report)["leak_suspects"], [])
        self.assert_per_training_step(report, text)
        self.assert_inherited(report)

    def test_dataloader_loop_leak(self):
        # The loop that takes the batches keeps a copy of each: 256 KiB a
        # step, found per step in sampled mode with no marker.
        clients.skip_unless(self, "torch")
        report, text = self.run_workers("--mode", "dataloader", "--leak", "main")
        root = self.assert_loader_steps(report)
        site = "workers_client.py:%d" % leak_line("main")
        self.assertTrue(root["leak_suspects"], root["notes"])
        top = root["leak_suspects"][0]
        self.assertIn(site, top["site"])
        self.assertGreater(top["bytes_per_step"], 0.7 * 262144, top)
        self.assertLess(top["bytes_per_step"], 1.3 * 262144, top)
        conclusion = report["job"]["conclusion"]
        self.assertRegex(conclusion, r"grows fastest: [\d.]+ KiB/step", conclusion)
        self.assertIn(site, conclusion)
        for row in self.workers(report, "DataLoader worker"):
            self.assertEqual(row["suspects"], 0, row)

    def test_dataloader_spawn(self):
        clients.skip_unless(self, "torch")
        report, text = self.run_workers("--mode", "dataloader", "--start", "spawn", "--leak", "cache")
        self.assert_worker_leak(report, text, "DataLoader worker", "cache")
        for row in self.workers(report, "DataLoader worker"):
            self.assertEqual(row["start_method"], "spawn")
            self.assertIn("(spawn)", row["role"])
            # A spawned worker is a new program: it inherits no heap.
            self.assertIsNone(report["processes"][row["process"]]["stats"]["inherited"])
        self.assert_per_training_step(report, text)

    def test_dataloader_clean(self):
        clients.skip_unless(self, "torch")
        report, _ = self.run_workers("--mode", "dataloader", "--leak", "none")
        self.assert_clean(report, "DataLoader worker")

    def test_small_objects_are_mapped_memory(self):
        # Three million small objects live in CPython's own arenas, mapped
        # outside malloc: counted as mapped memory, so the RSS they take is
        # explained and no note says otherwise; made once, they are no leak.
        clients.skip_unless(self, "torch")
        report, _ = self.run_workers("--mode", "objects", "--leak", "none")
        self.workers(report, "DataLoader worker")
        root = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertEqual([s["site"] for s in root["leak_suspects"]], [])
        self.assertGreater(root["steps"][-1]["live"].get("mapped", 0), 64 << 20, root["steps"][-1])
        self.assertEqual([n for n in root["notes"] if n.startswith("RSS grew")], [])
        # Each forked worker reads half the objects: their reference counts
        # are written, and the pages they sit on are copied into the worker.
        for row in self.workers(report, "DataLoader worker"):
            self.assertGreater(row["copied_on_write"], 32 << 20, row)
            notes = report["processes"][row["process"]]["notes"]
            self.assertTrue([n for n in notes if n.startswith("copy-on-write: its private memory grew")], notes)
        self.assertIn("of its parent's memory on write (copy-on-write", report["job"]["conclusion"])

    def run_ranks(self, leak):
        """Two gloo ranks started as torchrun starts them (its own launcher is
        broken on Debian's PyTorch 1.13 under Python 3.11)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        script = os.path.join(clients.CLIENTS_DIR, "ranks_client.py")
        launch = ("export MASTER_ADDR=127.0.0.1 MASTER_PORT=%d WORLD_SIZE=2; " % port +
                  " ".join("RANK=%d LOCAL_RANK=%d %s %s --leak %s &" % (r, r, clients.PYTHON_TORCH, script, leak)
                           for r in (0, 1)) + " wait")
        run_dir = os.path.join(self.tmpdir(), "ranks")
        proc = self.memledger("run", "-q", "-o", run_dir, "--", "/bin/sh", "-c", launch,
                              env=mltest.clean_env(**clients.QUIET), timeout=240)
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout.count("DONE"), 2, proc.stdout)
        return self.load_report(run_dir), script

    def test_torchrun_ranks(self):
        clients.skip_unless(self, "torch")
        report, script = self.run_ranks("rank1")
        with open(script) as f:
            line = next(n for n, text in enumerate(f, 1) if "# LEAK_SITE(rank1)" in text)
        conclusion = report["job"]["conclusion"]
        match = re.match(r"^rank 1 \(pid \d+\) grows fastest: ([\d.]+) KiB/step in 1 suspect, top site "
                         r".* at ranks_client\.py:%d; 1 of \d+ processes grows$" % line, conclusion)
        self.assertIsNotNone(match, conclusion)
        # 256 KiB kept a step; the fit over sampled step ends may miss by a little.
        self.assertAlmostEqual(float(match.group(1)), 256.0, delta=0.1 * 256, msg=conclusion)
        ranks = {r["label"].split(" (")[0]: r for r in report["job"]["rows"] if r["label"].startswith("rank")}
        self.assertEqual(sorted(ranks), ["rank 0", "rank 1"])
        self.assertEqual(ranks["rank 0"]["suspects"], 0)
        self.assertIn("rank 1 of 2", ranks["rank 1"]["role"])

    def test_torchrun_ranks_clean(self):
        clients.skip_unless(self, "torch")
        report, _ = self.run_ranks("none")
        self.assertRegex(report["job"]["conclusion"], r"^no process grows")

    def test_pool(self):
        report, text = self.run_workers("--mode", "pool", "--leak", "results")
        self.assert_worker_leak(report, text, "Pool worker", "results")

    def test_pool_clean(self):
        report, _ = self.run_workers("--mode", "pool", "--leak", "none")
        self.assert_clean(report, "Pool worker")




class TfDataService(clients.ClientTestCase):
    """A tf.data service worker in a process of its own, started by the
    training process (which runs the dispatcher and reads the distributed
    dataset), keeping 64 KiB every 10 ms: the job table names it by its
    role, and the whole-job verdict names it with the planted line."""

    def test_tfdata_service_worker(self):
        clients.skip_unless(self, "tensorflow")
        script = os.path.join(clients.CLIENTS_DIR, "tfdata_service_client.py")
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.memledger("run", "-q", "-o", run_dir, "--", clients.PYTHON_ML, script, "--leak", "worker",
                              env=mltest.clean_env(**clients.QUIET), timeout=300)
        self.assertExit(proc, 0)
        self.assertIn("ELEMENTS=800", proc.stdout)
        report = self.load_report(run_dir)
        rows = [r for r in report["job"]["rows"] if r["python_role"] == "tf.data service worker"]
        self.assertEqual(len(rows), 1, [(r["label"], r["python_role"]) for r in report["job"]["rows"]])
        self.assertRegex(rows[0]["label"], r"^tf\.data service worker 0 of 1 \(pid \d+\)$")
        with open(script) as f:
            line = next(n for n, text in enumerate(f, 1) if "# LEAK_SITE(worker)" in text)
        conclusion = report["job"]["conclusion"]
        self.assertRegex(conclusion, r"^tf\.data service worker 0 of 1 \(pid \d+\) grows fastest: [\d.]+ [KMG]iB/s")
        self.assertIn("tfdata_service_client.py:%d" % line, conclusion)
        root = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertEqual([s["site"] for s in root["leak_suspects"]], [])


if __name__ == "__main__":
    mltest.main()
