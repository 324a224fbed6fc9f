#!/usr/bin/env python3
"""Host-heap benchmark: untraced vs memledger (full, sampled) vs heaptrack.

One command, one table:

    python3 bench/run_benchmarks.py [--build build] [--repeat 3] [--quick]

Every configuration runs the same allocation storm (build/bench/storm), in
the same invocation, interleaved round by round (the order rotates each round
so that no configuration always runs first), and the median of --repeat runs
is reported. Then the report builders are timed on the traces just written:
`memledger report RUN --format json` against `heaptrack_print`.

This is a benchmark, not a test: it exits 0 when a target is missed and
prints MISSED next to it. It exits non-zero only when it cannot run at all
(no storm binary, bad arguments).

Python standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Targets, as ratios traced / untraced (or memledger / heaptrack).
TARGET_FULL = 2.5
TARGET_SAMPLED = 1.2
TARGET_TRACE = 3.0  # full mode's trace against heaptrack's compressed file
TARGET_REPORT = 1.0

# Benchmark defaults: about 20 M allocations, 1-2 s untraced on a small VM.
DEFAULT_STEPS = 200
QUICK_STEPS = 10
INSTRUCTION_STEPS = 4  # under callgrind, about 50 times slower
DEFAULT_ALLOCS_PER_STEP = 100000
DEEP_DEPTH = 20

STORM_LINE = re.compile(r"storm:.*\bmaxrss_kib=(\d+)\s+elapsed_s=([0-9.]+)")


@dataclass
class Sample:
    """One run of one configuration."""

    ok: bool
    rc: int
    wall_s: float  # the whole command, as seen from here
    cpu_s: float | None = None  # user + system CPU of the whole command's tree
    program_s: float | None = None  # storm's own elapsed time
    program_rss_kib: int | None = None  # storm's own peak RSS
    tree_rss_kib: int = 0  # largest process in the command's tree
    trace_bytes: int | None = None
    note: str = ""


@dataclass
class Config:
    """A way to run the storm (or a report builder)."""

    name: str
    skipped: str = ""  # why it cannot run here, empty if it can
    samples: list[Sample] = field(default_factory=list)

    def good(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    def median(self, attr: str) -> float | None:
        values = [getattr(s, attr) for s in self.good()]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def failure(self) -> str:
        bad = [s for s in self.samples if not s.ok]
        return bad[-1].note if bad else ""


GNU_TIME = "/usr/bin/time"


# --preload LIB: every host run (untraced and traced) gets LIB in LD_PRELOAD,
# as a user running `LD_PRELOAD=LIB memledger run ...` would.
RUN_ENV: dict[str, str] | None = None


LAST_CPU_S = 0.0  # CPU seconds of the last run_timed() command's tree


def run_timed(argv: list[str], stdout_path: Path, stderr_path: Path,
              stdout_devnull: bool = False) -> tuple[int, float, int]:
    """Run argv; return (exit code, wall seconds, max RSS KiB of the tree).

    The max RSS is that of the largest single process in the command's tree
    (for heaptrack: the program or heaptrack_interpret, whichever is bigger).
    It comes from GNU time, which forks the command from a small process:
    a child forked straight from this Python process would inherit Python's
    high-water mark in ru_maxrss, which survives exec.
    """
    rss_path = stderr_path.with_name(stderr_path.stem + ".rss")
    use_time = os.access(GNU_TIME, os.X_OK)
    # What the run before wrote (a full-mode trace, heaptrack's file: tens of
    # MB) goes to disk now, not while this run is timed: on a small machine
    # the kernel's writeback threads would take a core from it.
    os.sync()
    if use_time:
        argv = [GNU_TIME, "-f", "%M", "-o", str(rss_path), "--", *argv]
    with open(stderr_path, "wb") as err:
        out = open(os.devnull, "wb") if stdout_devnull else open(stdout_path, "wb")
        with out:
            start = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=RUN_ENV)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    global LAST_CPU_S
    # GNU time (or the command itself) waits for its children: their CPU is in its usage.
    LAST_CPU_S = usage.ru_utime + usage.ru_stime
    rss = usage.ru_maxrss  # fallback: includes Python's own high-water mark
    if use_time:
        try:
            # GNU time writes "Command exited with non-zero status N" first
            # when the command fails; the figure is the last line.
            rss = int(rss_path.read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            pass
    return proc.returncode, wall, rss


def tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += (Path(root) / f).stat().st_size
            except OSError:
                pass
    return total


def heaptrack_file(prefix: Path) -> Path | None:
    """heaptrack -o PREFIX writes PREFIX.zst (or .gz, or PREFIX itself)."""
    for cand in (prefix.with_name(prefix.name + ".zst"),
                 prefix.with_name(prefix.name + ".gz"), prefix):
        if cand.is_file():
            return cand
    found = sorted(prefix.parent.glob(prefix.name + "*"))
    return found[0] if found else None


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.build = self._find_build(args.build)
        # --deep: the storm built without frame pointers, 20 to 40 more
        # frames above each call site (DEEP_DEPTH to 2 DEEP_DEPTH).
        self.storm = self.build / "bench" / ("storm_nofp" if args.deep else "storm")
        self.memledger = self.build / "tools" / "memledger"
        # --against: another build's memledger, run in the same rounds on this build's storm.
        self.against = (self._find_build(args.against) / "tools" / "memledger") if args.against else None
        self.heaptrack = shutil.which("heaptrack")
        self.heaptrack_print = shutil.which("heaptrack_print")
        self.tmp = Path()  # made in main(), once there is something to run
        self.storm_args = ["--steps", str(args.steps),
                           "--allocs-per-step", str(args.allocs_per_step),
                           "--threads", str(args.threads)]
        if args.deep:
            self.storm_args += ["--depth", str(DEEP_DEPTH)]
        self.run_flags: list[str] = []
        self.has_no_report = False
        self.counter = 0
        # The newest trace of each kind, kept for the report timing.
        self.last_full_run: Path | None = None
        self.last_heaptrack: Path | None = None

    @staticmethod
    def _find_build(build: str) -> Path:
        p = Path(build)
        if p.is_absolute() or p.exists():
            return p.resolve()
        return (REPO_ROOT / p).resolve()

    def fresh(self, name: str) -> Path:
        self.counter += 1
        return self.tmp / f"{self.counter:03d}-{name}"

    # -- discovery --------------------------------------------------------

    def memledger_skip_reason(self) -> str:
        if not os.access(self.memledger, os.X_OK):
            return f"{self.memledger} not built"
        try:
            res = subprocess.run([str(self.memledger), "run", "--help"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"memledger run --help failed: {e}"
        helptext = res.stdout + res.stderr
        if "--host" not in helptext:
            return "memledger run has no --host option yet"
        self.has_no_report = "--no-report" in helptext
        if self.has_no_report:
            self.run_flags.append("--no-report")
        if "--quiet" in helptext:
            self.run_flags.append("--quiet")
        return ""

    # -- one run of each configuration -----------------------------------

    def run_untraced(self) -> Sample:
        d = self.fresh("untraced")
        d.mkdir()
        return self._finish([str(self.storm), *self.storm_args], d)

    def run_memledger(self, mode: str, memledger: Path | None = None) -> Sample:
        d = self.fresh(f"memledger-{mode}")
        d.mkdir()
        run_dir = d / "run"
        argv = [str(memledger or self.memledger), "run", "-o", str(run_dir), "--host", mode,
                *self.run_flags, "--", str(self.storm), *self.storm_args]
        s = self._finish(argv, d)
        if not s.ok:
            return s  # its folder stays, for a look at stderr.txt with --keep
        s.trace_bytes = tree_size(run_dir) if run_dir.exists() else 0
        if mode == "full" and memledger is None:
            self._replace("last_full_run", run_dir)
        elif not self.args.keep:
            shutil.rmtree(d, ignore_errors=True)
        return s

    def run_heaptrack(self) -> Sample:
        d = self.fresh("heaptrack")
        d.mkdir()
        prefix = d / "heaptrack.storm"
        argv = [self.heaptrack, "-o", str(prefix), str(self.storm), *self.storm_args]
        s = self._finish(argv, d)
        if s.ok:
            f = heaptrack_file(prefix)
            if f is None:
                s.ok, s.note = False, "heaptrack wrote no file"
            else:
                s.trace_bytes = f.stat().st_size
                self._replace("last_heaptrack", f)
        return s

    def _replace(self, attr: str, path: Path) -> None:
        """Keep only the newest trace of a kind (traces are big)."""
        old = getattr(self, attr)
        if old is not None and not self.args.keep:
            # The numbered folder holding the run folder or the .zst file.
            shutil.rmtree(old.parent, ignore_errors=True)
        setattr(self, attr, path)

    def _finish(self, argv: list[str], d: Path) -> Sample:
        out, err = d / "stdout.txt", d / "stderr.txt"
        rc, wall, rss = run_timed(argv, out, err)
        s = Sample(ok=rc == 0, rc=rc, wall_s=wall, cpu_s=LAST_CPU_S, tree_rss_kib=rss)
        try:
            text = out.read_text(errors="replace")
        except OSError:
            text = ""
        m = None
        for m in STORM_LINE.finditer(text):
            pass
        if m is not None:
            s.program_rss_kib = int(m.group(1))
            s.program_s = float(m.group(2))
        if rc != 0:
            s.note = f"exit {rc}: {tail(err)}"
        elif m is None:
            s.ok = False
            s.note = f"no 'storm:' line on stdout: {tail(err)}"
        if self.args.verbose:
            print(f"  {' '.join(argv[:3])}... rc={rc} wall={wall:.3f}s "
                  f"program={s.program_s}s rss={rss}KiB {s.note}", flush=True)
        return s

    # -- report builders ----------------------------------------------------

    def time_memledger_report(self) -> Sample:
        assert self.last_full_run is not None
        d = self.fresh("report")
        d.mkdir()
        argv = [str(self.memledger), "report", str(self.last_full_run),
                "--format", "json", "-o", os.devnull]
        rc, wall, rss = run_timed(argv, d / "stdout.txt", d / "stderr.txt")
        note = "" if rc == 0 else f"exit {rc}: {tail(d / 'stderr.txt')}"
        return Sample(ok=rc == 0, rc=rc, wall_s=wall, tree_rss_kib=rss, note=note)

    def time_heaptrack_print(self) -> Sample:
        assert self.last_heaptrack is not None
        d = self.fresh("heaptrack_print")
        d.mkdir()
        argv = [self.heaptrack_print, str(self.last_heaptrack)]
        rc, wall, rss = run_timed(argv, d / "stdout.txt", d / "stderr.txt",
                                  stdout_devnull=True)
        note = "" if rc == 0 else f"exit {rc}: {tail(d / 'stderr.txt')}"
        return Sample(ok=rc == 0, rc=rc, wall_s=wall, tree_rss_kib=rss, note=note)

    # -- the whole benchmark ------------------------------------------------

    def main(self) -> int:
        if not os.access(self.storm, os.X_OK):
            print(f"error: {self.storm} not found; build it first:\n"
                  f"  meson compile -C {self.build} bench/{self.storm.name}", file=sys.stderr)
            return 2
        self.tmp = Path(tempfile.mkdtemp(prefix="memledger-bench-"))
        try:
            if self.args.instructions:
                return self.instructions()
            return self.benchmark()
        finally:
            if self.args.keep:
                print(f"\ntraces kept in {self.tmp}")
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)

    def benchmark(self) -> int:
        a = self.args
        untraced = Config("untraced")
        full = Config("memledger --host full")
        sampled = Config("memledger --host sampled")
        heaptrack = Config("heaptrack")
        reason = self.memledger_skip_reason()
        full.skipped = sampled.skipped = reason
        if self.heaptrack is None:
            heaptrack.skipped = "heaptrack not installed"
        elif a.preload:
            heaptrack.skipped = "--preload: heaptrack reaches glibc's malloc only"

        # --against: the other build's memledger in the same rounds.
        against: list[Config] = []
        against_runners = []
        if self.against is not None:
            for mode in ("full", "sampled"):
                c = Config(f"against: --host {mode}")
                if not os.access(self.against, os.X_OK):
                    c.skipped = f"{self.against} not built"
                against.append(c)
                against_runners.append((c, lambda m=mode: self.run_memledger(m, self.against)))

        runners = [(untraced, self.run_untraced),
                   (full, lambda: self.run_memledger("full")),
                   (sampled, lambda: self.run_memledger("sampled")),
                   *against_runners,
                   (heaptrack, self.run_heaptrack)]
        runners = [(c, f) for c, f in runners if not c.skipped]

        print(self.header(), flush=True)
        for r in range(a.repeat):
            order = runners[r % len(runners):] + runners[:r % len(runners)]
            names = ", ".join(c.name for c, _ in order)
            print(f"round {r + 1}/{a.repeat}: {names}", flush=True)
            for config, fn in order:
                sample = fn()
                config.samples.append(sample)
                # heaptrack is the reference, not what is measured: once it
                # fails (its interpreter has run out of memory on the deep
                # storm), later rounds go without it rather than wait on it
                # and share the machine with it again.
                if config is heaptrack and not sample.ok:
                    runners = [(c, f) for c, f in runners if c is not heaptrack]
                    print(f"heaptrack failed ({sample.note}): not run again", flush=True)

        ml_report = Config("memledger report --format json")
        ht_print = Config("heaptrack_print")
        if self.last_full_run is None or a.preload:
            ml_report.skipped = reason or ("--preload: the host runs only" if a.preload else "no successful full-mode run")
        if self.last_heaptrack is None or self.heaptrack_print is None:
            ht_print.skipped = heaptrack.skipped or "no heaptrack trace"
        report_runners = [(c, f) for c, f in ((ml_report, self.time_memledger_report),
                                              (ht_print, self.time_heaptrack_print))
                          if not c.skipped]
        if report_runners:
            print(f"report builders, {a.repeat} rounds: "
                  + ", ".join(c.name for c, _ in report_runners), flush=True)
        for r in range(a.repeat):
            order = report_runners if r % 2 == 0 else report_runners[::-1]
            for config, fn in order:
                config.samples.append(fn())

        print()
        print(self.table(untraced, full, sampled, heaptrack, ml_report, ht_print, against))
        memory = [] if a.preload else self.memory_benchmark()
        device = [] if a.no_device else self.device_benchmark()
        if a.json:
            self.write_json(Path(a.json), [untraced, full, sampled, *against, heaptrack,
                                           ml_report, ht_print, *memory, *device])
        return 0

    # -- instructions: the same storm under callgrind --------------------------

    def instructions(self) -> int:
        """Instructions the storm's threads and the tracer's own run, untraced
        and with the preload library in full and sampled mode: callgrind counts
        them exactly, where a shared machine moves times by a third."""
        valgrind = shutil.which("valgrind")
        library = self.build / "interposer" / "libmemledger.so"
        print("memledger host-heap benchmark: instructions (callgrind)")
        print(f"  program : {' '.join([self.storm.name, *self.storm_args])}")
        print("  memledger: the preload library in LD_PRELOAD, MEMLEDGER_HOST=full or sampled")
        if valgrind is None:
            print("skipped: valgrind not installed (Debian's valgrind package)")
            return 0
        if not library.is_file():
            print(f"skipped: {library} not built")
            return 0
        allocations = self.args.steps * self.args.allocs_per_step
        rows = []
        for mode in (None, "full", "sampled"):
            d = self.fresh("callgrind-" + (mode or "untraced"))
            (d / "run").mkdir(parents=True)
            env = dict(RUN_ENV or os.environ)
            if mode is not None:
                preload = env.get("LD_PRELOAD", "")
                env.update(LD_PRELOAD=f"{library} {preload}".strip(), MEMLEDGER_HOST=mode,
                           MEMLEDGER_DIR=str(d / "run"), MEMLEDGER_QUIET="1")
            argv = [valgrind, "--tool=callgrind", "--separate-threads=yes",
                    f"--callgrind-out-file={d / 'callgrind.out'}", str(self.storm), *self.storm_args]
            with open(d / "stdout.txt", "wb") as out, open(d / "stderr.txt", "wb") as err:
                rc = subprocess.run(argv, stdout=out, stderr=err, env=env).returncode
            program = tracer = 0
            for f in sorted(d.glob("callgrind.out-*")):
                text = f.read_text(errors="replace")
                m = re.search(r"^summary: (\d+)", text, re.M)
                count = int(m.group(1)) if m else 0
                # The storm's threads run its steps; the tracer's are its writer and module threads.
                if "run_step" in text:
                    program += count
                else:
                    tracer += count
            rows.append((mode, rc, program, tracer))
            if rc != 0:
                print(f"  {mode or 'untraced'}: exit {rc}: {tail(d / 'stderr.txt')}")
            if not self.args.keep:
                shutil.rmtree(d, ignore_errors=True)
        base = rows[0][2]
        head = (f"{'configuration':<26} {'program thr.':>13} {'ratio':>7} {'tracer thr.':>12} "
                f"{'all':>13} {'ratio':>7} {'added/alloc':>12}")
        print()
        print(head)
        print("-" * len(head))
        for mode, rc, program, tracer in rows:
            name = "untraced" if mode is None else f"memledger --host {mode}"
            if rc != 0 or program == 0:
                print(f"{name:<26} failed")
                continue
            added = (program - base) / allocations if mode is not None and base > 0 else None
            print(f"{name:<26} {program / 1e6:>12.1f}M {fmt_ratio(ratio(program, base)):>7} "
                  f"{tracer / 1e6:>11.1f}M {(program + tracer) / 1e6:>12.1f}M "
                  f"{fmt_ratio(ratio(program + tracer, base)):>7} "
                  f"{'' if added is None else f'{added:.0f}':>12}")
        print(f"\nprogram thr.: the storm's threads; tracer thr.: memledger's writer and module threads;\n"
              f"added/alloc: the program threads' instructions added per allocation call and its free\n"
              f"({allocations} allocation calls).")
        return 0

    # -- tracer memory against live allocations -------------------------------

    def memory_benchmark(self) -> list[Config]:
        exe = self.build / "bench" / "live_hold"
        print()
        if not os.access(exe, os.X_OK):
            print("memory benchmark skipped: build/bench/live_hold not built")
            return []
        counts = [100000, 2000000]
        configs = []
        for n in counts:
            for mode in (None, "full", "sampled"):
                name = f"{n} live, " + ("untraced" if mode is None else f"--host {mode}")
                c = Config(name)
                d = self.fresh("memory")
                d.mkdir()
                argv = [str(exe), str(n)]
                if mode is not None:
                    argv = [str(self.memledger), "run", "-o", str(d / "run"), "--host", mode,
                            *self.run_flags, "--", *argv]
                rc, wall, rss = run_timed(argv, d / "stdout.txt", d / "stderr.txt")
                m = re.search(r"maxrss_kib=(\d+)", (d / "stdout.txt").read_text(errors="replace"))
                s = Sample(ok=rc == 0 and m is not None, rc=rc, wall_s=wall, tree_rss_kib=rss)
                if m:
                    s.program_rss_kib = int(m.group(1))
                c.samples.append(s)
                configs.append(c)
                if not self.args.keep:
                    shutil.rmtree(d, ignore_errors=True)
        head = f"{'live allocations, mode':<30} {'prog RSS MiB':>12} {'tracer MiB':>11}  target"
        rows = [head, "-" * len(head)]
        for i in range(0, len(configs), 3):
            base = configs[i].median("program_rss_kib")
            n = counts[i // 3]
            for c in configs[i:i + 3]:
                rss = c.median("program_rss_kib")
                if rss is None or base is None:
                    rows.append(f"{c.name:<30} FAILED: {c.failure()}")
                    continue
                extra = (rss - base) / 1024
                target = ""
                if c is not configs[i]:
                    limit = 64 + 48 * n / 2**20
                    target = f"<= {limit:.0f} MiB (64 MiB + 48 B/live): {'ok' if extra <= limit else 'MISSED'}"
                rows.append(f"{c.name:<30} {rss / 1024:>12.1f} "
                            f"{'' if c is configs[i] else f'{extra:+.1f}':>11}  {target}")
        print("tracer memory: peak RSS of a program holding N live 32-byte allocations")
        print("\n".join(rows))
        return configs

    # -- device allocations (CUDA hooks, simulated driver) ---------------------

    def device_run(self, argv: list[str], key: str, traced: list[str] | None) -> Sample:
        """One device_bench run; `traced` = memledger run flags, None = untraced."""
        d = self.fresh("device")
        d.mkdir()
        if traced is not None:
            argv = [str(self.memledger), "run", "-o", str(d / "run"), *traced,
                    *self.run_flags, "--", *argv]
        out, err = d / "stdout.txt", d / "stderr.txt"
        rc, wall, rss = run_timed(argv, out, err)
        s = Sample(ok=rc == 0, rc=rc, wall_s=wall, tree_rss_kib=rss)
        m = re.search(key + r"=([0-9.]+)", out.read_text(errors="replace"))
        if m is None:
            s.ok = False
            s.note = f"exit {rc}, no {key}= line: {tail(err)}"
        else:
            s.program_s = float(m.group(1))
        if not self.args.keep:
            shutil.rmtree(d, ignore_errors=True)
        return s

    def device_benchmark(self) -> list[Config]:
        a = self.args
        exe = self.build / "bench" / "device_bench"
        print()
        if not os.access(exe, os.X_OK):
            print("device benchmark skipped: build/bench/device_bench not built "
                  "(it needs the CUDA headers for the simulated driver)")
            return []
        pairs = "20000" if a.quick else "400000"
        steps = "20" if a.quick else "300"
        pair_argv = [str(exe), "pairs", pairs]
        train_argv = [str(exe), "train", steps]
        configs = [
            (Config("pairs untraced"), pair_argv, "ns_per_pair", None),
            (Config("pairs traced, stacks"), pair_argv, "ns_per_pair", ["--host", "off"]),
            (Config("pairs traced, no stacks"), pair_argv, "ns_per_pair",
             ["--host", "off", "--stack-depth", "0"]),
            (Config("train untraced"), train_argv, "ms_per_step", None),
            (Config("train traced"), train_argv, "ms_per_step", []),
        ]
        print(f"device benchmark (simulated driver): {pairs} cuMemAllocAsync/cuMemFreeAsync "
              f"pairs 20 frames deep; a {steps}-step loop with 64 device allocations and "
              f"~2 ms of host work per step; {a.repeat} interleaved rounds", flush=True)
        for r in range(a.repeat):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for config, argv, key, traced in order:
                config.samples.append(self.device_run(argv, key, traced))
        base_pair = configs[0][0].median("program_s")
        base_step = configs[3][0].median("program_s")
        head = f"{'configuration':<26} {'per pair / step':>16} {'added':>12}  target"
        rows = [head, "-" * len(head)]
        for config, _, key, traced in configs:
            if not config.good():
                rows.append(f"{config.name:<26} FAILED: {config.failure()}")
                continue
            v = config.median("program_s")
            unit = "ns" if key == "ns_per_pair" else "ms"
            base = base_pair if key == "ns_per_pair" else base_step
            added = "" if traced is None or base is None else f"{v - base:+.1f} {unit}"
            target = ""
            if config.name == "pairs traced, stacks" and base is not None:
                target = f"added <= 250 ns: {'ok' if v - base <= 250 else 'MISSED'}"
            if config.name == "train traced" and base is not None:
                target = f"step time {fmt_ratio(ratio(v, base))}"
            rows.append(f"{config.name:<26} {v:>13.1f} {unit} {added:>12}  {target}")
        rows.append("traced pairs run with --host off (device hooks only); the training loop "
                    "with memledger's defaults (host heap sampled).")
        print("\n".join(rows))
        return [c for c, _, _, _ in configs]

    # -- output -------------------------------------------------------------

    def header(self) -> str:
        a = self.args
        storm = " ".join([str(self.storm.relative_to(self.build.parent))
                          if self.storm.is_relative_to(self.build.parent)
                          else str(self.storm), *self.storm_args])
        lines = [
            "memledger host-heap benchmark",
            f"  machine : {machine_description()}",
            f"  program : {storm}",
            f"  runs    : {a.repeat} per configuration, interleaved, median shown",
        ]
        if self.run_flags:
            lines.append(f"  memledger run flags: {' '.join(self.run_flags)}")
        if self.against is not None:
            lines.append(f"  against : {self.against} (\"against:\" rows, the same flags and program)")
        lines.append(f"  load    : {load_note()}")
        return "\n".join(lines)

    def table(self, untraced: Config, full: Config, sampled: Config,
              heaptrack: Config, ml_report: Config, ht_print: Config,
              against: list[Config] | None = None) -> str:
        base_prog = untraced.median("program_s")
        base_wall = untraced.median("wall_s")
        base_cpu = untraced.median("cpu_s")
        allocations = self.args.steps * self.args.allocs_per_step
        base_rss = untraced.median("program_rss_kib")
        base_tree = untraced.median("tree_rss_kib")

        head = (f"{'configuration':<26} {'program s':>10} {'ratio':>7} "
                f"{'command s':>10} {'ratio':>7} {'CPU s':>8} {'ratio':>7} "
                f"{'prog RSS MiB':>12} {'ratio':>7} "
                f"{'tree RSS MiB':>12} {'trace MiB':>10} {'B/alloc':>8}  target")
        rows = [head, "-" * len(head)]
        targets = {full.name: TARGET_FULL, sampled.name: TARGET_SAMPLED}
        # Full mode's other targets are against heaptrack, where it ran.
        heaptrack_ok = not heaptrack.skipped and heaptrack.good()
        heaptrack_prog = heaptrack.median("program_s") if heaptrack_ok else None
        heaptrack_trace = heaptrack.median("trace_bytes") if heaptrack_ok else None
        for c in (untraced, full, sampled, *(against or []), heaptrack):
            if c.skipped:
                rows.append(f"{c.name:<26} skipped: {c.skipped}")
                continue
            if not c.good():
                rows.append(f"{c.name:<26} FAILED: {c.failure()}")
                continue
            prog, wall = c.median("program_s"), c.median("wall_s")
            rss, tree = c.median("program_rss_kib"), c.median("tree_rss_kib")
            trace = c.median("trace_bytes")
            cpu = c.median("cpu_s")
            per_alloc = trace / allocations if trace else None
            r_prog = ratio(prog, base_prog)
            target = ""
            if c.name in targets:
                t = targets[c.name]
                verdict = "ok" if r_prog is not None and r_prog <= t else "MISSED"
                target = f"program <= {t:g}x: {verdict}"
                if c is full:
                    r_cpu = ratio(cpu, base_cpu)
                    target += f"; CPU <= {t:g}x: {'ok' if r_cpu is not None and r_cpu <= t else 'MISSED'}"
                    if heaptrack_prog:
                        target += f"; faster than heaptrack: {'ok' if prog is not None and prog < heaptrack_prog else 'MISSED'}"
                    if heaptrack_trace and trace:
                        r_trace = trace / heaptrack_trace
                        target += (f"; trace <= {TARGET_TRACE:g}x heaptrack's: "
                                   f"{'ok' if r_trace <= TARGET_TRACE else 'MISSED'} ({r_trace:.2f}x)")
            failed = len(c.samples) - len(c.good())
            if failed:
                target += f" ({failed} run(s) failed: {c.failure()})"
            rows.append(
                f"{c.name:<26} {fmt(prog, 3):>10} {fmt_ratio(r_prog):>7} "
                f"{fmt(wall, 3):>10} {fmt_ratio(ratio(wall, base_wall)):>7} "
                f"{fmt(cpu, 3):>8} {fmt_ratio(ratio(cpu, base_cpu)):>7} "
                f"{fmt(kib_to_mib(rss), 1):>12} {fmt_ratio(ratio(rss, base_rss)):>7} "
                f"{fmt(kib_to_mib(tree), 1):>12} {fmt(bytes_to_mib(trace), 1):>10} "
                f"{fmt(per_alloc, 2):>8}  "
                f"{target}")
        notes = [
            "",
            "program s: the storm's own elapsed time (its last stdout line);",
            "command s: the whole command, start to exit"
            + (" (memledger run --no-report: no report building)."
               if self.has_no_report else
               " (memledger: includes writing the report, no --no-report option)."),
            "prog RSS: the storm process's own peak RSS (in-process tracer included);",
            "tree RSS: the largest single process of the command (e.g. heaptrack_interpret).",
            "CPU s: user + system CPU of the whole command (tracer threads and heaptrack_interpret included);",
            "trace: memledger run folder / heaptrack .zst file; B/alloc: trace bytes per allocation",
            "  call (each with its free: about two events).",
        ]
        rows.extend(notes)

        rows.append("")
        head2 = (f"{'report builder':<32} {'wall s':>8} {'peak RSS MiB':>12}  "
                 f"ratio to heaptrack_print")
        rows += [head2, "-" * len(head2)]
        ht_wall = ht_print.median("wall_s")
        for c in (ml_report, ht_print):
            if c.skipped:
                rows.append(f"{c.name:<32} skipped: {c.skipped}")
                continue
            if not c.good():
                rows.append(f"{c.name:<32} FAILED: {c.failure()}")
                continue
            wall = c.median("wall_s")
            line = (f"{c.name:<32} {fmt(wall, 3):>8} "
                    f"{fmt(kib_to_mib(c.median('tree_rss_kib')), 1):>12}  ")
            if c is ml_report and ht_wall is not None:
                r = ratio(wall, ht_wall)
                verdict = "ok" if r is not None and r <= TARGET_REPORT else "MISSED"
                line += f"{fmt_ratio(r)}  target <= {TARGET_REPORT:g}x: {verdict}"
            rows.append(line)
        rows.append("(memledger report on the full-mode trace, heaptrack_print on "
                    "heaptrack's trace of the same storm)")
        return "\n".join(rows)

    def write_json(self, path: Path, configs: list[Config]) -> None:
        data = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "machine": machine_description(),
            "storm_args": self.storm_args,
            "memledger_run_flags": self.run_flags,
            "configs": {
                c.name: {"skipped": c.skipped,
                         "samples": [s.__dict__ for s in c.samples]}
                for c in configs},
        }
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"\nraw results written to {path}")


def ratio(x: float | None, base: float | None) -> float | None:
    if x is None or base is None or base <= 0:
        return None
    return x / base


def fmt(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def kib_to_mib(x: float | None) -> float | None:
    return None if x is None else x / 1024


def bytes_to_mib(x: float | None) -> float | None:
    return None if x is None else x / (1024 * 1024)


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    values = [int(v) for v in fields[:8]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def load_note() -> str:
    """How busy the machine is right now (over one second), before we start:
    anything else running makes the timings noisy."""
    first = cpu_times()
    time.sleep(1.0)
    second = cpu_times()
    if first is None or second is None or second[1] == first[1]:
        return "unknown"
    busy = (second[0] - first[0]) / (second[1] - first[1]) * (os.cpu_count() or 1)
    note = f"{busy:.2f} CPUs busy before the start"
    if busy > 0.25:
        note += "  WARNING: something else is running, timings will be noisy"
    return note


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Host-heap benchmark: untraced vs memledger vs heaptrack.")
    p.add_argument("--build", default="build",
                   help="meson build folder (default: build, relative to the "
                        "current folder or else to the repository root)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs per configuration, median reported (default 3; "
                        "1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: --steps {QUICK_STEPS}, one round")
    p.add_argument("--steps", type=int, default=None,
                   help=f"storm steps (default {DEFAULT_STEPS})")
    p.add_argument("--allocs-per-step", type=int, default=DEFAULT_ALLOCS_PER_STEP,
                   help=f"storm allocations per step (default {DEFAULT_ALLOCS_PER_STEP})")
    p.add_argument("--threads", type=int, default=1,
                   help="storm threads (default 1)")
    p.add_argument("--deep", action="store_true",
                   help=f"the second storm: built without frame pointers, {DEEP_DEPTH} to "
                        f"{2 * DEEP_DEPTH} more frames above each call site (build/bench/storm_nofp)")
    p.add_argument("--against", metavar="BUILD",
                   help="another build folder (an earlier commit's, say, in a git worktree): its "
                        "tools/memledger runs in full and sampled mode in the same rounds, on this "
                        "build's storm, as the \"against:\" rows (a before-and-after on one machine "
                        "at one time)")
    p.add_argument("--keep", action="store_true",
                   help="keep the traces and logs (their folder is printed)")
    p.add_argument("--json", metavar="FILE", help="also write raw results as JSON")
    p.add_argument("--no-device", action="store_true",
                   help="skip the device allocation benchmark")
    p.add_argument("--preload", metavar="LIB",
                   help="host runs on a replacement allocator: LIB (libjemalloc.so.2, "
                        "libtcmalloc_minimal.so.4, libmimalloc.so.2) in LD_PRELOAD of every "
                        "run; heaptrack, the tracer memory and device benchmarks are skipped")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions instead (callgrind): untraced, full and sampled "
                        "mode, the program's threads and the tracer's apart (default --steps 4)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every run")
    a = p.parse_args(argv)
    if a.preload:
        global RUN_ENV
        RUN_ENV = dict(os.environ, LD_PRELOAD=a.preload)
        a.no_device = True
    if a.steps is None:
        a.steps = INSTRUCTION_STEPS if a.instructions else QUICK_STEPS if a.quick else DEFAULT_STEPS
    if a.repeat is None:
        a.repeat = 1 if a.quick else 3
    if a.repeat < 1 or a.steps < 1 or a.allocs_per_step < 1 or a.threads < 1:
        p.error("--repeat, --steps, --allocs-per-step and --threads must be >= 1")
    return a


if __name__ == "__main__":
    sys.exit(Bench(parse_args(sys.argv[1:])).main())
