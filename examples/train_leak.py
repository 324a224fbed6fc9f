"""A small PyTorch training loop with a planted leak: the bundled example
for `memledger run` (scripts/example.sh runs it).

A two-layer classifier learns a synthetic task (the label is the sign
pattern of a fixed random projection of the input). Every step, the loop
also keeps the step's output "to compute the epoch's accuracy at the end",
and with the output its autograd graph: 512 KB more every step, allocated by
the model's last layer (`Classifier.forward`, the line marked below) and
kept by `outputs.append(logits)` in `train`. Runs on the GPU when PyTorch
sees one, else on the CPU.

    memledger run -- python3 examples/train_leak.py [--steps N]
    memledger run --leak-mode -- python3 examples/train_leak.py   # on a GPU
"""

import argparse

import torch
from torch import nn

try:
    import memledger  # on PYTHONPATH under `memledger run`
except ImportError:
    memledger = None

FEATURES, HIDDEN, CLASSES, BATCH = 128, 512, 1000, 128


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(FEATURES, HIDDEN)
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))  # the kept outputs are allocated here


def synthetic_batch(projection, device):
    x = torch.randn(BATCH, FEATURES, device=device)
    y = (x @ projection).argmax(dim=1)
    return x, y


def train(steps, device):
    torch.manual_seed(0)
    model = Classifier().to(device)
    projection = torch.randn(FEATURES, CLASSES, device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    outputs, labels = [], []
    for step in range(steps):
        x, y = synthetic_batch(projection, device)
        logits = model(x)
        loss = loss_fn(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        outputs.append(logits)  # the leak: should be logits.detach().argmax(1), or a running count
        labels.append(y)
        if memledger is not None:
            memledger.step()
        if step % 10 == 0 or step == steps - 1:
            print("step %3d  loss %.3f" % (step, loss.item()), flush=True)
    correct = sum((o.argmax(dim=1) == l).sum().item() for o, l in zip(outputs, labels))
    print("accuracy over the run: %.1f%%" % (100.0 * correct / (steps * BATCH)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("training on %s" % device, flush=True)
    train(args.steps, device)


if __name__ == "__main__":
    main()
