"""A PyTorch Lightning callback that ends a memledger step after every
training batch.

    trainer = lightning.Trainer(callbacks=[memledger.lightning.StepCallback()])

Works with the `lightning` package and with `pytorch_lightning`; a no-op
when the process is not traced.
"""

import memledger

try:
    from lightning.pytorch import Callback as _Callback
except ImportError:
    from pytorch_lightning import Callback as _Callback

__all__ = ["StepCallback"]


class StepCallback(_Callback):
    """Ends one memledger step per training batch (label `train_label`).
    With `eval_label` set, each validation batch ends a step too, with that
    label; by default validation batches are part of the training step that
    follows them. With gradient accumulation, a step is one batch, not one
    optimizer step."""

    def __init__(self, train_label="train", eval_label=None):
        super().__init__()
        self.train_label = train_label
        self.eval_label = eval_label

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        memledger.step(self.train_label)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.eval_label is not None:
            memledger.step(self.eval_label)
