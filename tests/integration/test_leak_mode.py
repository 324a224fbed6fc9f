"""`memledger run --leak-mode`: the frameworks' allocator switches it sets.

PyTorch reads PYTORCH_ALLOC_CONF (newer) and PYTORCH_CUDA_ALLOC_CONF; the
newer wins where both are set. JAX's XLA_PYTHON_CLIENT_ALLOCATOR is chosen
for the JAX the command's interpreter has installed, and checked against
that JAX: it starts and its own check accepts the name.
"""
import os
import pathlib
import shutil
import subprocess
import tempfile
import textwrap
import unittest

from mltest import MEMLEDGER, SOURCE_DIR, TIMEOUT, clean_env

PYTHON_ML = os.environ.get("MLTEST_PYTHON_ML", str(SOURCE_DIR / ".venv" / "bin" / "python3"))
SHOW = "import os; print(*(os.environ.get(k, '-') for k in ('PYTORCH_ALLOC_CONF', 'PYTORCH_CUDA_ALLOC_CONF', " \
       "'XLA_PYTHON_CLIENT_ALLOCATOR', 'TF_GPU_ALLOCATOR')))"


def has_jax(python):
    return os.path.exists(python) and subprocess.run(
        [python, "-c", "import importlib.util as u; raise SystemExit(u.find_spec('jaxlib') is None)"],
        capture_output=True).returncode == 0


class LeakMode(unittest.TestCase):
    def run_leak_mode(self, command, **env):
        run_dir = tempfile.mkdtemp(prefix="memledger-leakmode-")
        self.addCleanup(shutil.rmtree, run_dir, ignore_errors=True)
        proc = subprocess.run([MEMLEDGER, "run", "-q", "--host", "off", "--leak-mode", "-o", run_dir, "--", *command],
                              capture_output=True, text=True, timeout=TIMEOUT, env=clean_env(**env))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        return proc.stdout.split()

    def test_pytorch_newer_variable_wins_and_both_are_set(self):
        out = self.run_leak_mode(["python3", "-c", SHOW],
                                 PYTORCH_ALLOC_CONF="expandable_segments:True,max_split_size_mb:128",
                                 PYTORCH_CUDA_ALLOC_CONF="garbage_collection_threshold:0.6")
        self.assertEqual(out[:2], ["backend:cudaMallocAsync,max_split_size_mb:128"] * 2)
        self.assertEqual(out[3], "cuda_malloc_async")

    def test_pytorch_older_variable_alone(self):
        out = self.run_leak_mode(["python3", "-c", SHOW], PYTORCH_CUDA_ALLOC_CONF="backend:native,roundup_power2_divisions:4")
        self.assertEqual(out[:2], ["backend:cudaMallocAsync,roundup_power2_divisions:4"] * 2)

    def test_no_jax_gets_the_name_every_version_accepts(self):
        if has_jax("/usr/bin/python3"):
            self.skipTest("the system Python has JAX")
        out = self.run_leak_mode(["/usr/bin/python3", "-c", SHOW])
        self.assertEqual(out[2], "platform")

    @unittest.skipUnless(has_jax(PYTHON_ML), "no JAX in the test environment")
    def test_jax_starts_with_the_chosen_allocator(self):
        # JAX here (0.10) accepts cuda_async, whose buffers are pool
        # allocations the hooks see; its "platform" falls back to BFC.
        script = textwrap.dedent("""
            import os
            import jax, jax.numpy as jnp
            from jaxlib import xla_client
            print(os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"])
            print(xla_client.generate_pjrt_gpu_plugin_options()["allocator"])
            print(float(jnp.arange(4.0).sum()))
        """)
        out = self.run_leak_mode([PYTHON_ML, "-c", script], JAX_PLATFORMS="cpu")
        self.assertEqual(out, ["cuda_async", "cuda_async", "6.0"])

    @unittest.skipUnless(has_jax(PYTHON_ML), "no JAX in the test environment")
    def test_jax_found_through_a_console_script(self):
        # A launcher script names its interpreter on its "#!" line.
        folder = pathlib.Path(tempfile.mkdtemp(prefix="memledger-script-"))
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        script = folder / "train"
        script.write_text(f"#!{PYTHON_ML}\n{SHOW}\n")
        script.chmod(0o755)
        out = self.run_leak_mode(["train"], PATH=f"{folder}:{os.environ.get('PATH', '')}")
        self.assertEqual(out[2], "cuda_async")


if __name__ == "__main__":
    unittest.main(verbosity=2)
