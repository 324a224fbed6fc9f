"""A PyTorch loop that keeps every step's output, for memledger's retention
paths: who keeps the memory alive, as the report names it.

    retention_client.py [--steps N] [--keep global|attribute|local|none]

--keep global: the outputs (with their autograd graph) go to a module-level
    list `history`;
--keep attribute: detached copies go to `trainer.cache`, a dict attribute of
    a module-level object;
--keep local: the outputs go to a list local to train(), which calls
    memledger.snapshot() before it returns;
--keep none: the clean control.
Each kept output is 64 x 1024 float32 values: 256 KiB a step. No step
marker: the report finds the steps itself. Prints DONE."""

import argparse

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
    args = parser.parse_args()
    torch.manual_seed(0)
    trainer = Trainer()
    train(args.steps, args.keep)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
