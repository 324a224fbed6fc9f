"""A small PyTorch loop on the CPU that keeps one tensor per step, for the
replacement allocator tests: the process runs on whichever malloc it is
given (jemalloc, tcmalloc, mimalloc preloaded), and says which one made a
fresh block.

    torch_allocator.py [--steps N]

Output: LEAK_FILE, LEAK_LINE, LEAK_BYTES, STEPS, SERVED_BY=jemalloc|
tcmalloc|mimalloc|none, DONE.
"""
import argparse
import ctypes
import os

import planted

import torch

try:
    import memledger
except ImportError:  # run without `memledger run`
    memledger = None

LEAK_ELEMENTS = 64 * 1024  # float32: 256 KiB per step, past the sampling interval


def served_by():
    """Which allocator in the process made a fresh malloc block."""
    process = ctypes.CDLL(None)
    process.malloc.restype = ctypes.c_void_p
    process.malloc.argtypes = [ctypes.c_size_t]
    process.free.argtypes = [ctypes.c_void_p]
    who = "none"
    if hasattr(process, "mallctl"):
        counter, size = ctypes.c_uint64(), ctypes.c_size_t(8)
        process.mallctl(b"thread.allocated", ctypes.byref(counter), ctypes.byref(size), None, ctypes.c_size_t(0))
        before = counter.value
        block = process.malloc(100000)
        process.mallctl(b"thread.allocated", ctypes.byref(counter), ctypes.byref(size), None, ctypes.c_size_t(0))
        who = "jemalloc" if counter.value >= before + 100000 else who
    elif hasattr(process, "MallocExtension_GetOwnership"):
        block = process.malloc(100000)
        process.MallocExtension_GetOwnership.argtypes = [ctypes.c_void_p]
        who = "tcmalloc" if process.MallocExtension_GetOwnership(block) == 1 else who
    elif hasattr(process, "mi_is_in_heap_region"):
        block = process.malloc(100000)
        process.mi_is_in_heap_region.argtypes = [ctypes.c_void_p]
        process.mi_is_in_heap_region.restype = ctypes.c_bool
        who = "mimalloc" if process.mi_is_in_heap_region(block) else who
    else:
        block = process.malloc(100000)
    process.free(block)
    return who


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    weight = torch.randn(256, 256)
    kept = []
    for _ in range(args.steps):
        x = torch.randn(64, 256)
        y = torch.relu(x @ weight).sum()
        kept.append(torch.full((LEAK_ELEMENTS,), float(y)))  # LEAK_SITE(kept)
        if memledger is not None:
            memledger.step()
    print("LEAK_FILE=%s" % os.path.basename(__file__))
    print("LEAK_LINE=%d" % planted.leak_line(__file__, "kept"))
    print("LEAK_BYTES=%d" % (LEAK_ELEMENTS * 4))
    print("STEPS=%d" % args.steps)
    print("SERVED_BY=%s" % served_by())
    print("DONE")


if __name__ == "__main__":
    main()
