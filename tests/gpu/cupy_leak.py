"""A CuPy loop with a planted leak (arrays kept in a list)."""
import ctypes
import sys

import cupy as cp

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
mode = sys.argv[2] if len(sys.argv) > 2 else "leak"
try:
    _step = ctypes.CDLL(None).memledger_step
    _step.argtypes = [ctypes.c_char_p]
except AttributeError:
    _step = None
# Every array straight from the driver, so that each one is visible.
cp.cuda.set_allocator(None)
kept = []
for s in range(steps):
    a = cp.random.random((1024, 1024), dtype=cp.float32)
    b = a @ a
    del a, b
    if mode in ("leak", "oom"):
        kept.append(cp.empty(1024 * 1024, dtype=cp.float32))  # LEAK_LINE: 4 MiB per step
    cp.cuda.Device().synchronize()
    if _step:
        _step(b"train")
    print(f"STEP_DONE {s}", flush=True)
if mode == "oom":
    total = cp.cuda.Device().mem_info[1]
    print(f"OOM_REQUESTED={total * 2}", flush=True)
    cp.empty(total * 2 // 4, dtype=cp.float32)
