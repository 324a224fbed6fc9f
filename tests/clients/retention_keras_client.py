"""A Keras model.fit whose callback keeps every batch's logits, for
memledger's retention paths: who keeps the memory alive, as the report
names it.

    retention_keras_client.py [--steps N] [--keep logits|variables|both|none]

--keep logits: the KeepLogits callback appends the model's logits on a probe
    batch (eager tf.Tensors) to its list attribute `kept` after every training
    batch;
--keep variables: it appends a tf.Variable of their softmax (a buffer of its
    own) to its list attribute `copies`;
--keep both: both;
--keep none: the clean control (only the last logits are kept).
The callback is reached from a module-level list `callbacks`. Each kept item
is 128 x 1000 float32 values: 500 KiB a step. memledger.keras.StepCallback
ends the steps. Prints DONE."""

import argparse
import os

import keras_model

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import memledger.keras  # noqa: E402

BATCH, FEATURES, HIDDEN, CLASSES, PROBE = 64, 256, 128, 1000, 128


class KeepLogits(tf.keras.callbacks.Callback):
    def __init__(self, keep):
        super().__init__()
        self.probe = tf.random.normal([PROBE, FEATURES], seed=1)
        self.keep = keep
        self.kept = []
        self.copies = []
        self.last = None

    def on_train_batch_end(self, batch, logs=None):
        logits = self.model(self.probe, training=False)  # LEAK_SITE(logits)
        if self.keep in ("logits", "both"):
            self.kept.append(logits)
        if self.keep in ("variables", "both"):
            self.copies.append(tf.Variable(tf.nn.softmax(logits), trainable=False))  # LEAK_SITE(variables)
        if self.keep == "none":
            self.last = logits


callbacks = []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--keep", choices=("logits", "variables", "both", "none"), default="logits")
    args = parser.parse_args()
    model = keras_model.small_classifier(tf, FEATURES, HIDDEN, CLASSES)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * args.steps, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, BATCH * args.steps)
    callbacks.extend([KeepLogits(args.keep), memledger.keras.StepCallback()])
    model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=callbacks, shuffle=False, verbose=0)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
