"""memledger's pytest plugin: memory gates per test, from the tracer's own
counters (the wheel's `pytest11` entry point; from a source build, `pytest
-p memledger.pytest_plugin` with the memledger package on the path).

    pytest --memledger                  # re-runs this pytest command under `memledger run`
    pytest --memledger-report DIR       # the same, keeping the run folder in DIR

    @pytest.mark.memledger_limit_growth("64 KiB", kind="device")
    def test_step_does_not_leak(): ...

    @pytest.mark.memledger_limit_peak("2 GiB")
    def test_fits(): ...

A growth limit compares the tracer's exact live bytes of the kind after the
test body with those before it, each read after gc.collect() (and
torch.cuda.synchronize() where PyTorch has initialised CUDA). A peak limit
bounds the highest live bytes of the kind during the body above those at
its start, replayed from the trace. A test over its limit fails with the
sites that grew, found by replaying the test body's stretch of the trace
(`memledger window`). Each test ends one step labelled by its id, so
`memledger report` and `memledger check` read a test session as a run.
"""

import gc
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

import memledger
from memledger._command import command_path

# Set in the re-run session: it must not re-run itself again.
_SESSION_ENV = "MEMLEDGER_PYTEST_SESSION"
_KINDS = ("total", "host", "device", "managed", "pinned")
_GPU_KINDS = ("device", "managed", "pinned")
_WINDOW_KIND = {"pinned": "pinned_host"}  # the report's name of a kind
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4}


def parse_size(text):
    """Bytes of "4096", "64 KiB", "1.5GiB", "10 MB" (KB = 1000, KiB = 1024),
    or of a number of bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError("a size cannot be negative: %r" % (text,))
        return int(text)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(text))
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError("not a size: %r (use e.g. 4096, \"64 KiB\", \"1.5 GiB\", \"10 MB\")" % (text,))
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def human(n):
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%s%d %s" % (sign, n, unit) if unit == "B" else "%s%.1f %s" % (sign, n, unit)
        n /= 1024.0


class Limit:
    """One memledger_limit_* marker of a test."""

    def __init__(self, what, marker):
        self.what = what
        if len(marker.args) != 1:
            raise pytest.UsageError("%s needs one size, e.g. %s(\"64 KiB\")" % (marker.name, marker.name))
        try:
            self.limit = parse_size(marker.args[0])
        except ValueError as e:
            raise pytest.UsageError("%s: %s" % (marker.name, e))
        self.kind = marker.kwargs.get("kind", "total")
        if self.kind not in _KINDS:
            raise pytest.UsageError("%s: kind must be one of %s, not %r" % (marker.name, ", ".join(_KINDS), self.kind))
        unknown = set(marker.kwargs) - {"kind"}
        if unknown:
            raise pytest.UsageError("%s: unknown argument %s" % (marker.name, ", ".join(sorted(unknown))))
        self.name = marker.name


def _limits(item):
    out = []
    for what in ("growth", "peak"):
        marker = item.get_closest_marker("memledger_limit_" + what)
        if marker is not None:
            out.append(Limit(what, marker))
    return out


def pytest_addoption(parser):
    group = parser.getgroup("memledger", "memory gates per test (memledger)")
    group.addoption("--memledger", action="store_true", default=False,
                    help="re-run this session under `memledger run`: enables the memledger_limit_* markers")
    group.addoption("--memledger-report", metavar="DIR", default=None,
                    help="like --memledger, and keep the run folder in DIR (one step per test, labelled by "
                         "its id): `memledger report DIR`, `memledger check DIR`")
    group.addoption("--memledger-host", metavar="MODE", default="sampled", choices=("sampled", "full", "off"),
                    help="host heap tracking: sampled (default; per-site host bytes estimated), full (exact), off")
    group.addoption("--memledger-leak-mode", action="store_true", default=False,
                    help="`memledger run --leak-mode`: every tensor allocation visible to the driver")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "memledger_limit_growth(size, kind='total'): fail when the live bytes of `kind` (total, host, device, "
        "managed, pinned) grew by more than `size` across the test body (under --memledger)")
    config.addinivalue_line(
        "markers",
        "memledger_limit_peak(size, kind='total'): fail when the live bytes of `kind` rose more than `size` above "
        "their level at the start of the test body (under --memledger)")


def _wanted(config):
    return bool(config.getoption("memledger") or config.getoption("memledger_report"))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if not _wanted(config) or os.environ.get(_SESSION_ENV) or memledger.active():
        return None
    if config.getoption("help", False) or config.getoption("version", False):
        return None
    return _rerun(config)


def _rerun(config):
    """Runs the same pytest command under `memledger run`; its exit status."""
    exe = command_path()
    if exe is None:
        raise pytest.UsageError("--memledger: the memledger command line is not installed with the memledger "
                                "package at %s" % os.path.dirname(memledger.__file__))
    keep = config.getoption("memledger_report")
    run_dir = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix="memledger-pytest-")
    cmd = [exe, "run", "-q", "-o", run_dir, "--overwrite", "--host", config.getoption("memledger_host")]
    if not keep:
        cmd.append("--no-report")
    if config.getoption("memledger_leak_mode"):
        cmd.append("--leak-mode")
    cmd += ["--", sys.executable, "-m", "pytest", *config.invocation_params.args]
    env = dict(os.environ)
    env[_SESSION_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    # Ctrl-C reaches the traced session too (one process group): let it end
    # the session as pytest does, then pass its status on.
    previous = signal.signal(signal.SIGINT, lambda signo, frame: None)
    try:
        status = subprocess.call(cmd, env=env, cwd=str(config.invocation_params.dir))
    finally:
        signal.signal(signal.SIGINT, previous)
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    if keep:
        sys.stderr.write("memledger: run folder %s (one step per test): memledger report %s\n" % (run_dir, run_dir))
    return status



def _has_gpu():
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return bool(torch.cuda.is_available())
        except Exception:
            return False
    return bool(glob.glob("/proc/driver/nvidia/gpus/*")) or bool(glob.glob("/dev/nvidia[0-9]*"))


def _settle():
    """What the test left behind is freed or finished before counting."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception:
            pass


def pytest_collection_finish(session):
    # Start-up and collection are a step of their own: each test's step is then its own.
    if memledger.active():
        memledger.step("pytest: start-up and collection")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if memledger.active():
        memledger.step(item.nodeid)


def pytest_runtest_setup(item):
    limits = _limits(item)
    if not limits:
        return
    if not memledger.active():
        if _wanted(item.config):
            pytest.skip("memledger is not tracing this session (see memledger's message above): %s not checked"
                        % ", ".join(limit.name for limit in limits))
        return
    for limit in limits:
        if limit.kind in _GPU_KINDS and not _has_gpu():
            pytest.skip("%s(kind=%r) needs a GPU, and none is present" % (limit.name, limit.kind))


def _live_bytes(now, kind):
    if kind == "total":
        return sum(now.live.values())
    return now.live[kind]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    limits = _limits(item) if memledger.active() else []
    if not limits:
        yield
        return
    _settle()
    before = memledger.live()
    outcome = yield
    if outcome.excinfo is not None:
        return  # the test failed by itself: that is its report
    _settle()
    after = memledger.live()
    problems = []
    window = None
    for limit in limits:
        if limit.what == "growth":
            grown = _live_bytes(after, limit.kind) - _live_bytes(before, limit.kind)
            if grown > limit.limit:
                problems.append((limit, "%s live bytes grew by %s across the test body (limit %s)"
                                 % (limit.kind, human(grown), human(limit.limit))))
        else:
            window = window or _window(before.seq, after.seq)
            peak = window["kinds"][_WINDOW_KIND.get(limit.kind, limit.kind)]["peak"] if window else None
            if peak is None:
                problems.append((limit, "the peak could not be read from the trace: %s" % _window_error))
            elif peak > limit.limit:
                problems.append((limit, "%s live bytes rose to %s above their level at the start of the test body "
                                 "(limit %s)" % (limit.kind, human(peak), human(limit.limit))))
    if problems:
        window = window or _window(before.seq, after.seq)
        item._memledger_failure = _failure_text(problems, window, after.host_sampled)


_window_error = ""


def _window(from_seq, to_seq):
    """The trace's account of [from_seq, to_seq) in this process (memledger
    window), or None (the reason in _window_error)."""
    global _window_error
    memledger.flush()
    run_dir = memledger.run_dir()
    traces = sorted(glob.glob(os.path.join(run_dir or "", "trace.%d.*mlt" % os.getpid())), key=os.path.getmtime)
    exe = command_path()
    if not traces or exe is None:
        _window_error = "no trace of pid %d in %s" % (os.getpid(), run_dir) if exe else "no memledger command"
        return None
    proc = subprocess.run([exe, "window", traces[-1], "--from-seq", str(from_seq), "--to-seq", str(to_seq),
                           "--top", "3"], capture_output=True, text=True, env=_untraced_env())
    if proc.returncode != 0:
        _window_error = proc.stderr.strip() or "memledger window exited with %d" % proc.returncode
        return None
    return json.loads(proc.stdout)


def _untraced_env():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("MEMLEDGER_")}
    return env


def _test_frames(stack, most=12):
    """The stack's frames down to the test function: pytest's own frames
    that called it say nothing."""
    out = []
    for frame in stack[:most]:
        if re.search(r"/(_pytest|pluggy)/", frame):
            break
        out.append(frame)
    return out


def _failure_text(problems, window, host_sampled):
    lines = []
    for limit, text in problems:
        lines.append("%s(%s, kind=%r): %s" % (limit.name, human(limit.limit), limit.kind, text))
        if window is None:
            lines.append("  (no site: %s)" % _window_error)
            continue
        sites = window["kinds"][_WINDOW_KIND.get(limit.kind, limit.kind)]["sites"]
        if limit.what == "peak":
            sites = sorted(sites, key=lambda s: -s["at_peak"])
        if not sites:
            lines.append("  no allocation site grew in the trace over the test body")
            continue
        top = sites[0]
        amount = top["growth"] if limit.what == "growth" else top["at_peak"]
        lines.append("  top %s site: %s (%s %s, %d allocations)"
                     % ("growing" if limit.what == "growth" else "live-at-peak", top["site"],
                        "+" + human(amount) if limit.what == "growth" else human(amount),
                        top["kind"], top["allocations"]))
        for frame in _test_frames(top["stack"]):
            lines.append("      " + frame)
        for other in sites[1:]:
            amount = other["growth"] if limit.what == "growth" else other["at_peak"]
            lines.append("  then: %s (%s %s)" % (other["site"], human(amount), other["kind"]))
    if host_sampled and any(limit.kind in ("host", "total") for limit, _ in problems):
        lines.append("  (sampled host mode: the live totals are exact, host sites' bytes and host peaks are "
                     "estimates; --memledger-host full makes them exact)")
    return "\n".join(lines)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    text = getattr(item, "_memledger_failure", None)
    if call.when == "call" and text is not None:
        report = outcome.get_result()
        report.outcome = "failed"
        report.longrepr = text
        del item._memledger_failure
