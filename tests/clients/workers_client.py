"""Worker processes that grow, with no step marker anywhere: a PyTorch
DataLoader whose Dataset caches every sample in its workers, and a
multiprocessing pool whose tasks keep their results in a module-level list.
Run under `memledger run -- python3 workers_client.py ...` with default
options; prints LEAK_BYTES (planted bytes per sample or task) and DONE.

--leak main: the training loop (main process) keeps a copy of every batch,
256 KiB a step; the workers keep nothing.

--leak none is the clean control: the same work, nothing kept.

--mode objects: a dataset holding three million small Python objects, made
in the main process and read by the DataLoader's workers. Nothing leaks;
CPython keeps small objects in arenas of its own, mapped outside malloc."""

import argparse
import multiprocessing
import time

KEPT = []


class CachingDataset:
    """A map-style dataset; with leak, each worker keeps what it made."""

    def __init__(self, n, leak):
        self.n = n
        self.leak = leak
        self.cache = {}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        x = torch.randn(64, 64)
        time.sleep(0.004)  # decoding, augmentation
        if self.leak:
            self.cache[i] = x.numpy().tobytes() * 4  # LEAK_SITE(cache): 64 KiB kept per sample
        else:
            assert len(x.numpy().tobytes() * 4) == 65536
        return x, i % 10


class ObjectsDataset:
    """A map-style dataset over a list of Python objects made in the parent."""

    def __init__(self, n):
        self.n = n
        self.objects = [str(i) * 3 for i in range(3_000_000)]
        self.chunk = len(self.objects) // n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        time.sleep(0.004)
        # Reading each object of the sample's chunk touches its page.
        length = sum(len(s) for s in self.objects[i * self.chunk:(i + 1) * self.chunk])
        return torch.full((64, 64), float(length)), i % 10


def train_with_dataloader(args):
    import torch
    from torch.utils.data import DataLoader

    if args.mode == "objects":
        dataset = ObjectsDataset(args.samples)
    else:
        dataset = CachingDataset(args.samples, args.leak == "cache")
    loader = DataLoader(dataset, batch_size=16, num_workers=2, persistent_workers=True,
                        multiprocessing_context=args.start)
    model = torch.nn.Linear(64 * 64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.leak == "main":
            history.append(x.clone())  # LEAK_SITE(main): 256 KiB kept per step


def pool_task(i):
    time.sleep(0.004)
    if LEAK:
        KEPT.append(bytes([i % 256]) * 65536)  # LEAK_SITE(results)
        return len(KEPT[-1])
    return len(bytes([i % 256]) * 65536)


LEAK = False


def init_pool(leak):
    global LEAK
    LEAK = leak


def run_pool(args):
    ctx = multiprocessing.get_context(args.start)
    with ctx.Pool(2, initializer=init_pool, initargs=(args.leak == "results",)) as pool:
        total = sum(pool.map(pool_task, range(args.samples), chunksize=4))
    assert total == args.samples * 65536


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("dataloader", "pool", "objects"), default="dataloader")
    parser.add_argument("--start", choices=("fork", "spawn", "forkserver"), default="fork")
    parser.add_argument("--leak", choices=("cache", "results", "main", "none"), default="cache")
    parser.add_argument("--samples", type=int, default=800)
    args = parser.parse_args()
    print("LEAK_BYTES=%d" % {"none": 0, "main": 16 * 64 * 64 * 4}.get(args.leak, 65536), flush=True)
    if args.mode in ("dataloader", "objects"):
        train_with_dataloader(args)
    else:
        run_pool(args)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
