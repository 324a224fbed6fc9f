#!/usr/bin/env python3
"""Checks the simulated libraries' exports against the real CUDA 13 ones.

    check_exports.py SIM_LIBCUDA SIM_LIBCUDART REAL_LIBCUDA_STUB REAL_LIBCUDART

Every driver function the simulator exports must exist under that name in
the toolkit's libcuda stub, every runtime function in the real libcudart.so.13
(same version node); the runtime must not link against libcuda. Exits 77
(meson: skipped) when the real libraries are not installed.
"""

import os
import re
import subprocess
import sys


def dynamic_symbols(path):
    """Defined dynamic symbols as {name: version or ''}."""
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    symbols = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWw":
            name, _, version = parts[2].partition("@")
            symbols[name] = version.lstrip("@")
    return symbols


def needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def main():
    sim_cuda, sim_cudart, real_cuda, real_cudart = sys.argv[1:5]
    if not (os.path.exists(real_cuda) and os.path.exists(real_cudart)):
        print("real CUDA libraries not found, skipping")
        return 77
    failures = []

    sim = {n for n in dynamic_symbols(sim_cuda) if not n.startswith("simcuda_")}
    real = dynamic_symbols(real_cuda)
    failures += [f"libcuda: {n} is not a real driver export" for n in sorted(sim - real.keys())]
    for must in ("cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable", "cuMemAlloc_v2", "cuCtxCreate_v4"):
        if must not in sim:
            failures.append(f"libcuda: {must} missing")

    sim_rt = dynamic_symbols(sim_cudart)
    real_rt = dynamic_symbols(real_cudart)
    for name, version in sorted(sim_rt.items()):
        if name == version:
            continue  # the version node's own definition
        if name not in real_rt:
            failures.append(f"libcudart: {name} is not a real runtime export")
        elif version != real_rt[name]:
            failures.append(f"libcudart: {name}@{version}, the real one is @{real_rt[name]}")
    if any(lib.startswith("libcuda.so") for lib in needed(sim_cudart)):
        failures.append("libcudart links against libcuda; it must dlopen it")

    for failure in failures:
        print("FAIL", failure)
    print(f"{len(sim)} driver and {len(sim_rt) - 1} runtime exports checked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
