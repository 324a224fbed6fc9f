"""The pytest plugin (tools/python/memledger/pytest_plugin.py) from the build
tree: `pytest --memledger` re-runs the session under the preload library;
growth and peak markers fail a test naming its line; a device-kind marker
is skipped without a GPU; --memledger-report keeps a run folder with one
step per test that `memledger report` and `check` read; without
--memledger the markers change nothing; `python -m memledger` runs the
command. Debian's pytest and PyTorch."""

import json
import os
import shutil
import subprocess

import mltest
import pytest_gates

PACKAGE_DIR = os.environ.get("MLTEST_PYTHON_PACKAGE", str(mltest.SOURCE_DIR / "tools" / "python"))
PYTHON = os.environ.get("MLTEST_PYTHON_TORCH", "/usr/bin/python3")


def has_modules(*names):
    code = "import importlib.util as u, sys; sys.exit(not all(u.find_spec(n) for n in %r))" % (names,)
    return subprocess.run([PYTHON, "-c", code]).returncode == 0


@mltest.unittest.skipUnless(has_modules("pytest", "torch"), "needs pytest and PyTorch for %s (python3-pytest, "
                            "python3-torch: scripts/install-deps.sh)" % PYTHON)
class PytestPlugin(mltest.TestCase):
    def pytest(self, folder, *args):
        # The build tree's package, where the plugin finds the command beside it.
        env = mltest.clean_env(PYTHONPATH=str(mltest.BUILD_DIR / "tools" / "python"), PYTHONDONTWRITEBYTECODE="1")
        return self.run_cmd([PYTHON, "-m", "pytest", "-p", "memledger.pytest_plugin", "-v", "-rs",
                             "-p", "no:cacheprovider", *args, "test_gates.py"], env=env, cwd=folder, timeout=240)

    def test_gates_under_memledger(self):
        folder = pytest_gates.copy_suite(self)
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.pytest(folder, "--memledger-report", run_dir)
        pytest_gates.check_gates(self, proc)
        self.assertIn("memledger: run folder %s" % run_dir, proc.stderr)

        # One step per test, labelled by its id, after the start-up's.
        report = self.memledger("report", run_dir, "--format", "json")
        self.assertExit(report, 0)
        root = json.loads(report.stdout)["processes"][0]
        labels = [s["label"] for s in root["steps"]]
        self.assertEqual(labels[0], "pytest: start-up and collection")
        self.assertEqual(labels[1:], ["test_gates.py::" + name for name in (
            "test_leaks_a_tensor_per_call", "test_clean", "test_device_kind", "test_peak_over",
            "test_peak_under", "test_unmarked")])
        check = self.memledger("check", run_dir, "--max-peak", "host=16GiB", "--min-steps", "7")
        self.assertExit(check, 0)

    def test_markers_are_inert_without_memledger(self):
        folder = pytest_gates.copy_suite(self)
        proc = self.pytest(folder)
        self.assertExit(proc, 0)
        self.assertEqual(set(pytest_gates.outcomes(proc.stdout).values()), {"PASSED"}, proc.stdout)

    def test_window_names_the_body(self):
        """memledger window, the plugin's source, on its own: the growth of
        one stretch of a trace, by site."""
        script = os.path.join(self.tmpdir(), "window.py")
        with open(script, "w") as f:
            f.write("import memledger\n"
                    "kept = []\n"
                    "before = memledger.live()\n"
                    "for _ in range(3):\n"
                    "    kept.append(bytearray(1 << 20))  # grows\n"
                    "after = memledger.live()\n"
                    "print(before.seq, after.seq)\n")
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, [PYTHON, script], options=("--no-report", "--overwrite"),
                           env=mltest.clean_env(PYTHONPATH=PACKAGE_DIR))
        self.assertExit(proc, 0)
        first, last = proc.stdout.split()
        trace = [os.path.join(run_dir, n) for n in os.listdir(run_dir) if n.endswith(".mlt")][0]
        window = self.memledger("window", trace, "--from-seq", first, "--to-seq", last)
        self.assertExit(window, 0)
        host = json.loads(window.stdout)["kinds"]["host"]
        self.assertGreaterEqual(host["growth"], 3 << 20)
        self.assertRegex(host["sites"][0]["site"], r"<module> at window\.py:5$")
        self.assertEqual(host["sites"][0]["allocations"], 3)
        bad = self.memledger("window", trace, "--from-seq", last, "--to-seq", first)
        self.assertExit(bad, 2)

    def test_python_m_memledger(self):
        """`python -m memledger` runs the command that came with the package
        (here: beside it in the build tree), and says so when there is none."""
        env = mltest.clean_env(PYTHONPATH=str(mltest.BUILD_DIR / "tools" / "python"), PYTHONDONTWRITEBYTECODE="1")
        version = self.run_cmd([PYTHON, "-m", "memledger", "--version"], env=env)
        self.assertExit(version, 0)
        self.assertRegex(version.stdout, r"^memledger \d+\.\d+\.\d+")
        usage = self.run_cmd([PYTHON, "-m", "memledger", "window"], env=env)
        self.assertExit(usage, 2)
        self.assertIn("give exactly one TRACE file", usage.stderr)
        # The package alone, with no command beside it.
        alone = os.path.join(self.tmpdir(), "memledger")
        shutil.copytree(mltest.BUILD_DIR / "tools" / "python" / "memledger", alone)
        missing = self.run_cmd([PYTHON, "-m", "memledger", "--version"],
                               env=mltest.clean_env(PYTHONPATH=os.path.dirname(alone), PYTHONDONTWRITEBYTECODE="1"))
        self.assertExit(missing, 127)
        self.assertIn("the memledger command line is not installed with this Python package", missing.stderr)


if __name__ == "__main__":
    mltest.main()
