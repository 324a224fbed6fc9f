"""One rank of a CPU data-parallel training loop (PyTorch, gloo), launched as
torchrun launches it: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in the environment. No step marker.

    ranks_client.py [--leak rank1|none] [--steps N]

--leak rank1: rank 1 keeps a 256 KiB tensor every step; rank 0 keeps nothing.
Prints LEAK_BYTES and DONE."""

import argparse
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--leak", choices=("rank1", "none"), default="rank1")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for _ in range(args.steps):
        loss = model(torch.randn(64, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        if args.leak == "rank1" and rank == 1:
            kept.append(torch.randn(65536))  # LEAK_SITE(rank1)
        time.sleep(0.02)
    dist.destroy_process_group()
    print("LEAK_BYTES=%d" % (65536 * 4 if args.leak == "rank1" and rank == 1 else 0))
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
