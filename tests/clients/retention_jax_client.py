"""A JAX loop that keeps every step's output in a dict, for memledger's
retention paths: who keeps the memory alive, as the report names it.

    retention_jax_client.py [--steps N] [--keep global|local|none]

--keep global: `outputs[step] = y`, a module-level dict `outputs`;
--keep local: the same in a dict `outputs` local to train(), which calls
    memledger.snapshot() before it returns;
--keep none: the clean control (only the last output is kept).
Each output is the hidden activations of a jitted function, 256 x 512
float32 values: 512 KiB a step. XLA makes it on a thread of its own, where
the report names the main thread's Python frames of the moment: the one
line dispatches the function and waits for it. memledger.step() ends each step. Prints
DONE."""

import argparse

import jax
import jax.numpy as jnp

import memledger

BATCH, FEATURES, HIDDEN = 256, 256, 512

outputs = {}


@jax.jit
def forward(w, x):
    return jax.nn.relu(x @ w)


def step_output(w, x, step):
    y = forward(w, x + step).block_until_ready()  # LEAK_SITE(output)
    memledger.step()
    return y


def weights():
    w = jax.random.normal(jax.random.PRNGKey(0), (FEATURES, HIDDEN)) * 0.05
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, FEATURES))
    return w, x


def train(steps, keep):
    w, x = weights()
    last = None
    for step in range(steps):
        y = step_output(w, x, step)
        if keep == "global":
            outputs[step] = y
        else:
            last = y
    return last


def train_local(steps):
    w, x = weights()
    outputs = {}
    for step in range(steps):
        outputs[step] = step_output(w, x, step)
    memledger.snapshot()
    return len(outputs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--keep", choices=("global", "local", "none"), default="global")
    args = parser.parse_args()
    if args.keep == "local":
        train_local(args.steps)
    else:
        train(args.steps, args.keep)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
