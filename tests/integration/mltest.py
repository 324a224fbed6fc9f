"""Shared helpers for memledger's integration tests (not a test itself).

Paths come from the environment that tests/integration/meson.build sets
(MLTEST_*; deliberately not MEMLEDGER_*, which the tracer and the command line
read themselves). Run by hand, the defaults point into ./build of the source
tree:

    python3 tests/integration/test_cli.py -v
"""

import bisect
import collections
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE_DIR = pathlib.Path(os.environ.get("MLTEST_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("MLTEST_BUILD_DIR", SOURCE_DIR / "build"))
MEMLEDGER = os.environ.get("MLTEST_MEMLEDGER", str(BUILD_DIR / "tools" / "memledger"))
LIBRARY = os.environ.get("MLTEST_LIBRARY", str(BUILD_DIR / "interposer" / "libmemledger.so"))

# Upper bound for any one command; the meson timeout (120 s) is per file.
TIMEOUT = 60


def program(name):
    """Path of one of the programs in tests/programs."""
    return os.environ.get("MLTEST_PROGRAM_" + name, str(BUILD_DIR / "tests" / "programs" / name))


def preload(name):
    """Path of one of the preload libraries built in tests/programs."""
    return os.environ.get("MLTEST_PRELOAD_" + name, str(BUILD_DIR / "tests" / "programs" / ("lib%s.so" % name)))


def clean_env(**extra):
    """The environment without any tracer settings inherited from whoever runs
    the tests (the suite itself may run under memledger)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("MEMLEDGER_")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def no_core_dumps():
    """preexec_fn: the crash tests must not leave core files behind."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def session_pids(sid):
    """The processes of a session, in order of pid."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == sid:
                pids.append(int(entry))
        except (ProcessLookupError, PermissionError):
            pass
    return sorted(pids)


def kill_session(sid):
    """SIGKILL to every process of a session (see TestCase.run_cmd)."""
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def describe_session(sid, limit=8, gdb_seconds=20):
    """What the processes of a session are doing, for a command that ran
    past its timeout: each one's command, and each thread's state, kernel
    wait channel and, where gdb is installed, its stack (a hang that shows
    once in hundreds of runs must say where it hung the first time). gdb
    gets `gdb_seconds` in all, so that the test file stays within its own
    timeout."""
    lines = []
    gdb = shutil.which("gdb")
    gdb_until = time.monotonic() + gdb_seconds
    pids = session_pids(sid)
    for pid in pids[:limit]:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            lines.append("== pid %d: %s" % (pid, command))
            for tid in sorted(os.listdir("/proc/%d/task" % pid), key=int):
                base = "/proc/%d/task/%s/" % (pid, tid)
                with open(base + "stat") as f:
                    stat = f.read()
                with open(base + "wchan") as f:
                    wchan = f.read().strip()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                state = stat[stat.rindex(")") + 2:].split()[0]
                lines.append("   thread %s (%s): %s, waiting in %s" % (tid, name, state, wchan or "-"))
        except OSError:
            continue
        left = gdb_until - time.monotonic()
        if gdb and left > 1:
            try:
                trace = subprocess.run([gdb, "-batch", "-nx", "-p", str(pid), "-ex", "thread apply all bt 30"],
                                       capture_output=True, text=True, errors="replace", timeout=left).stdout
                lines.extend("   " + l[:240] for l in trace.splitlines() if l.startswith(("Thread ", "#")))
            except subprocess.TimeoutExpired:
                lines.append("   (gdb did not answer)")
    if len(pids) > limit:
        lines.append("(%d more processes)" % (len(pids) - limit))
    return "\n".join(lines)


def parse_kv(text):
    """KEY=VALUE lines of a test program's output, as a dict of strings."""
    values = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([A-Z_]+)=(.*)", line.strip())
        if m:
            values[m.group(1)] = m.group(2)
    return values


def function_base(name):
    """The bare identifier of a function name as the report prints it,
    whether plain or demangled and qualified:
    "(anonymous namespace)::plant_leak(unsigned long, unsigned long)" and
    "plant_leak" both give "plant_leak"."""
    name = name.replace("(anonymous namespace)", "")
    if "(" in name:
        name = name[:name.index("(")]
    while "<" in name:  # template arguments, innermost first
        stripped = re.sub(r"<[^<>]*>", "", name)
        if stripped == name:
            break
        name = stripped
    return name.split("::")[-1].strip()


def site_parts(site):
    """(function, file, line) of a report site "FUNCTION at FILE:LINE"; the
    function as function_base() gives it."""
    m = re.fullmatch(r"(.*) at ([^ :]+):(\d+)", site)
    if m is None:
        return (site, None, None)
    return (function_base(m.group(1)), m.group(2), int(m.group(3)))


def memledger_lines(stderr):
    """The lines memledger itself wrote on stderr."""
    return [line for line in stderr.splitlines() if line.startswith("memledger:")]


# --- Trace file layout (interposer/trace_format.h) ------------------------------

FILE_HEADER = struct.Struct("<8sII")  # magic, version, header_len
FRAME_HEADER = struct.Struct("<6I")  # magic, flags, stored_len, raw_len, crc32, index
FRAME_MAGIC = 0x4D4C4652


class Frame:
    def __init__(self, offset, fields):
        self.offset = offset
        self.magic, self.flags, self.stored_len, self.raw_len, self.crc32, self.index = fields

    @property
    def payload_offset(self):
        return self.offset + FRAME_HEADER.size

    @property
    def end(self):
        return self.payload_offset + self.stored_len


def split_frames(data):
    """(end of the file header, [Frame...]) of an intact trace."""
    magic, version, header_len = FILE_HEADER.unpack_from(data, 0)
    assert magic == b"MLEDGER\n" and version >= 1, (magic, version)
    pos = FILE_HEADER.size + header_len
    header_end = pos
    frames = []
    while pos + FRAME_HEADER.size <= len(data):
        frame = Frame(pos, FRAME_HEADER.unpack_from(data, pos))
        assert frame.magic == FRAME_MAGIC, "not an intact trace at byte %d" % pos
        frames.append(frame)
        pos = frame.end
    assert pos == len(data), "trailing bytes after the last frame"
    return header_end, frames


PYTHON_CODE_LINE = re.compile(r"python_code id=(\d+) file=(.*) function=(.*) first_line=(-?\d+) ")


def allocation_stacks(trace):
    """The (bytes, frames) of each allocation of a trace, frames named by
    module and offset, Python frames by their code's file, function and
    first line and the offset ("py:FILE:FUNCTION:LINE+OFFSET"), as a
    multiset. Code ids follow the order in which the interpreter's code
    first allocated, which changes from run to run: a dict keyed by
    addresses grows at another time."""
    dump = subprocess.run([MEMLEDGER, "dump", trace], capture_output=True, text=True, check=True).stdout

    def fields(line):
        return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)

    modules = sorted((int(f["base"], 16), f["path"]) for f in
                     (fields(line) for line in dump.splitlines() if line.startswith("module ")))
    bases = [base for base, _ in modules]
    codes = dict((m.group(1), "%s:%s:%s" % m.group(2, 3, 4)) for m in
                 (PYTHON_CODE_LINE.match(line) for line in dump.splitlines()) if m)

    def name(word):
        kind, colon, rest = word.partition(":")
        if colon and kind in ("py", "py-attributed"):
            code, plus, offset = rest.partition("+")
            return "%s:%s+%s" % (kind, codes.get(code, code), offset) if plus else word
        if not word.startswith("0x"):
            return word
        address = int(word, 16)
        i = bisect.bisect_right(bases, address) - 1
        return "%s+%x" % (modules[i][1], address - bases[i]) if i >= 0 and bases[i] else word

    stacks, allocations = {}, collections.Counter()
    for line in dump.splitlines():
        if line.startswith("stack "):
            parts = line.split()
            stacks[parts[1]] = tuple(name(w) for w in parts[3:])
        elif line.startswith("alloc "):
            f = fields(line)
            allocations[(f["bytes"], stacks.get("id=" + f["stack"], ("unknown", f["stack"])))] += 1
    return allocations


# --- Test case base -------------------------------------------------------------


class TestCase(unittest.TestCase):
    maxDiff = 4000

    @classmethod
    def class_tmpdir(cls):
        d = tempfile.mkdtemp(prefix="mltest-%s-" % cls.__name__)
        if not os.environ.get("MLTEST_KEEP"):
            cls.addClassCleanup(shutil.rmtree, d, True)
        return d

    def tmpdir(self):
        d = tempfile.mkdtemp(prefix="mltest-%s-" % self._testMethodName)
        if not os.environ.get("MLTEST_KEEP"):  # MLTEST_KEEP=1 keeps the run folders to look at
            self.addCleanup(shutil.rmtree, d, True)
        return d

    @staticmethod
    def run_cmd(args, timeout=TIMEOUT, env=None, cwd=None, crash_ok=False, stdin=subprocess.DEVNULL):
        """Runs a command to completion, capturing text output. It runs in a
        session of its own: on a timeout what its processes were doing goes
        to stderr (describe_session), the whole process tree is killed (a
        hung traced child must not outlive the test), then
        subprocess.TimeoutExpired is raised."""
        proc = subprocess.Popen(
            [str(a) for a in args],
            env=clean_env() if env is None else env,
            cwd=cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=no_core_dumps if crash_ok else None,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            sys.stderr.write("%s ran past %d s; its processes:\n%s\n" % (args[0], timeout, describe_session(proc.pid)))
            kill_session(proc.pid)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    @classmethod
    def memledger(cls, *args, **kwargs):
        return cls.run_cmd([MEMLEDGER, *args], **kwargs)

    @classmethod
    def traced(cls, run_dir, command, options=("--host", "full"), **kwargs):
        """`memledger run -q -o RUN_DIR OPTIONS -- COMMAND`; returns the
        completed process (the report is in RUN_DIR)."""
        return cls.memledger("run", "-q", "-o", run_dir, *options, "--", *command, **kwargs)

    @staticmethod
    def load_report(run_dir):
        with open(os.path.join(run_dir, "report.json")) as f:
            return json.load(f)

    @staticmethod
    def describe(proc):
        return "exit %s\n--- stdout\n%s\n--- stderr\n%s" % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])

    def assertExit(self, proc, code):
        self.assertEqual(proc.returncode, code, self.describe(proc))

    def assertNoCrash(self, proc):
        """memledger itself must never die of a signal or an internal error."""
        self.assertTrue(0 <= proc.returncode < 128, self.describe(proc))
        self.assertNotIn("internal error", proc.stderr)


def main():
    unittest.main(verbosity=2)
