"""Shared helpers for the tests that run the real framework clients of
tests/clients (PyTorch, TensorFlow/Keras, JAX) under memledger; not a test
itself.

The interpreters come from tests/integration/meson.build: MLTEST_PYTHON_TORCH
(Debian's /usr/bin/python3 with python3-torch) and MLTEST_PYTHON_ML (the
virtual environment scripts/install-deps.sh makes, with tensorflow-cpu and
jax), and MLTEST_PYTHON_LIGHTNING (the one with pytorch-lightning on
Debian's PyTorch). A framework that is missing skips its tests with a message naming what
to install.
"""

import functools
import os
import subprocess

import mltest

CLIENTS_DIR = os.environ.get("MLTEST_CLIENTS_DIR", str(mltest.SOURCE_DIR / "tests" / "clients"))
PYTHON_TORCH = os.environ.get("MLTEST_PYTHON_TORCH", "/usr/bin/python3")
PYTHON_ML = os.environ.get("MLTEST_PYTHON_ML", str(mltest.SOURCE_DIR / ".venv" / "bin" / "python3"))
PYTHON_LIGHTNING = os.environ.get("MLTEST_PYTHON_LIGHTNING",
                                  str(mltest.SOURCE_DIR / ".venv-lightning" / "bin" / "python3"))

# Frameworks keep their logs to themselves.
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONWARNINGS": "ignore"}

FRAMEWORKS = {
    # name: (interpreter, module to import, client script, how to get it)
    "torch": (PYTHON_TORCH, "torch", "torch_client.py", "apt-get install python3-torch"),
    "tensorflow": (PYTHON_ML, "tensorflow", "tf_client.py", "scripts/install-deps.sh (pip: tensorflow-cpu)"),
    "jax": (PYTHON_ML, "jax", "jax_client.py", "scripts/install-deps.sh (pip: jax[cpu])"),
}


@functools.lru_cache(maxsize=None)
def missing(framework):
    """Why `framework` cannot run here, or None when it can."""
    python, module, _, how = FRAMEWORKS[framework]
    if not os.access(python, os.X_OK):
        return "%s not found (%s)" % (python, how)
    probe = subprocess.run([python, "-c", "import %s" % module], capture_output=True, text=True,
                           env=mltest.clean_env(**QUIET), timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return "%s cannot import %s: %s (%s)" % (python, module, last, how)
    return None


def skip_unless(test, framework):
    reason = missing(framework)
    if reason is not None:
        print("SKIP %s: %s" % (framework, reason), flush=True)
        test.skipTest(reason)


class ClientRun:
    """One client run under `memledger run`: its process, its report, and
    what the client printed about its planted leak."""

    def __init__(self, proc, report, values):
        self.proc = proc
        self.report = report
        self.values = values

    @property
    def steps(self):
        return int(self.values["STEPS"])

    @property
    def leak_bytes(self):
        return int(self.values["LEAK_BYTES"])

    @property
    def leak_site(self):
        return self.values["LEAK_FILE"], int(self.values["LEAK_LINE"])


def run_client(case, framework, run_dir, *args, options=()):
    """Runs tests/clients/<client> ARGS under `memledger run -q -o RUN_DIR
    OPTIONS` (default host mode: sampled) and returns a ClientRun."""
    python, _, script, _ = FRAMEWORKS[framework]
    proc = case.memledger("run", "-q", "-o", run_dir, *options, "--", python, os.path.join(CLIENTS_DIR, script),
                          *args, env=mltest.clean_env(**QUIET), timeout=180)
    report = mltest.TestCase.load_report(run_dir) if os.path.exists(os.path.join(run_dir, "report.json")) else None
    return ClientRun(proc, report, mltest.parse_kv(proc.stdout))


class ClientTestCase(mltest.TestCase):
    def assertCompleted(self, run):
        self.assertExit(run.proc, 0)
        self.assertIn("DONE", run.proc.stdout, run.proc.stdout)
        self.assertIsNotNone(run.report, "no report.json")
        self.assertEqual(run.report["verdict"]["kind"], "exit")

    def assertTopSuspectIsTheLeak(self, run, low=0.75):
        """The top growth suspect grows by the planted bytes per step (the
        right order of magnitude: tf.data prefetch and autograd bookkeeping
        add a little; in sampled mode, so do sampled allocations of the same
        site). A sampled estimate may miss that range by up to three of its
        own standard deviations (the report's ±): with ~2 samples a step over
        20 steps, one deviation is ~16%."""
        suspects = run.report["leak_suspects"]
        self.assertTrue(suspects, "no growth suspect; notes: %s" % run.report["notes"])
        top = suspects[0]
        self.assertEqual(top["kind"], "host")
        estimate, slack = top["bytes_per_step_exact"], 3 * top.get("bytes_per_step_error", 0)
        what = "%s: %.0f ± %.0f B/step" % (top["site"], estimate, slack / 3)
        self.assertGreaterEqual(estimate + slack, low * run.leak_bytes, what)
        self.assertLessEqual(estimate - slack, 1.5 * run.leak_bytes, what)
        return top

    def assertNamesPlantedLine(self, suspect, run):
        """The suspect's stack (Python frames first) holds the client's line
        whose allocation the leak keeps."""
        name, line = run.leak_site
        frames = ["%s:%s" % (os.path.basename(f.get("file") or ""), f.get("line")) for f in suspect["stack"]]
        self.assertIn("%s:%d" % (name, line), frames, "top suspect %s; stack %s" % (suspect["site"], frames[:12]))

    def assertAttributedToTheLoop(self, suspect, run):
        # XLA makes output buffers on its own threads, which never ran
        # Python: the suspect's Python frames are the main thread's at that
        # moment, marked as attributed. With asynchronous dispatch the main
        # thread may be at the dispatching line or already waiting for the
        # step: the line named is one of the loop's.
        python = [f for f in suspect["stack"] if f["language"] == "python"]
        self.assertTrue(python and all(f["attributed"] for f in python), suspect["stack"][:4])
        self.assertTrue(suspect["site"].endswith("(attributed from the main thread)"), suspect["site"])
        first = run.leak_site[1]
        with open(os.path.join(CLIENTS_DIR, "jax_client.py")) as f:
            last = next(n for n, text in enumerate(f, 1) if "# WAIT_FOR_STEP" in text)
        self.assertEqual((python[0]["function"], os.path.basename(python[0]["file"])), ("main", "jax_client.py"))
        self.assertIn(python[0]["line"], range(first, last + 1), suspect["site"])
