#!/usr/bin/env python3
"""Runs the simulated-CUDA test programs in every mode and checks the output
contract of programs/program_common.h, without memledger.

    check_programs.py SOURCE_DIR DRIVER_DIR PROGRAM...

Each program runs a few steps on the simulated driver (found through its
rpath; LD_LIBRARY_PATH is set to the driver's folder as well, the way the
integration tests run them) and must: say SIM_DRIVER=1, print every
STEP_DONE, point LEAK_LINE at a "PLANTED LEAK" line naming the mode's API,
leave device 0 with at least STEPS x LEAK_PER_STEP less free memory, and in
mode oom fail the last request with the out-of-memory error and exit 3.
"""

import os
import pathlib
import re
import subprocess
import sys

STEPS = 4
LEAK = 3_000_000
GRANULE = 2 << 20

# Program -> (source file, {mode: API named on the planted line}).
PROGRAMS = {
    "cuda_runtime_dynamic": ("cuda_runtime.cpp", {
        "normal": "cudaMalloc", "async": "cudaMallocAsync", "pool": "cudaMallocFromPoolAsync",
        "managed": "cudaMallocManaged", "oom": "cudaMalloc"}),
    "cuda_runtime_static": ("cuda_runtime.cpp", {
        "normal": "cudaMalloc", "async": "cudaMallocAsync", "pool": "cudaMallocFromPoolAsync",
        "managed": "cudaMallocManaged", "oom": "cudaMalloc"}),
    "cuda_driver_linked": ("cuda_driver_linked.cpp", {
        "normal": "cuMemAlloc", "async": "cuMemAllocAsync", "managed": "cuMemAllocManaged", "oom": "cuMemAlloc"}),
    "cuda_driver_dlopen": ("cuda_driver_dlopen.cpp", {
        "normal": "cuMemAlloc_v2", "pool": "cuMemAllocFromPoolAsync", "vmm": "cuMemCreate", "nccl": "cuMemCreate",
        "oom": "cuMemAlloc_v2"}),
}


def parse(stdout):
    values = {}
    steps = []
    for line in stdout.splitlines():
        if line.startswith("STEP_DONE "):
            steps.append(int(line.split()[1]))
        elif "=" in line and not line.startswith("DONE"):
            key, _, value = line.partition("=")
            values[key] = value
    return values, steps


def check(program_path, source_dir, driver_dir):
    name = pathlib.Path(program_path).name
    source, modes = PROGRAMS[name]
    lines = (pathlib.Path(source_dir) / "programs" / source).read_text().splitlines()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith(("SIMCUDA_", "MEMLEDGER_"))}
    env["LD_LIBRARY_PATH"] = driver_dir
    failures = []
    for mode, api in modes.items():
        run = subprocess.run([program_path, str(STEPS), str(LEAK), mode], env=env, capture_output=True, text=True,
                             timeout=60)
        values, steps = parse(run.stdout)
        where = f"{name} {mode}"
        expected_rc = 3 if mode == "oom" else 0
        if run.returncode != expected_rc:
            failures.append(f"{where}: exit {run.returncode}, expected {expected_rc}: {run.stderr.strip()}")
            continue
        if values.get("SIM_DRIVER") != "1":
            failures.append(f"{where}: not on the simulated driver")
        if steps != list(range(1, STEPS + 1)):
            failures.append(f"{where}: steps {steps}")
        line = int(values.get("LEAK_LINE", "0"))
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        if values.get("LEAK_FILE") != source or not re.search(rf"PLANTED LEAK {re.escape(api)}\b", text):
            failures.append(f"{where}: LEAK_LINE={line} is not the planted {api}: {text.strip()!r}")
        per_step = int(values.get("LEAK_PER_STEP", "0"))
        if per_step < LEAK:
            failures.append(f"{where}: LEAK_PER_STEP={per_step}")
        grown = int(values.get("FREE_START", "0")) - int(values.get("FREE_END", "0"))
        if grown < STEPS * per_step:
            failures.append(f"{where}: device 0 lost only {grown} bytes for {STEPS} x {per_step}")
        if mode == "oom":
            if int(values.get("OOM_REQUESTED", "0")) <= int(values.get("TOTAL", "0")):
                failures.append(f"{where}: OOM_REQUESTED is not more than the device has")
            if values.get("OOM_ERROR") != "2":
                failures.append(f"{where}: OOM_ERROR={values.get('OOM_ERROR')}")
    return failures


def main():
    source_dir, driver_dir, *programs = sys.argv[1:]
    failures = []
    for program in programs:
        failures += check(program, source_dir, driver_dir)
    for failure in failures:
        print("FAIL", failure)
    print(f"{len(programs)} programs checked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
