"""A small Keras model trained with model.fit on a tf.data generator (CPU),
with one planted leak of the kinds people hit, for memledger's integration
tests.

    tf_client.py [--steps N] [--leak callback|generator|py_function|none] [--markers callback|none]

--leak callback: a callback keeps the model's predictions on a probe batch
    after every training batch (to plot them later): 500 KB per step.
--leak generator: the tf.data generator keeps every batch array it creates
    in a list: 256 KiB per step (and a few batches ahead: tf.data prefetches).
--leak py_function: the batches are made by a tf.py_function inside the
    pipeline's map (on tf.data's own threads), which keeps every array it makes.
--leak none: the clean control (the same callback and generator, nothing kept).
--markers callback: memledger.keras.StepCallback ends each step; none: no
    marker (the report then infers the steps).

Machine-readable output on stdout: LEAK_FILE and LEAK_LINE (the line of this
file on the stack of the leaking allocation), LEAK_BYTES (bytes per step),
STEPS, then DONE.
"""
import argparse
import os

import keras_model
import planted

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

try:
    import memledger
    import memledger.keras
except ImportError:  # run without `memledger run`
    memledger = None

BATCH, FEATURES, HIDDEN, CLASSES, PROBE = 128, 512, 256, 1000, 128


def make_dataset(keep):
    rng = np.random.default_rng(0)

    # The generator yields NumPy arrays, as input pipelines usually do. Eager
    # TensorFlow ops inside a from_generator generator really grow TF's own
    # function runtime by ~30 KiB per batch (graph copies kept per call, seen
    # in full host mode), which would leave the clean control unclean.
    def batches():
        while True:
            x = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)  # LEAK_SITE(generator)
            y = rng.integers(0, CLASSES, BATCH)
            if keep is not None:
                keep.append(x)  # the planted leak: every batch kept
            yield x, y

    signature = (tf.TensorSpec([BATCH, FEATURES], tf.float32), tf.TensorSpec([BATCH], tf.int64))
    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def make_py_function_dataset(keep):
    rng = np.random.default_rng(0)

    def batch(index):
        x = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)  # LEAK_SITE(py_function)
        keep.append(x)  # the planted leak: the function keeps every batch it makes
        return x, rng.integers(0, CLASSES, BATCH)

    def load(index):
        x, y = tf.py_function(batch, [index], [tf.float32, tf.int64])
        x.set_shape([BATCH, FEATURES])
        y.set_shape([BATCH])
        return x, y

    return tf.data.Dataset.range(1 << 40).map(load)


class ProbePredictions(tf.keras.callbacks.Callback):
    """Predicts a fixed probe batch after every training batch."""

    def __init__(self, keep):
        super().__init__()
        self.probe = tf.random.normal([PROBE, FEATURES], seed=1)
        self.keep = keep
        self.last = None

    def on_train_batch_end(self, batch, logs=None):
        predictions = self.model(self.probe, training=False)  # LEAK_SITE(callback)
        if self.keep:
            self.kept = getattr(self, "kept", [])
            self.kept.append(predictions)  # the planted leak: every batch's predictions kept
        else:
            self.last = predictions


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--leak", choices=("callback", "generator", "py_function", "none"), default="callback")
    parser.add_argument("--markers", choices=("callback", "none"), default="callback")
    args = parser.parse_args()

    model = keras_model.small_classifier(tf, FEATURES, HIDDEN, CLASSES)
    generator_kept = [] if args.leak == "generator" else None
    callbacks = [ProbePredictions(keep=args.leak == "callback")]
    if memledger is not None and args.markers == "callback":
        callbacks.append(memledger.keras.StepCallback())
    py_function_kept = []
    dataset = make_py_function_dataset(py_function_kept) if args.leak == "py_function" else make_dataset(generator_kept)
    history = model.fit(dataset, epochs=1, steps_per_epoch=args.steps,
                        callbacks=callbacks, shuffle=False, verbose=0)
    print("LEAK_FILE=%s" % os.path.basename(__file__))
    print("LEAK_LINE=%d" % planted.leak_line(__file__, args.leak))
    print("LEAK_BYTES=%d" % (PROBE * CLASSES * 4 if args.leak == "callback" else BATCH * FEATURES * 4))
    print("STEPS=%d" % args.steps)
    print("DONE loss=%.4f" % history.history["loss"][-1], flush=True)


if __name__ == "__main__":
    main()
