"""Cost of Python frames in stacks: Python workloads untraced and under
`memledger run` (sampled and full host modes, each with and without Python
frames: MEMLEDGER_PYTHON_FRAMES=0), median of several runs, wall and CPU time.

    python3 bench/python_stacks.py [--memledger build/tools/memledger] [--python /usr/bin/python3] [--runs 5]
                                   [--memray-path DIR]

memray (PyPI) runs the same scripts in the same invocation, as the reference
(`python -m memray run`, Python stacks; and `--native`), when the interpreter
can import it, or from DIR (`pip install --target DIR memray`).

Workloads: `objects` (pure Python building and dropping containers, deep
call stacks), and `torch_cpu` (a small MLP trained on CPU with PyTorch, when
torch imports).

Then, when torch imports, the report builder on the full-mode trace of
`import torch`: `memledger report`'s wall time and peak RSS, median of --runs.

Then the tracer's memory on `import torch` and on the
`torch_cpu` script, read by the program itself at its end: VmHWM, and its
resident memory split into anonymous memory (the heap and every private
mapping: what the tracer allocates) and pages of mapped files (among them the
libraries' unwind tables, which the unwinder reads), untraced and in each
host mode, two runs each (`--no-memory` skips this).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

OBJECTS = '''
import ctypes, sys
step = ctypes.CDLL(None).memledger_step if hasattr(ctypes.CDLL(None), "memledger_step") else None

def leaf(n):
    return [bytearray(64 + i % 512) for i in range(n)] + [{"k%d" % i: i} for i in range(n // 4)]

def nest(depth, n):
    return leaf(n) if depth == 0 else nest(depth - 1, n)

for s in range(int(sys.argv[1])):
    for _ in range(200):
        nest(25, 200)
    if step:
        step(None)
'''

TORCH_CPU = '''
import ctypes, sys, torch
torch.manual_seed(0)
torch.set_num_threads(2)
lib = ctypes.CDLL(None)
step = getattr(lib, "memledger_step", None) if hasattr(lib, "memledger_step") else None
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
for s in range(int(sys.argv[1])):
    x = torch.randn(64, 256)
    y = torch.randint(0, 10, (64,))
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    if step:
        step(None)
'''


def timed(cmd, env):
    """Wall and CPU seconds, and the peak RSS in MiB of the largest process of
    the tree (wait4's rusage covers the child and the children it waited for)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit("%s failed (%d): %s" % (" ".join(cmd), proc.returncode,
                                                     err.read().decode(errors="replace")[-2000:]))
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def traced(args, out, host, script, argument):
    """`memledger run` of `script` in host mode `host`, into a fresh run folder `out`."""
    shutil.rmtree(out, ignore_errors=True)
    return [args.memledger, "run", "-q", "--no-report", "-o", out, "--host", host, "--",
            args.python, script, argument]


# Appended to a workload: prints the process's own memory at its end, as JSON
# on the last line of stdout.
MEMORY_REPORT = '''
import json as _json, re as _re
_rss = {"anon": 0, "file": 0}
_kind = "anon"
for _line in open("/proc/self/smaps"):
    if _re.match(r"^[0-9a-f]+-[0-9a-f]+ ", _line):
        _fields = _line.split()
        _kind = "file" if len(_fields) > 5 and _fields[5].startswith("/") else "anon"
    elif _line.startswith("Rss:"):
        _rss[_kind] += int(_line.split()[1])
_hwm = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
print(_json.dumps({"hwm_kib": _hwm, "anon_kib": _rss["anon"], "file_kib": _rss["file"]}))
'''


def memory_table(args, env, tmp, scripts):
    """The tracer's memory on each (name, script, argument): untraced and in
    each host mode, the program's own VmHWM and its resident memory split
    into anonymous memory and pages of mapped files, medians of two runs."""
    print()
    print("tracer memory (MiB, read by the program at its end; 'added': above untraced)")
    print("%-12s %-10s %9s %7s %9s %7s %9s %7s" % ("workload", "mode", "VmHWM", "added", "anon", "added",
                                                  "files", "added"))
    for name, source, argument in scripts:
        script = os.path.join(tmp, name + "-memory.py")
        with open(script, "w") as f:
            f.write(source + MEMORY_REPORT)
        base = None
        for host in (None, "sampled", "full"):
            readings = []
            for i in range(2):
                if host is None:
                    cmd = [args.python, script, argument]
                else:
                    cmd = traced(args, os.path.join(tmp, "memory-%s-%d" % (name, i)), host, script, argument)
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit("%s failed (%d): %s" % (" ".join(cmd), proc.returncode, proc.stderr[-2000:]))
                readings.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            row = [statistics.median(r[key] for r in readings) / 1024 for key in ("hwm_kib", "anon_kib", "file_kib")]
            if base is None:
                base = row
            print("%-12s %-10s %9.1f %+7.1f %9.1f %+7.1f %9.1f %+7.1f" % (
                name, host or "untraced", row[0], row[0] - base[0], row[1], row[1] - base[1], row[2], row[2] - base[2]))
            sys.stdout.flush()


def report_table(args, env, tmp):
    """`memledger report` on the full-mode trace of `import torch` (a
    million stacks of 60 to 90 frames on PyTorch 2.x): wall time and the
    report builder's peak RSS, medians of --runs."""
    script = os.path.join(tmp, "import_torch.py")
    with open(script, "w") as f:
        f.write("import torch\n")
    out = os.path.join(tmp, "report-run")
    timed(traced(args, out, "full", script, ""), env)
    trace_mib = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out) if n.endswith(".mlt")) / 2**20
    walls, peaks = [], []
    for _ in range(args.runs):
        wall, _, peak = timed([args.memledger, "report", out], env)
        walls.append(wall)
        peaks.append(peak)
    print()
    print("report builder: memledger report on the full-mode trace of import torch (%.1f MiB)" % trace_mib)
    print("%-28s %10s %12s" % ("", "wall s", "peak MiB"))
    print("%-28s %10.3f %12.1f" % ("memledger report", statistics.median(walls), statistics.median(peaks)))
    sys.stdout.flush()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memledger", default=os.path.join(here, "..", "build", "tools", "memledger"))
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--memray-path", help="folder holding the memray package (pip install --target)")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracer memory table")
    parser.add_argument("--memory-only", action="store_true", help="the tracer memory table alone")
    args = parser.parse_args()
    # memledger run finds its Python package next to itself (build tree) or
    # under share/memledger/python (installed); without it, a traced Python
    # program runs without the helpers (the retention walk at exit among
    # them) and looks cheaper than it is: a build folder where only the
    # library and the executable were built, say.
    tool_dir = os.path.dirname(os.path.abspath(args.memledger))
    if not any(os.path.exists(os.path.join(d, "memledger", "_boot", "sitecustomize.py"))
               for d in (os.path.join(tool_dir, "python"), os.path.join(tool_dir, "..", "share", "memledger", "python"))):
        parser.error("%s has no memledger Python package next to it (build the folder whole: "
                     "meson compile -C BUILD); traced runs would leave its helpers out" % args.memledger)
    tmp = tempfile.mkdtemp(prefix="memledger-pybench-")
    try:
        workloads = [("objects", OBJECTS, "200")]
        if subprocess.run([args.python, "-c", "import torch"], capture_output=True).returncode == 0:
            workloads.append(("torch_cpu", TORCH_CPU, "150"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLEDGER_") and k != "LD_PRELOAD"}
        configs = [("untraced", None, {}),
                   ("sampled", "sampled", {}),
                   ("sampled, no Python frames", "sampled", {"MEMLEDGER_PYTHON_FRAMES": "0"}),
                   # The Python helper's walk for retention paths at exit
                   # (memledger run --no-retention turns it off).
                   ("sampled, no retention walk", "sampled", {"MEMLEDGER_RETENTION": "0"}),
                   ("full", "full", {}),
                   ("full, no Python frames", "full", {"MEMLEDGER_PYTHON_FRAMES": "0"})]
        memray_env = {"PYTHONPATH": args.memray_path} if args.memray_path else {}
        if subprocess.run([args.python, "-c", "import memray"], capture_output=True,
                          env=dict(env, **memray_env)).returncode == 0:
            configs += [("memray", "memray", memray_env), ("memray --native", "memray-native", memray_env)]
        else:
            print("memray: skipped (not importable by %s; see --memray-path)" % args.python)
        if not args.memory_only:
            print("%-10s %-28s %10s %8s %10s %8s %10s %9s" % ("workload", "mode", "wall s", "x", "cpu s", "x",
                                                              "peak MiB", "added"))
        for name, source, steps in workloads if not args.memory_only else []:
            script = os.path.join(tmp, name + ".py")
            with open(script, "w") as f:
                f.write(source)
            base = None
            for label, host, extra in configs:
                walls, cpus, peaks = [], [], []
                for i in range(args.runs):
                    if host is None:
                        cmd = [args.python, script, steps]
                    elif host.startswith("memray"):
                        out = os.path.join(tmp, "memray-%s-%d.bin" % (name, i))
                        if os.path.exists(out):
                            os.unlink(out)
                        cmd = [args.python, "-m", "memray", "run", "-q", "-o", out,
                               *(["--native"] if host == "memray-native" else []), script, steps]
                    else:
                        cmd = traced(args, os.path.join(tmp, "run-%s-%d" % (name, i)), host, script, steps)
                    wall, cpu, peak = timed(cmd, dict(env, **extra))
                    walls.append(wall)
                    cpus.append(cpu)
                    peaks.append(peak)
                wall, cpu, peak = statistics.median(walls), statistics.median(cpus), statistics.median(peaks)
                if base is None:
                    base = (wall, cpu, peak)
                print("%-10s %-28s %10.3f %8.2f %10.3f %8.2f %10.1f %+9.1f" % (
                    name, label, wall, wall / base[0], cpu, cpu / base[1], peak, peak - base[2]))
                sys.stdout.flush()
        if not args.memory_only and any(name == "torch_cpu" for name, _, _ in workloads):
            report_table(args, env, tmp)
        if not args.no_memory and any(name == "torch_cpu" for name, _, _ in workloads):
            memory_table(args, env, tmp, [("import_torch", "import torch\n", ""), ("torch_cpu", TORCH_CPU, "150")])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
