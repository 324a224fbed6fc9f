"""A Keras callback that ends a memledger step after every training batch.

    model.fit(dataset, epochs=3, callbacks=[memledger.keras.StepCallback()])

Works with Keras 3 and with tf.keras; a no-op when the process is not traced.
"""

import memledger

try:
    import keras as _keras

    _Callback = _keras.callbacks.Callback
except ImportError:  # TensorFlow's bundled Keras 2
    from tensorflow import keras as _keras

    _Callback = _keras.callbacks.Callback

__all__ = ["StepCallback"]


class StepCallback(_Callback):
    """Ends one memledger step per training batch (label `train_label`).
    With `eval_label` set, each evaluation batch (validation inside fit, or
    `model.evaluate`) ends a step too, with that label; by default evaluation
    batches are part of the training step that follows them."""

    def __init__(self, train_label="train", eval_label=None):
        super().__init__()
        self.train_label = train_label
        self.eval_label = eval_label

    def on_train_batch_end(self, batch, logs=None):
        memledger.step(self.train_label)

    def on_test_batch_end(self, batch, logs=None):
        if self.eval_label is not None:
            memledger.step(self.eval_label)
