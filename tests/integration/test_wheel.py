"""The wheel: `pip wheel .` (meson-python, -Dpython_package=true) builds it
once; its binaries need nothing beyond glibc (ldd; the preload library
also GCC's libgcc_s, on purpose); installed into a clean virtual
environment (with Debian's PyTorch visible), its `memledger` command traces
the bundled example, `python -m memledger` works, and `pytest --memledger`
gates a small suite through the plugin's entry point.

The build is pyproject.toml's own, made fast for the suite: `pip wheel
--no-build-isolation` from .venv (meson-python from PyPI, installed by
scripts/install-deps.sh, driving Debian's meson and ninja that configured
build/) into build-wheel/, a sibling of the build folder. Its compile
commands are then build/'s, byte for byte (same build type, same relative
paths; ccache is set up with hash_dir = false), so ccache serves every
object that build/ compiled and the wheel costs a configure, the links and
the packing; the folder is kept, so a second run rebuilds only what
changed."""

import json
import os
import re
import subprocess
import sys
import time
import zipfile

import mltest
import pytest_gates

VENV = mltest.SOURCE_DIR / ".venv"
WHEEL_BUILD_DIR = mltest.BUILD_DIR.with_name(mltest.BUILD_DIR.name + "-wheel")
BUILD_TIMEOUT = 900
# What a binary may need from the system: glibc's own libraries.
GLIBC = re.compile(r"^(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|ld-linux-x86-64\.so\.2|"
                   r"lib(c|m|dl|pthread|rt)\.so\.\d+)\b")


def build_tools_missing():
    python = VENV / "bin" / "python3"
    if not python.exists():
        return "no %s" % VENV
    code = "import importlib.util as u, sys; sys.exit(not u.find_spec('mesonpy'))"
    if subprocess.run([str(python), "-c", code]).returncode != 0:
        return "meson-python missing from %s" % VENV
    return None


MISSING = build_tools_missing()
if MISSING:
    # Visible in the suite's log: the wheel is not checked on this machine.
    print("test_wheel: SKIPPED: %s (scripts/install-deps.sh installs it from PyPI; no network?)" % MISSING,
          file=sys.stderr)


@mltest.unittest.skipIf(MISSING, "the wheel's build backend is missing: %s" % MISSING)
class Wheel(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dist = cls.class_tmpdir()
        started = time.monotonic()
        proc = cls.run_cmd([VENV / "bin" / "python3", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                            "--disable-pip-version-check", "-w", cls.dist,
                            "--config-settings=build-dir=%s" % WHEEL_BUILD_DIR,
                            # Two compile jobs: the other tests run beside it.
                            "--config-settings=compile-args=-j2", mltest.SOURCE_DIR],
                           timeout=BUILD_TIMEOUT)
        cls.build_seconds = time.monotonic() - started
        print("test_wheel: the wheel built in %.0f s" % cls.build_seconds, file=sys.stderr)
        if proc.returncode != 0:
            raise AssertionError("pip wheel failed:\n" + proc.stdout[-4000:] + proc.stderr[-4000:])
        wheels = [n for n in os.listdir(cls.dist) if n.endswith(".whl")]
        assert len(wheels) == 1, wheels
        cls.wheel = os.path.join(cls.dist, wheels[0])
        print("test_wheel: %s, %d bytes" % (wheels[0], os.path.getsize(cls.wheel)), file=sys.stderr)
        cls.venv = os.path.join(cls.class_tmpdir(), "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", cls.venv], check=True)
        proc = cls.run_cmd([os.path.join(cls.venv, "bin", "pip"), "install", "--no-index", "--no-deps",
                            "--disable-pip-version-check", cls.wheel], timeout=300)
        if proc.returncode != 0:
            raise AssertionError("pip install failed:\n" + proc.stdout[-4000:] + proc.stderr[-4000:])

    def venv_env(self):
        env = mltest.clean_env(PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        env["PATH"] = os.path.join(self.venv, "bin") + os.pathsep + env.get("PATH", "")
        return env

    def bin(self, name):
        return os.path.join(self.venv, "bin", name)

    def test_contents_need_only_glibc(self):
        with zipfile.ZipFile(self.wheel) as z:
            names = set(z.namelist())
            entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
        for name in ("memledger/_native/memledger", "memledger/_native/libmemledger.so", "memledger/__init__.py",
                     "memledger/__main__.py", "memledger/pytest_plugin.py", "memledger/keras.py"):
            self.assertIn(name, names)
        self.assertRegex(entry_points, r"(?m)^memledger = memledger\.__main__:main$")
        self.assertRegex(entry_points, r"(?s)\[pytest11\]\s*memledger = memledger\.pytest_plugin")
        self.assertFalse([n for n in names if "/deps/" in n or n.endswith(".a")])
        site = subprocess.run([self.bin("python3"), "-c", "import memledger, os; print(os.path.dirname(memledger.__file__))"],
                              capture_output=True, text=True, env=self.venv_env(), check=True).stdout.strip()
        self.assertTrue(site.startswith(self.venv), site)
        binaries = [os.path.join(site, "_native", n) for n in sorted(os.listdir(os.path.join(site, "_native")))]
        self.assertGreaterEqual(len(binaries), 2)
        for path in binaries:
            ldd = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
            for line in ldd.splitlines():
                # The preload library unwinds a program's std::bad_alloc through
                # its hooks with the process's one libgcc_s (README, "Exports").
                if os.path.basename(path) == "libmemledger.so" and line.strip().startswith("libgcc_s.so.1 "):
                    continue
                self.assertRegex(line.strip(), GLIBC, "%s needs more than glibc:\n%s" % (path, ldd))

    def test_traces_the_bundled_example(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        example = mltest.SOURCE_DIR / "examples" / "train_leak.py"
        proc = self.run_cmd([self.bin("memledger"), "run", "-q", "-o", run_dir, "--", "python", example,
                             "--steps", "12"], env=self.venv_env(), cwd=self.tmpdir(), timeout=240)
        self.assertExit(proc, 0)
        report = self.load_report(run_dir)
        root = report["processes"][0]
        self.assertEqual(len(root["steps"]), 12)
        self.assertIn("train_leak.py", root["leak_suspects"][0]["site"])
        version = self.run_cmd([self.bin("python3"), "-m", "memledger", "--version"], env=self.venv_env())
        self.assertExit(version, 0)
        self.assertRegex(version.stdout, r"^memledger \d+\.\d+\.\d+")
        again = self.run_cmd([self.bin("python3"), "-m", "memledger", "report", run_dir, "--format", "json"],
                             env=self.venv_env())
        self.assertExit(again, 0)
        self.assertEqual(len(json.loads(again.stdout)["processes"][0]["steps"]), 12)

    def test_pytest_gates_from_the_entry_point(self):
        folder = pytest_gates.copy_suite(self)
        proc = self.run_cmd([self.bin("python3"), "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
                             "--memledger", "test_gates.py"], env=self.venv_env(), cwd=folder, timeout=240)
        pytest_gates.check_gates(self, proc)


if __name__ == "__main__":
    mltest.main()
