"""A small PyTorch training loop on the CPU with one planted leak of the kinds
people hit, for memledger's integration tests.

    torch_client.py [--steps N] [--leak graph|loss|optimizer|none] [--markers step|none]

--leak graph: every step keeps its output in a list (to compute a metric at
    the end), and with it the output's autograd graph: 500 KB per step.
--leak loss: a validation batch after every step adds its loss to a running
    total as a tensor (`val_loss += loss` instead of `loss.item()`, outside
    torch.no_grad()), which keeps every validation graph with its saved
    activations: the log-softmax (500 KB), the hidden layer, the input.
--leak optimizer: a new Adam optimizer every step (after changing the
    learning rate, say), the old ones kept in a list: each one's state (two
    buffers the size of the model, 4.4 MB) stays alive.
--leak none: the clean control (the same work, nothing kept).
--markers step: ends each step with memledger.step(); none: no marker (the
    report then infers the steps).

Machine-readable output on stdout: LEAK_FILE and LEAK_LINE (the line of this
file on the stack of the largest leaking allocation), LEAK_BYTES (its bytes
per step), STEPS, then DONE.
"""
import argparse
import os

import planted

import torch
from torch import nn

try:
    import memledger
except ImportError:  # run without `memledger run`
    memledger = None

BATCH, FEATURES, HIDDEN, CLASSES = 128, 64, 512, 1000


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        hidden = torch.relu(self.fc1(x))
        return self.fc2(hidden)  # LEAK_SITE(graph)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--leak", choices=("graph", "loss", "optimizer", "none"), default="graph")
    parser.add_argument("--markers", choices=("step", "none"), default="step")
    args = parser.parse_args()

    # The test machines are small and shared: one thread keeps the run short.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x_val = torch.randn(BATCH, FEATURES)
    y_val = torch.randint(0, CLASSES, (BATCH,))
    kept_outputs = []
    optimizers = []
    train_loss = 0.0
    val_loss = 0.0
    for _ in range(args.steps):
        x = torch.randn(BATCH, FEATURES)
        y = torch.randint(0, CLASSES, (BATCH,))
        if args.leak == "optimizer":
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3 / (1 + len(optimizers)))
            optimizers.append(optimizer)  # the planted leak: every optimizer (and its state) kept
        optimizer.zero_grad(set_to_none=True)
        output = model(x)
        loss = loss_fn(output, y)
        loss.backward()
        optimizer.step()  # LEAK_SITE(optimizer)
        train_loss += loss.item()
        if args.leak == "graph":
            kept_outputs.append(output)  # the planted leak: outputs kept with their graph
        if args.leak == "loss":
            val_loss += loss_fn(model(x_val), y_val)  # LEAK_SITE(loss): should be .item()
        else:
            with torch.no_grad():
                val_loss += loss_fn(model(x_val), y_val).item()
        if memledger is not None and args.markers == "step":
            memledger.step()
    print("LEAK_FILE=%s" % os.path.basename(__file__))
    print("LEAK_LINE=%d" % planted.leak_line(__file__, args.leak))
    parameters = sum(p.numel() for p in model.parameters())
    print("LEAK_BYTES=%d" % (2 * parameters * 4 if args.leak == "optimizer" else BATCH * CLASSES * 4))
    print("STEPS=%d" % args.steps)
    print("DONE train_loss=%.4f val_loss=%.4f kept=%d" %
          (train_loss / args.steps, float(val_loss) / args.steps, len(kept_outputs)), flush=True)


if __name__ == "__main__":
    main()
