"""A PyTorch training loop for the CUPTI GPU tests: each step is an NVTX range
"train_step N" (torch.cuda.nvtx.range_push/range_pop) and keeps 4 MiB by
mistake. Modes:
  leak      the loop alone
  profiler  the loop runs inside torch.profiler (CUDA activities), which needs
            the CUPTI subscriber slot for itself; prints PROFILER_EVENTS=N
  timing    no leak; prints STEP_TIME_US=<median step time> (overhead target)
            and DEVICE_USED_MIB=<the GPU's used memory at the end, all processes>
"""
import statistics
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
mode = sys.argv[2] if len(sys.argv) > 2 else "leak"

model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)).cuda()
# The fused Adam launches one kernel named for it a step (FusedAdamMathFunctor);
# the default, foreach, launches PyTorch's generic list kernels.
opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
kept = []
times = []


def train(s):
    torch.cuda.nvtx.range_push(f"train_step {s + 1}")
    start = time.perf_counter()
    x = torch.randn(512, 2048, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if mode != "timing":
        kept.append(torch.empty(1024 * 1024, device="cuda"))  # 4 MiB per step
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
    torch.cuda.nvtx.range_pop()


if mode == "profiler":
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for s in range(steps):
            train(s)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"PROFILER_EVENTS={len(kernels)}", flush=True)
else:
    for s in range(steps):
        train(s)

if mode == "timing":
    print(f"STEP_TIME_US={statistics.median(times[5:]) * 1e6:.1f}", flush=True)
    free, total = torch.cuda.mem_get_info()
    print(f"DEVICE_USED_MIB={(total - free) / 2**20:.1f}", flush=True)
print("DONE", flush=True)
