"""A JAX loop with a planted leak: a growing Python-side cache of device arrays."""
import ctypes
import sys

import jax
import jax.numpy as jnp

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
mode = sys.argv[2] if len(sys.argv) > 2 else "leak"
try:
    _step = ctypes.CDLL(None).memledger_step
    _step.argtypes = [ctypes.c_char_p]
except AttributeError:
    _step = None


@jax.jit
def train_step(w, x):
    # A gradient step on the batch mean of sum(tanh(x @ w)), whose gradient
    # x.T @ (1 - tanh(x @ w)**2) / batch has the shape of w.
    h = jnp.tanh(x @ w)
    return w - 0.01 * (x.T @ (1 - h * h)) / x.shape[0]


key = jax.random.PRNGKey(0)
w = jax.random.normal(key, (1024, 1024))
cache = []
for s in range(steps):
    x = jax.random.normal(jax.random.fold_in(key, s), (256, 1024))
    w = train_step(w, x)
    if mode in ("leak", "oom"):
        cache.append(jnp.zeros((1024 * 1024,), dtype=jnp.float32) + s)  # LEAK_LINE: 4 MiB per step
    w.block_until_ready()
    if _step:
        _step(b"train")
    print(f"STEP_DONE {s}", flush=True)
if mode == "oom":
    total = jax.devices()[0].memory_stats()["bytes_limit"]
    print(f"OOM_REQUESTED={total * 2}", flush=True)
    jnp.zeros((total * 2 // 4,), dtype=jnp.float32).block_until_ready()
