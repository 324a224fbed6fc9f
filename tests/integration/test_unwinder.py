"""The unwinder against libunwind in real processes: with MEMLEDGER_UNWINDER=check
every stack is taken both ways (interposer/unwinder.h) and the tracer prints, at
exit, how many differed. None may: on a C++ program built with frame pointers,
and on Debian's Python 3.11 and PyTorch, built without them."""

import re

import mltest
from clients import PYTHON_TORCH

CHECK_LINE = re.compile(r"unwinder check \(pid (\d+)\): (\d+) stacks, (\d+) handed to libunwind, (\d+) differed")

TORCH_SCRIPT = """
import threading
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def train(steps):
    for _ in range(steps):
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
train(10)
worker = threading.Thread(target=train, args=(5,))
worker.start()
worker.join()
print("trained")
"""


class UnwinderCheck(mltest.TestCase):
    def checked(self, command, **kwargs):
        run_dir = self.tmpdir()
        proc = self.memledger("run", "-q", "--no-report", "-o", run_dir, "--host", "full", "--", *command,
                              env=mltest.clean_env(MEMLEDGER_UNWINDER="check"), **kwargs)
        self.assertExit(proc, 0)
        counts = [tuple(int(v) for v in m.groups()[1:]) for m in CHECK_LINE.finditer(proc.stderr)]
        self.assertTrue(counts, self.describe(proc))
        return proc, counts

    def test_native_program_with_frame_pointers(self):
        proc, counts = self.checked([mltest.program("train_leak")])
        for stacks, handed_over, differed in counts:
            self.assertGreater(stacks, 100)
            self.assertEqual(differed, 0, self.describe(proc))
            self.assertLess(handed_over, stacks / 100)

    def test_python_and_pytorch_without_frame_pointers(self):
        probe = self.run_cmd([PYTHON_TORCH, "-c", "import torch"])
        if probe.returncode != 0:
            self.skipTest("no PyTorch for %s (apt-get install python3-torch)" % PYTHON_TORCH)
        proc, counts = self.checked([PYTHON_TORCH, "-c", TORCH_SCRIPT], timeout=120)
        self.assertIn("trained", proc.stdout)
        stacks, handed_over, differed = counts[0]
        self.assertGreater(stacks, 10000)
        self.assertEqual(differed, 0, self.describe(proc))
        # The rules cover Python's and PyTorch's frames: libunwind is the exception.
        self.assertLess(handed_over, stacks / 100)

    def test_unknown_choice_is_said_once_and_the_program_goes_on(self):
        run_dir = self.tmpdir()
        proc = self.memledger("run", "-q", "--no-report", "-o", run_dir, "--host", "full", "--",
                              mltest.program("train_leak"), env=mltest.clean_env(MEMLEDGER_UNWINDER="bogus"))
        self.assertExit(proc, 0)
        self.assertEqual(proc.stderr.count("MEMLEDGER_UNWINDER is not one of fast, libunwind, check"), 1,
                         self.describe(proc))


if __name__ == "__main__":
    mltest.main()
