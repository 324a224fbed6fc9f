"""The `memledger` Python module (tools/python): found by `memledger run`
without installing anything (build tree and installed layout), harmless and
silent when the process is not traced, steps and phases recorded as step
labels, and programs that fork, spawn or use multiprocessing keep working
with the module in every process."""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import clients
import mltest

PACKAGE_DIR = os.environ.get("MLTEST_PYTHON_PACKAGE", str(mltest.SOURCE_DIR / "tools" / "python"))

API_SCRIPT = textwrap.dedent('''
    import memledger
    print("ACTIVE=%d" % memledger.active())
    print("RUN_DIR=%s" % memledger.run_dir())
    print("FILE=%s" % memledger.__file__)
    memledger.step()
    memledger.step("train")
    with memledger.phase("eval"):
        print("PHASE=%s" % memledger.current_phase())
        memledger.step()
        memledger.step("x")
        with memledger.phase("ema"):
            memledger.step()
    print("AFTER=%s" % memledger.current_phase())
    memledger.step("train")
    memledger.flush()
''')

MULTIPROCESSING_SCRIPT = textwrap.dedent('''
    import multiprocessing as mp
    import os
    import subprocess
    import sys

    import memledger

    def work(n):
        blocks = []
        for i in range(3):
            blocks.append(bytes(n + i) * 1000)
            memledger.step("worker")
        print("WORKER_PID=%d" % os.getpid(), file=sys.stderr, flush=True)
        return sum(len(b) for b in blocks)

    if __name__ == "__main__":
        results = {}
        for method in ("fork", "spawn", "forkserver"):
            with mp.get_context(method).Pool(2) as pool:
                results[method] = pool.map(work, range(4))
        p = mp.get_context("spawn").Process(target=work, args=(7,))
        p.start()
        p.join()
        pid = os.fork()
        if pid == 0:
            work(9)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        sub = subprocess.run([sys.executable, "-c", "import memledger; memledger.step(); print(memledger.active())"],
                             capture_output=True, text=True, check=True)
        memledger.step("main")
        memledger.step("main")
        print(sorted(results.items()), p.exitcode, os.waitstatus_to_exitcode(status), sub.returncode, flush=True)
        print("SUB_ACTIVE=%s" % sub.stdout.strip(), file=sys.stderr, flush=True)
''')


class PythonModule(mltest.TestCase):
    def write(self, text, name="script.py"):
        path = os.path.join(self.tmpdir(), name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_noop_when_not_traced(self):
        script = self.write(API_SCRIPT)
        proc = self.run_cmd([sys.executable, script], env=mltest.clean_env(PYTHONPATH=PACKAGE_DIR))
        self.assertExit(proc, 0)
        self.assertEqual(proc.stderr, "")
        values = mltest.parse_kv(proc.stdout)
        self.assertEqual(values["ACTIVE"], "0")
        self.assertEqual(values["RUN_DIR"], "None")
        self.assertEqual(values["PHASE"], "eval")
        self.assertEqual(values["AFTER"], "None")

    def test_noop_with_the_library_but_tracing_off(self):
        # The library is there (the C ABI resolves) but its folder cannot be
        # written: tracing is off and the module stays silent.
        script = self.write(API_SCRIPT)
        proc = self.run_cmd([sys.executable, script],
                            env=mltest.clean_env(PYTHONPATH=PACKAGE_DIR, LD_PRELOAD=mltest.LIBRARY,
                                                 MEMLEDGER_DIR="/proc/memledger-cannot-write"))
        self.assertExit(proc, 0)
        values = mltest.parse_kv(proc.stdout)
        self.assertEqual(values["ACTIVE"], "0")
        self.assertEqual(values["RUN_DIR"], "None")

    def test_found_by_memledger_run_with_steps_and_phases(self):
        script = self.write(API_SCRIPT)
        own = self.tmpdir()
        with open(os.path.join(own, "their_module.py"), "w") as f:
            f.write("VALUE = 42\n")
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [sys.executable, "-c", "import their_module; exec(open(%r).read())" % script],
                           env=mltest.clean_env(PYTHONPATH=own))  # the user's PYTHONPATH is kept
        self.assertExit(proc, 0)
        values = mltest.parse_kv(proc.stdout)
        self.assertEqual(values["ACTIVE"], "1")
        self.assertEqual(os.path.realpath(values["RUN_DIR"]), os.path.realpath(run_dir))
        self.assertTrue(values["FILE"].startswith(os.path.join(mltest.BUILD_DIR, "tools", "python")), values["FILE"])
        r = self.load_report(run_dir)
        self.assertEqual(r["step_source"], "marker")
        self.assertEqual([s["label"] for s in r["steps"]], ["", "train", "eval", "eval/x", "ema", "train"])

    def test_framework_builds_are_read_without_loading_cudnn(self):
        # The environment block names the program's torch and its cuDNN.
        # torch.backends.cudnn.version() loads cuDNN 9's libraries (50 MiB
        # of them with PyPI's PyTorch 2.15): memledger asks only what the
        # program's torch already found, else the version it was built with.
        # A stand-in torch says when version() is called.
        fake = self.tmpdir()
        os.makedirs(os.path.join(fake, "torch", "backends", "cudnn"))
        files = {
            "torch/__init__.py": "__version__ = '9.9.9'\n"
                                 "class version:\n    cuda = '13.2'\n"
                                 "from torch import _C, backends\n",
            "torch/_C.py": "class _cudnn:\n    @staticmethod\n    def getCompileVersion():\n"
                           "        return (9, 26, 0)\n",
            "torch/backends/__init__.py": "from torch.backends import cudnn\n",
            "torch/backends/cudnn/__init__.py": "import sys\n__cudnn_version = None\n"
                                                "def version():\n"
                                                "    print('CUDNN LOADED', file=sys.stderr, flush=True)\n"
                                                "    return 92600\n",
        }
        for name, text in files.items():
            with open(os.path.join(fake, name), "w") as f:
                f.write(text)
        script = self.write("import torch\nimport memledger\nmemledger.step()\nprint('DONE')\n")
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [sys.executable, script], env=mltest.clean_env(PYTHONPATH=fake))
        self.assertExit(proc, 0)
        self.assertIn("DONE", proc.stdout)
        self.assertNotIn("CUDNN LOADED", proc.stderr)
        environment = self.load_report(run_dir)["environment"]
        self.assertEqual(environment["frameworks"]["torch"]["cudnn"], "9.26.0 at build (not loaded by the program)")
        self.assertIn("torch 9.9.9, cuda 13.2, cudnn 9.26.0 at build (not loaded by the program)",
                      environment["lines"])

    def test_installed_layout(self):
        prefix = self.tmpdir()
        for sub in ("bin", "lib", "share/memledger/python"):
            os.makedirs(os.path.join(prefix, sub))
        shutil.copy2(mltest.MEMLEDGER, os.path.join(prefix, "bin", "memledger"))
        shutil.copy2(mltest.LIBRARY, os.path.join(prefix, "lib", "libmemledger.so"))
        shutil.copytree(os.path.join(PACKAGE_DIR, "memledger"),
                        os.path.join(prefix, "share", "memledger", "python", "memledger"),
                        ignore=shutil.ignore_patterns("meson.build", "__pycache__"))
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.run_cmd([os.path.join(prefix, "bin", "memledger"), "run", "-q", "-o", run_dir, "--",
                             sys.executable, "-c", "import memledger; print(memledger.active(), memledger.__file__)"])
        self.assertExit(proc, 0)
        active, path = proc.stdout.split()
        self.assertEqual(active, "True")
        self.assertEqual(os.path.realpath(path),
                         os.path.realpath(os.path.join(prefix, "share/memledger/python/memledger/__init__.py")))

    def test_fork_spawn_and_multiprocessing_keep_working(self):
        script = self.write(MULTIPROCESSING_SCRIPT)
        direct = self.run_cmd([sys.executable, script], env=mltest.clean_env(PYTHONPATH=PACKAGE_DIR), timeout=120)
        self.assertExit(direct, 0)
        self.assertIn("SUB_ACTIVE=False", direct.stderr)
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [sys.executable, script], options=(), timeout=180)
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout, direct.stdout)
        self.assertIn("SUB_ACTIVE=True", proc.stderr)
        r = self.load_report(run_dir)
        self.assertEqual(r["problems"], [])
        self.assertEqual([s["label"] for s in r["steps"]], ["main", "main"])
        by_pid = {p["pid"]: p for p in r["processes"]}
        workers = {int(pid) for pid in re.findall(r"WORKER_PID=(\d+)", proc.stderr)}
        self.assertGreaterEqual(len(workers), 4)
        for pid in workers:
            self.assertIn(pid, by_pid, "no trace for worker %d" % pid)
            labels = [s["label"] for s in by_pid[pid]["steps"]]
            # A pool worker runs several tasks: a multiple of 3 steps.
            self.assertTrue(labels and len(labels) % 3 == 0 and set(labels) == {"worker"}, (pid, labels))
        for p in r["processes"]:
            self.assertIn(p["verdict"]["kind"], ("exit", "exec", "signal"), (p["command"], p["verdict"]))

    def test_keras_callback_is_harmless_when_not_traced(self):
        clients.skip_unless(self, "tensorflow")
        proc = self.run_cmd([clients.PYTHON_ML, "-c", textwrap.dedent('''
            import memledger.keras
            cb = memledger.keras.StepCallback(eval_label="eval")
            cb.on_train_batch_end(0)
            cb.on_test_batch_end(0)
            print("OK")
        ''')], env=mltest.clean_env(PYTHONPATH=PACKAGE_DIR, **clients.QUIET), timeout=120)
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout.strip(), "OK")

    def test_lightning_callback(self):
        python = clients.PYTHON_LIGHTNING
        probe = subprocess.run([python, "-c", "import pytorch_lightning"], capture_output=True, text=True,
                               env=mltest.clean_env(PYTHONWARNINGS="ignore"), timeout=120) \
            if os.access(python, os.X_OK) else None
        if probe is None or probe.returncode != 0:
            why = "not found" if probe is None else (probe.stderr.strip().splitlines() or ["?"])[-1]
            print("SKIP lightning: %s cannot import pytorch_lightning: %s (scripts/install-deps.sh)" % (python, why),
                  flush=True)
            self.skipTest("PyTorch Lightning is not installed")
        script = self.write(textwrap.dedent('''
            import sys
            import torch
            try:
                import lightning.pytorch as pl
            except ImportError:
                import pytorch_lightning as pl
            import memledger.lightning

            class Model(pl.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.layer = torch.nn.Linear(16, 1)
                def training_step(self, batch, batch_idx):
                    x, y = batch
                    return torch.nn.functional.mse_loss(self.layer(x), y)
                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    return torch.nn.functional.mse_loss(self.layer(x), y)
                def configure_optimizers(self):
                    return torch.optim.SGD(self.parameters(), lr=0.1)
                # Debian's PyTorch 1.13 cannot import torch.distributed._shard
                # on Python 3.11 (a dataclass with a mutable default), which
                # Lightning 1.6 imports to register sharded-tensor hooks that
                # this model has no use for.
                def _register_sharded_tensor_state_dict_hooks_if_available(self):
                    pass

            eval_label = sys.argv[1] if len(sys.argv) > 1 else None
            train = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
            val = torch.utils.data.TensorDataset(torch.randn(16, 16), torch.randn(16, 1))
            trainer = pl.Trainer(max_epochs=2, callbacks=[memledger.lightning.StepCallback(eval_label=eval_label)],
                                 enable_progress_bar=False, enable_checkpointing=False, logger=False,
                                 num_sanity_val_steps=0, enable_model_summary=False)
            trainer.fit(Model(), torch.utils.data.DataLoader(train, batch_size=8),
                        torch.utils.data.DataLoader(val, batch_size=8))
            print("FIT_DONE", flush=True)
        '''))
        env = mltest.clean_env(PYTHONWARNINGS="ignore")
        # Two epochs of 8 training batches, each epoch followed by 2
        # validation batches: by default those are part of the next training
        # step; with an eval label each ends a step of its own.
        cases = [((), ["train"] * 16), (("eval",), (["train"] * 8 + ["eval"] * 2) * 2)]
        for args, labels in cases:
            run_dir = os.path.join(self.tmpdir(), "run-" + "-".join(args or ("default",)))
            proc = self.traced(run_dir, [python, script, *args], options=(), env=env, timeout=240)
            self.assertExit(proc, 0)
            self.assertIn("FIT_DONE", proc.stdout)
            r = self.load_report(run_dir)
            self.assertEqual(r["step_source"], "marker")
            self.assertEqual([s["label"] for s in r["steps"]], labels)


if __name__ == "__main__":
    mltest.main()
