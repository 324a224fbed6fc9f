"""A PyTorch training loop on the GPU with a planted leak: every step keeps the
step's output (with its autograd graph) in a list. Mode "oom" ends by asking
for more memory than the GPU has, as a too-large batch would."""
import ctypes
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
mode = sys.argv[2] if len(sys.argv) > 2 else "leak"

try:
    _step = ctypes.CDLL(None).memledger_step
    _step.argtypes = [ctypes.c_char_p]
except AttributeError:
    _step = None

if mode == "nccl":
    # NCCL's VMM buffers (NCCL_CUMEM_ENABLE=1): a one-rank process group
    # whose all-reduces allocate, retain, release and unmap them.
    import os
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    t = torch.ones(1 << 20, device="cuda")
    for s in range(steps):
        dist.all_reduce(t)
        torch.cuda.synchronize()
        if _step:
            _step(b"train")
    dist.destroy_process_group()
    sys.exit(0)

if mode == "graph":
    # CUDA graphs. Under leak mode's cudaMallocAsync backend a tensor made
    # while a graph is captured is an allocation node of the graph, allocated
    # by each replay. Every step captures a new graph and keeps it with its
    # 4 MiB output, which no free node of the graph frees.
    x = torch.randn(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x * 2  # warm-up before capture, as torch.cuda.graph's documentation asks
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for s in range(steps):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = x * 2  # LEAK_LINE: 4 MiB per step, graph-owned
        g.replay()
        graphs.append((g, out))
        torch.cuda.synchronize()
        if _step:
            _step(b"train")
    sys.exit(0)

model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for s in range(steps):
    x = torch.randn(256, 1024, device="cuda")
    out = model(x)
    loss = out.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if mode in ("leak", "oom"):
        kept.append(torch.empty(1024 * 1024, device="cuda"))  # LEAK_LINE: 4 MiB per step
    torch.cuda.synchronize()
    if _step:
        _step(b"train")
    print(f"STEP_DONE {s}", flush=True)

if mode == "oom":
    total = torch.cuda.get_device_properties(0).total_memory
    print(f"OOM_REQUESTED={total * 2}", flush=True)
    torch.empty(total * 2 // 4, device="cuda")  # raises torch.OutOfMemoryError: exit code 1
