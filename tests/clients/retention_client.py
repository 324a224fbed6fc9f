"""A PyTorch loop that keeps every step's output, for memledger's retention
paths: who keeps the memory alive, as the report names it.

    retention_client.py [--steps N] [--keep global|attribute|local|none] [--fake]

--keep global: the outputs (with their autograd graph) go to a module-level
    list `history`;
--keep attribute: detached copies go to `trainer.cache`, a dict attribute of
    a module-level object;
--keep local: the outputs go to a list local to train(), which calls
    memledger.snapshot() before it returns;
--keep none: the clean control.
--fake: also keep a fake tensor and a meta tensor of 4 MB each, as
    torch.compile leaves behind (they own no memory), and say on stderr when
    anything asks a meta storage for its data pointer (a fake tensor's
    data_ptr() warns on PyTorch 2.3 and later).
Each kept output is 64 x 1024 float32 values: 256 KiB a step. No step
marker: the report finds the steps itself. Prints DONE."""

import argparse
import sys

import torch
from torch import nn

history = []


class Trainer:
    def __init__(self):
        self.model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.cache = {}

    def step(self, x):
        out = self.model(x)  # LEAK_SITE(output)
        loss = out.pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return out


trainer = None
fakes = []


def keep_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fakes.append(torch.empty(1000, 1000))
    fakes.append(torch.empty(1000, 1000, device="meta"))
    for cls in (getattr(torch, "UntypedStorage", None), getattr(torch, "TypedStorage", None)):
        if cls is None:
            continue
        original = cls.data_ptr

        def data_ptr(self, original=original):
            if self.device.type == "meta":
                print("DATA_PTR OF A META STORAGE", file=sys.stderr, flush=True)
            return original(self)

        cls.data_ptr = data_ptr


def train(steps, keep):
    kept = []
    for step in range(steps):
        x = torch.randn(64, 512)
        out = trainer.step(x)
        if keep == "global":
            history.append(out)
        elif keep == "attribute":
            trainer.cache[step] = out.detach().clone()  # LEAK_SITE(copy)
        elif keep == "local":
            kept.append(out)
    if keep == "local":
        import memledger

        memledger.snapshot()
    return len(kept)


def main():
    global trainer
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--keep", choices=("global", "attribute", "local", "none"), default="global")
    parser.add_argument("--fake", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.fake:
        keep_fake_tensors()
    trainer = Trainer()
    train(args.steps, args.keep)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
