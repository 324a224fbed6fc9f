"""A small JAX training loop (jit, grad, CPU) with a planted leak of the kind
people hit, for memledger's integration tests.

    jax_client.py [--steps N] [--leak cache|outputs|dict|none] [--markers step|none]

--leak cache: every batch is normalised on the host, put on the device
    (jax.device_put) and cached in a dict keyed by the batch's id "to reuse
    it", but ids never repeat: one 256 KiB array more per step. XLA copies
    the normalised array, or keeps it as it is when numpy's buffer happens to
    be 64-byte aligned (even with may_alias=False): the block kept is made
    by one of two stacks, both under the planted line.
--leak outputs: every step's hidden activations over four batches (the
    output of a jitted function, 512 KiB) are kept in a list "for later". XLA makes output
    buffers on its own threads, which never run Python.
--leak dict: the same activations (512 KiB) kept in a dict keyed by the
    step "for later".
--leak none: the clean control (the same cache, keyed by a slot that
    repeats every 4 steps: it fills up and stays).
--markers step: ends each step with memledger.step(); none: no marker (the
    report then infers the steps).

Machine-readable output on stdout: LEAK_FILE and LEAK_LINE (the line of this
file on the stack of the leaking allocation), LEAK_BYTES (bytes per step),
STEPS, then DONE.
"""
import argparse
import os

import planted

import jax
import jax.numpy as jnp
import numpy as np

try:
    import memledger
except ImportError:  # run without `memledger run`
    memledger = None

BATCH, FEATURES, HIDDEN, CLASSES = 128, 512, 256, 10
OUTPUT_BATCHES = 4  # --leak outputs keeps the activations of this many batches a step


def loss_fn(params, x, y):
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@jax.jit
def hidden_layer(params, x):
    return jax.nn.relu(x @ params["w1"] + params["b1"])


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--leak", choices=("cache", "outputs", "dict", "none"), default="cache")
    parser.add_argument("--markers", choices=("step", "none"), default="step")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) * 0.05,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) * 0.05,
        "b2": jnp.zeros(CLASSES),
    }
    normalized_cache = {}
    activations = []
    history = {}
    loss = None
    for step in range(args.steps):
        raw = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)
        labels = rng.integers(0, CLASSES, BATCH)
        batch_id = step if args.leak == "cache" else step % 4
        if batch_id not in normalized_cache:
            # With --leak cache, ids never repeat.
            normalized_cache[batch_id] = jax.device_put((raw - raw.mean(0)) / (raw.std(0) + 1e-6), may_alias=False)  # LEAK_SITE(cache)
        if args.leak in ("outputs", "dict"):
            batches = jnp.tile(normalized_cache[batch_id], (OUTPUT_BATCHES, 1))
        if args.leak == "outputs":
            activations.append(hidden_layer(params, batches))  # LEAK_SITE(outputs)
        if args.leak == "dict":
            history[step] = hidden_layer(params, batches)  # LEAK_SITE(dict)
        params, loss = train_step(params, normalized_cache[batch_id], labels)
        loss.block_until_ready()  # WAIT_FOR_STEP
        if memledger is not None and args.markers == "step":
            memledger.step()
    print("LEAK_FILE=%s" % os.path.basename(__file__))
    print("LEAK_LINE=%d" % planted.leak_line(__file__, args.leak))
    kept = OUTPUT_BATCHES * BATCH * HIDDEN if args.leak in ("outputs", "dict") else BATCH * FEATURES
    print("LEAK_BYTES=%d" % (kept * 4))
    print("STEPS=%d" % args.steps)
    print("DONE loss=%.4f cached=%d" % (float(loss), len(normalized_cache)), flush=True)


if __name__ == "__main__":
    main()
