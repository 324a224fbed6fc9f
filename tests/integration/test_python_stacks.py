"""Python frames in every stack: pure-Python programs under `memledger run`
(full and sampled host modes) with each CPython found here (Debian's
/usr/bin/python3, the python3 that runs the tests, and any pyenv 3.9 to 3.13),
checking the exact file:line and function of planted leaks (host, and device
through the simulated CUDA), Python frames first and native frames after
them, allocations made with the GIL released, threads without Python, fork
and multiprocessing, shutdown with busy daemon threads, frame memory that
cannot be read, and the single note for an interpreter memledger does not
read."""

import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap

import mltest

# Three leaks per step of different sizes, so each is its own suspect:
#   100_000 B from Python code holding the GIL,
#   300_000 B from Python code through ctypes, which releases the GIL,
#   500_000 B from a thread that never runs Python (pthread_create with
#   malloc itself as the start routine): its stack starts with the main
#   thread's Python frames, marked as attributed.
LEAKS = textwrap.dedent('''
    import ctypes, sys

    libc = ctypes.CDLL(None)
    step = libc.memledger_step
    step.argtypes = [ctypes.c_char_p]
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.POINTER(ctypes.c_void_p)]
    MALLOC = ctypes.cast(libc.malloc, ctypes.c_void_p).value

    held = []
    native = []


    def grow():
        held.append(bytearray(100_000))  # LEAK_GIL


    def grow_without_gil():
        native.append(libc.malloc(300_000))  # LEAK_NOGIL


    def grow_in_native_thread():
        thread = ctypes.c_ulong()
        assert libc.pthread_create(ctypes.byref(thread), None, MALLOC, 500_000) == 0  # NATIVE_START
        result = ctypes.c_void_p()
        assert libc.pthread_join(thread.value, ctypes.byref(result)) == 0  # NATIVE_JOIN
        native.append(result.value)


    class Trainer:
        def run(self, steps):
            for _ in range(steps):
                grow()  # CALL_GROW
                grow_without_gil()
                grow_in_native_thread()  # CALL_NATIVE
                step(None)


    Trainer().run(int(sys.argv[1]))
    print("done", len(held), len(native))
''')

# A forked child that leaks on its own, then multiprocessing with the fork
# and spawn start methods.
PROCESSES = textwrap.dedent('''
    import ctypes, multiprocessing, os, sys

    step = ctypes.CDLL(None).memledger_step
    step.argtypes = [ctypes.c_char_p]


    def child_grow(kept):
        kept.append(bytearray(70_000))  # LEAK_CHILD


    def square(x):
        return x * x


    def main():
        pid = os.fork()
        if pid == 0:
            kept = []
            for _ in range(15):
                child_grow(kept)
                step(None)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        print("FORK_PID=%d" % pid)
        for method in ("fork", "spawn"):
            with multiprocessing.get_context(method).Pool(2) as pool:
                print(method, sum(pool.map(square, range(100))))


    if __name__ == "__main__":
        main()
''')

# Device memory from Python: the simulated CUDA runtime through ctypes.
DEVICE = textwrap.dedent('''
    import ctypes, sys

    runtime = ctypes.CDLL(sys.argv[1])
    step = ctypes.CDLL(None).memledger_step
    step.argtypes = [ctypes.c_char_p]
    kept = []


    def grow_device():
        pointer = ctypes.c_void_p()
        assert runtime.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(3 << 20)) == 0  # LEAK_DEVICE
        kept.append(pointer)


    for _ in range(12):
        grow_device()
        step(None)
    print("device", len(kept))
''')

# libc through ctypes, and a hole in the address space (mapped, then
# unmapped): what the fault scripts below share.
UNREADABLE = textwrap.dedent('''
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    hole = libc.mmap(None, 1 << 20, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
    libc.munmap(hole + 4096, (1 << 20) - 4096)  # its first page stays
    kept = []
''')

# The thread's current frame (3.11 layout: PyThreadState.cframe at 56,
# _PyCFrame.current_frame at 8), pointed into the hole around each call.
POKE_FRAME = textwrap.dedent('''
    poke = libc.memcpy
    poke.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p
    cframe = ctypes.c_void_p.from_address(ctypes.pythonapi.PyThreadState_Get() + 56).value
    slot = cframe + 8
    saved = ctypes.c_void_p(ctypes.c_void_p.from_address(slot).value)
    bogus = ctypes.c_void_p(hole + 8192)
''')

# The walk meets unreadable memory around each allocation. The fault guard
# must abandon the walk (native stack only) and the program must go on.
FAULT = UNREADABLE + POKE_FRAME + textwrap.dedent('''
    for _ in range(100):
        poke(slot, ctypes.byref(bogus), 8); kept.append(libc.malloc(345_678)); poke(slot, ctypes.byref(saved), 8)
    print("survived", len(kept))
''')

# The same in threads that block SIGSEGV and SIGBUS (as libzmq's I/O
# threads block every signal): the main thread itself, then threads that
# never run Python, started with its mask, whose stacks begin with its
# frames (attributed). The walk must unblock the fault signals while it
# reads, or the kernel ends the process at the fault.
BLOCKED_FAULT = UNREADABLE + POKE_FRAME + textwrap.dedent('''
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.POINTER(ctypes.c_void_p)]
    MALLOC = ctypes.cast(libc.malloc, ctypes.c_void_p).value
    thread = ctypes.c_ulong()
    result = ctypes.c_void_p()
    faults = (ctypes.c_uint64 * 16)((1 << 10) | (1 << 6))  # SIGSEGV (11), SIGBUS (7)
    assert libc.pthread_sigmask(0, faults, None) == 0  # SIG_BLOCK
    for _ in range(50):
        poke(slot, ctypes.byref(bogus), 8); kept.append(libc.malloc(345_678)); poke(slot, ctypes.byref(saved), 8)
    for _ in range(20):
        poke(slot, ctypes.byref(bogus), 8)
        created = libc.pthread_create(ctypes.byref(thread), None, MALLOC, 456_789)
        joined = libc.pthread_join(thread.value, ctypes.byref(result)) if created == 0 else -1
        poke(slot, ctypes.byref(saved), 8)
        assert (created, joined) == (0, 0)
        kept.append(result.value)
    assert libc.pthread_sigmask(1, faults, None) == 0  # SIG_UNBLOCK
    print("survived", len(kept))
''')

# A code object's line table (3.11 layout: PyCodeObject.co_linetable at
# 136, bytes data at 32) runs into the hole when the walk first meets the
# code and copies the table: the copy faults, the fault guard must abandon
# the walk, and the program must go on.
TABLE_FAULT = UNREADABLE + textwrap.dedent('''
    fake = hole + 4096 - 40  # refcount, type, size, hash, then 8 readable bytes of 4096
    for offset, value in ((0, 1 << 30), (8, id(bytes)), (16, 4096), (24, -1)):
        ctypes.c_ssize_t.from_address(fake + offset).value = value
    namespace = {"libc": libc, "kept": kept}
    exec("def first_call():\\n    kept.append(libc.malloc(345_678))\\n", namespace)
    slot = ctypes.c_void_p.from_address(id(namespace["first_call"].__code__) + 136)
    saved = slot.value
    slot.value = fake
    namespace["first_call"]()
    slot.value = saved
    print("survived", len(kept))
''')

# Daemon threads allocate with the GIL released (ctypes) while the main
# thread finalizes the interpreter.
SHUTDOWN = textwrap.dedent('''
    import ctypes, threading

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    started = threading.Barrier(5)


    def churn():
        started.wait()
        while True:
            libc.free(libc.malloc(4096))
            bytearray(2000)


    for _ in range(4):
        threading.Thread(target=churn, daemon=True).start()
    started.wait()
    junk = [bytearray(1000) for _ in range(2000)]
    print("exiting")
''')


def marker_line(source, marker):
    for number, line in enumerate(source.splitlines(), 1):
        if line.rstrip().endswith("# " + marker):
            return number
    raise AssertionError("no line marked " + marker)


def interpreters():
    """Each distinct CPython 3.9-3.13 found here: Debian's, the one running
    the tests, the python3 first on PATH, and pyenv's."""
    found = []
    candidates = ["/usr/bin/python3", sys.executable]
    try:
        first = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], capture_output=True,
                               text=True, timeout=30, env=mltest.clean_env())
        candidates.append(first.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for minor in range(9, 14):
        candidates += sorted(glob.glob(os.path.join(pyenv, "versions", "3.%d.*" % minor, "bin", "python3.%d" % minor)))
    seen = set()
    for path in candidates:
        if not path or not os.access(path, os.X_OK):
            continue
        real = os.path.realpath(path)
        if real in seen:
            continue
        try:
            version = subprocess.run([real, "-c", "import sys, platform; print(platform.python_implementation(), "
                                      "*sys.version_info[:2])"], capture_output=True, text=True, timeout=30,
                                     env=mltest.clean_env()).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(version) == 3 and version[0] == "CPython" and (3, 9) <= (int(version[1]), int(version[2])) <= (3, 13):
            seen.add(real)
            found.append((real, "%s.%s" % (version[1], version[2])))
    return found


def python_frames(stack):
    return [f for f in stack if f.get("language") == "python"]


def suspect_of(report, bytes_per_step):
    for s in report["leak_suspects"]:
        if abs(s["bytes_per_step"] - bytes_per_step) <= bytes_per_step * 0.01:
            return s
    raise AssertionError("no suspect of %d B/step in %s" % (
        bytes_per_step, [(s["site"], s["bytes_per_step"]) for s in report["leak_suspects"]]))


# Code objects made and dropped in turn (as exec'd and generated code is):
# each new one is likely to take the address of the last, and runs in a
# frame at the same address, allocating at the same instruction offset.
# Each must be named as itself.
MADE_AGAIN = textwrap.dedent('''
    kept = []
    for i in range(40):
        source = "\\n" * i + "def made_%d():\\n    return bytearray(%d)\\n" % (i, 100_000 + i * 1000)
        namespace = {}
        exec(compile(source, "<made %d>" % i, "exec"), namespace)
        kept.append(namespace["made_%d" % i]())
        del namespace
    print("done", len(kept))
''')


# Many distinct stacks from three threads: calls nested to depths from 0 to
# 60 through four functions, each allocating at a line of its own, with
# sizes that tell the allocations apart.
MANY_STACKS = textwrap.dedent('''
    import sys, threading

    kept = []


    def a(n, size):
        return b(n - 1, size) if n > 0 else kept.append(bytearray(size))


    def b(n, size):
        return c(n - 1, size + 1) if n > 0 else kept.append(bytearray(size + 3000))


    def c(n, size):
        return a(n - 1, size + 2) if n % 3 else d(n - 1, size)


    def d(n, size):
        if n <= 0:
            kept.append(bytearray(size + 5000))
            return
        return a(n - 1, size + 3)


    def work(seed):
        for round in range(20):
            for depth in range(60):
                a(depth, 100 + 17 * seed + depth)
            del kept[:]


    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    work(0)
    for t in threads:
        t.join()
    print("done")
''')


class PythonStacks(mltest.TestCase):
    STEPS = 12

    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        cls.interpreters = interpreters()
        cls.leaks = os.path.join(cls.tmp, "leaks.py")
        cls.processes = os.path.join(cls.tmp, "processes.py")
        cls.shutdown = os.path.join(cls.tmp, "shutdown.py")
        cls.device = os.path.join(cls.tmp, "device.py")
        cls.fault = os.path.join(cls.tmp, "fault.py")
        cls.table_fault = os.path.join(cls.tmp, "table_fault.py")
        cls.blocked_fault = os.path.join(cls.tmp, "blocked_fault.py")
        cls.made_again = os.path.join(cls.tmp, "made_again.py")
        cls.many_stacks = os.path.join(cls.tmp, "many_stacks.py")
        for path, text in ((cls.leaks, LEAKS), (cls.processes, PROCESSES), (cls.shutdown, SHUTDOWN),
                           (cls.device, DEVICE), (cls.fault, FAULT), (cls.table_fault, TABLE_FAULT),
                           (cls.blocked_fault, BLOCKED_FAULT), (cls.made_again, MADE_AGAIN),
                           (cls.many_stacks, MANY_STACKS)):
            with open(path, "w") as f:
                f.write(text)

    def test_interpreters_found(self):
        versions = [v for _, v in self.interpreters]
        self.assertIn("3.11", versions, "Debian's /usr/bin/python3 (3.11) is required: %s" % self.interpreters)
        print("\ninterpreters:", ", ".join("%s (%s)" % i for i in self.interpreters), file=sys.stderr)

    def check_leaks(self, python, version, mode, attribute=True):
        run_dir = os.path.join(self.tmpdir(), "leaks")
        options = ("--host", mode) + (("--sample-interval", "65536") if mode == "sampled" else ())
        env = None if attribute else dict(mltest.clean_env(), MEMLEDGER_PYTHON_ATTRIBUTE="0")
        proc = self.traced(run_dir, [python, self.leaks, str(self.STEPS)], options=options, env=env)
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout, "done %d %d\n" % (self.STEPS, 2 * self.STEPS))
        self.assertEqual(mltest.memledger_lines(proc.stderr), [])
        r = self.load_report(run_dir)
        self.assertEqual(r["problems"], [])
        self.assertFalse([n for n in r["notes"] if "Python" in n], r["notes"])

        # Python code with the GIL: the leaking line first, its callers after,
        # then the interpreter's native frames.
        gil = suspect_of(r, 100_000)
        self.assertEqual(gil["site"], "grow at leaks.py:%d" % marker_line(LEAKS, "LEAK_GIL"))
        top = gil["stack"][0]
        self.assertEqual((top["language"], top["function"], top["file"], top["line"]),
                         ("python", "grow", self.leaks, marker_line(LEAKS, "LEAK_GIL")))
        self.assertTrue(top["module"], top)
        py = python_frames(gil["stack"])
        run_name = "run" if version in ("3.9", "3.10") else "Trainer.run"
        self.assertEqual([(f["function"], f["line"]) for f in py[:2]],
                         [("grow", marker_line(LEAKS, "LEAK_GIL")), (run_name, marker_line(LEAKS, "CALL_GROW"))])
        self.assertEqual(py[-1]["function"], "<module>")
        self.assertEqual(gil["stack"][:len(py)], py, "Python frames come first")
        native = gil["stack"][len(py):]
        self.assertTrue(native, "native frames below the interpreter are kept")
        self.assertIn("_PyEval_EvalFrameDefault", [f["function"] for f in native])

        # Through ctypes, which releases the GIL around the call.
        nogil = suspect_of(r, 300_000)
        self.assertEqual(nogil["site"], "grow_without_gil at leaks.py:%d" % marker_line(LEAKS, "LEAK_NOGIL"))
        self.assertEqual(python_frames(nogil["stack"])[0]["file"], self.leaks)

        # A thread that never ran Python: its native stack, after the main
        # thread's Python frames at that moment (inside grow_in_native_thread,
        # between starting the thread and joining it), marked as attributed.
        thread = suspect_of(r, 500_000)
        py = python_frames(thread["stack"])
        self.assertEqual(thread["allocations_per_step"], 1)
        if not attribute:
            self.assertEqual(py, [])
            self.assertTrue(thread["stack"])
            return run_dir
        self.assertTrue(py, thread["stack"])
        self.assertTrue(all(f["attributed"] for f in py), py)
        self.assertEqual(thread["stack"][:len(py)], py, "Python frames come first")
        self.assertTrue(thread["stack"][len(py):], "the thread's own native frames are kept")
        self.assertEqual(py[0]["function"], "grow_in_native_thread")
        self.assertIn(py[0]["line"], range(marker_line(LEAKS, "NATIVE_START"), marker_line(LEAKS, "NATIVE_JOIN") + 1))
        self.assertEqual((py[1]["function"], py[1]["line"]), (run_name, marker_line(LEAKS, "CALL_NATIVE")))
        self.assertTrue(thread["site"].startswith("grow_in_native_thread at leaks.py:"), thread["site"])
        self.assertTrue(thread["site"].endswith("(attributed from the main thread)"), thread["site"])
        # The thread's own allocations are not: the GIL-holding leak's frames.
        self.assertFalse(any(f["attributed"] for f in python_frames(gil["stack"])))
        return run_dir

    def test_leaks_full(self):
        for python, version in self.interpreters:
            with self.subTest(python=python, version=version):
                self.check_leaks(python, version, "full")

    def test_leaks_sampled(self):
        for python, version in self.interpreters:
            with self.subTest(python=python, version=version):
                self.check_leaks(python, version, "sampled")

    def test_attribution_off(self):
        # MEMLEDGER_PYTHON_ATTRIBUTE=0: a thread that never ran Python keeps
        # its native stack only.
        python, version = self.interpreters[0]
        self.check_leaks(python, version, "full", attribute=False)

    def test_stacks_interned_by_the_writer(self):
        # In full mode the threads leave stacks with Python frames to the
        # writer thread to intern (MEMLEDGER_WRITER_STACKS=0: they intern
        # them themselves). Each allocation must get the same stack either
        # way: the same (bytes, stack) pairs, up to the few allocations
        # that the interpreter makes differently from run to run.
        setarch = ["setarch", "-R"] if shutil.which("setarch") else []
        seen = {}
        for value in ("0", "1"):
            run_dir = os.path.join(self.tmpdir(), "run")
            env = dict(mltest.clean_env(), MEMLEDGER_WRITER_STACKS=value, PYTHONHASHSEED="0")
            proc = self.run_cmd(setarch + [mltest.MEMLEDGER, "run", "-q", "--no-report", "--no-retention", "--host",
                                           "full", "-o", run_dir, "--", "/usr/bin/python3", self.many_stacks], env=env)
            self.assertExit(proc, 0)
            self.assertEqual(proc.stdout, "done\n")
            trace = glob.glob(os.path.join(run_dir, "trace.*.mlt"))
            self.assertEqual(len(trace), 1)
            seen[value] = mltest.allocation_stacks(trace[0])
        mine, writers = seen["0"], seen["1"]
        total = sum(writers.values())
        # 3 threads x 20 rounds x 60 depths of the program's own, and the interpreter's.
        self.assertGreater(total, 3600)
        planted = [(size, stack) for size, stack in writers if stack and stack[0].startswith("py:")]
        self.assertGreater(len(planted), 1000, "distinct stacks with Python frames")
        self.assertFalse([k for k in writers if k[1][:1] == ("unknown",)], "every stack is in the trace")
        differ = sum((mine - writers).values()) + sum((writers - mine).values())
        self.assertLess(differ, total // 100, "allocations whose stack differs: %d of %d" % (differ, total))

    def test_text_report_and_dump(self):
        run_dir = self.check_leaks("/usr/bin/python3", "3.11", "full")
        line = marker_line(LEAKS, "LEAK_GIL")
        text = self.memledger("report", run_dir)
        self.assertExit(text, 0)
        self.assertIn("grow at leaks.py:%d" % line, text.stdout)
        self.assertRegex(text.stdout, r"\bgrow  %s:%d\b" % (re.escape(self.leaks), line))
        trace = glob.glob(os.path.join(run_dir, "trace.*.mlt"))
        self.assertEqual(len(trace), 1)
        dump = self.memledger("dump", trace[0])
        self.assertExit(dump, 0)
        self.assertRegex(dump.stdout, r"python status=active version=3\.11\.\d+ module=/")
        self.assertRegex(dump.stdout, r"python_code id=\d+ file=%s function=grow first_line=%d " %
                         (re.escape(self.leaks), line - 1))
        self.assertRegex(dump.stdout, r"stack id=\d+ depth=\d+ py:\d+\+\d+ py:")

    def test_code_objects_made_again(self):
        # The thread's cache of code objects (and the shared table) compare
        # what a code object names, not only its address.
        for python, version in self.interpreters:
            with self.subTest(python=python, version=version):
                run_dir = os.path.join(self.tmpdir(), "made-" + version)
                proc = self.traced(run_dir, [python, self.made_again], options=("--host", "full", "--no-report"))
                self.assertExit(proc, 0)
                self.assertEqual(proc.stdout, "done 40\n")
                trace = glob.glob(os.path.join(run_dir, "trace.*.mlt"))
                self.assertEqual(len(trace), 1)
                dump = self.memledger("dump", trace[0])
                self.assertExit(dump, 0)
                codes = {int(m.group(1)): (m.group(2), m.group(3), int(m.group(4))) for m in re.finditer(
                    r"^python_code id=(\d+) file=(.*?) function=(\S+) first_line=(\d+) ", dump.stdout, re.M)}
                stacks = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
                    r"^stack id=(\d+) depth=\d+ py:(\d+)\+", dump.stdout, re.M)}
                allocs = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
                    r"^alloc .* kind=host .* bytes=(\d+) stack=(\d+) ", dump.stdout, re.M)}
                for i in range(40):
                    size = 100_000 + i * 1000 + 1  # a bytearray keeps a trailing NUL
                    self.assertIn(size, allocs, "bytearray(%d) not recorded" % (size - 1))
                    stack = allocs[size]
                    self.assertIn(stack, stacks, "stack %d has no Python frame" % stack)
                    self.assertEqual(codes[stacks[stack]], ("<made %d>" % i, "made_%d" % i, i + 1))

    def test_fork_and_multiprocessing(self):
        for python, version in self.interpreters:
            if version != "3.11":
                continue
            with self.subTest(python=python):
                run_dir = os.path.join(self.tmpdir(), "processes")
                proc = self.traced(run_dir, [python, self.processes])
                self.assertExit(proc, 0)
                lines = proc.stdout.splitlines()
                self.assertEqual([l for l in lines if not l.startswith("FORK_PID=")],
                                 ["child 0", "fork 328350", "spawn 328350"])
                r = self.load_report(run_dir)
                self.assertEqual(r["problems"], [])
                by_pid = {p["pid"]: p for p in r["processes"]}
                child = by_pid[int(mltest.parse_kv(proc.stdout)["FORK_PID"])]
                self.assertTrue(child["leak_suspects"], child["notes"])
                self.assertEqual(child["leak_suspects"][0]["site"],
                                 "child_grow at processes.py:%d" % marker_line(PROCESSES, "LEAK_CHILD"))
                self.assertGreaterEqual(len(r["processes"]), 6)  # parent, child, 2 + 2 pool workers (+ helpers)
                for p in r["processes"]:
                    self.assertEqual(p["stats"]["frames_damaged"], 0, p["command"])
                    # Every process's Python frames read, and no exception at
                    # the end (other notes, such as what the retention walk
                    # held, may name Python too).
                    self.assertFalse([n for n in p["notes"] if "Python frames" in n or "Python ended" in n],
                                     p["notes"])

    def test_device_allocations(self):
        sim = mltest.BUILD_DIR / "tests" / "sim_cuda"
        runtime = sim / "runtime" / "libcudart.so.13"
        if not runtime.exists():
            self.skipTest("the simulated CUDA is not built (no CUDA 13 headers)")
        env = mltest.clean_env(LD_LIBRARY_PATH=str(sim / "driver"), SIMCUDA_DEVICES="2", SIMCUDA_MEMORY_MB="512")
        for mode in ("full", "sampled"):
            with self.subTest(mode=mode):
                run_dir = os.path.join(self.tmpdir(), "device")
                proc = self.traced(run_dir, ["/usr/bin/python3", self.device, str(runtime)], options=("--host", mode),
                                   env=env)
                self.assertExit(proc, 0)
                self.assertEqual(proc.stdout, "device 12\n")
                r = self.load_report(run_dir)
                device = [s for s in r["leak_suspects"] if s["kind"] == "device"]
                self.assertEqual(len(device), 1, r["leak_suspects"])
                self.assertEqual(device[0]["bytes_per_step"], 3 << 20)
                self.assertEqual(device[0]["site"], "grow_device at device.py:%d" % marker_line(DEVICE, "LEAK_DEVICE"))
                self.assertEqual([f["function"] for f in python_frames(device[0]["stack"])], ["grow_device", "<module>"])
                self.assertGreater(len(device[0]["stack"]), 2)

    def check_fault_survived(self, script, expected_output, sizes, options=()):
        """Runs `script` (one of the fault scripts) under Debian's Python
        3.11, whose layout the scripts poke: it ends as untraced, and each
        of `sizes` is one exit-leak site whose walk was abandoned (native
        frames only). Returns the report."""
        run_dir = os.path.join(self.tmpdir(), "fault")
        proc = self.traced(run_dir, ["/usr/bin/python3", script], options=options)
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout, expected_output)
        r = self.load_report(run_dir)
        sites = {s["bytes"]: s for s in r["exit_leaks"]["sites"]}
        for size in sizes:
            self.assertIn(size, sites, [(s["site"], s["bytes"]) for s in r["exit_leaks"]["sites"]])
            self.assertEqual(python_frames(sites[size]["stack"]), [], "the walk was abandoned")
            self.assertTrue(sites[size]["stack"])
        return r

    def test_unreadable_frame_memory(self):
        r = self.check_fault_survived(self.fault, "survived 100\n", [100 * 345_678])
        # Everything else still has its Python frames (the imports'
        # allocations are start-up, also without steps).
        others = r["exit_leaks"]["sites"] + r["startup_allocations"]["sites"]
        self.assertTrue(any(python_frames(s["stack"]) for s in others))

    def test_unreadable_frame_memory_with_fault_signals_blocked(self):
        for mode in ("full", "sampled"):
            with self.subTest(mode=mode):
                options = ("--host", mode) + (("--sample-interval", "4096") if mode == "sampled" else ())
                self.check_fault_survived(self.blocked_fault, "survived 70\n", [50 * 345_678, 20 * 456_789], options)

    def test_unreadable_line_table(self):
        self.check_fault_survived(self.table_fault, "survived 1\n", [345_678])

    def test_shutdown_with_busy_daemon_threads(self):
        python = "/usr/bin/python3"
        for mode in ("full", "sampled"):
            for attempt in range(3):
                with self.subTest(mode=mode, attempt=attempt):
                    run_dir = os.path.join(self.tmpdir(), "shutdown")
                    proc = self.traced(run_dir, [python, self.shutdown], options=("--host", mode))
                    self.assertExit(proc, 0)
                    self.assertEqual(proc.stdout, "exiting\n")
                    r = self.load_report(run_dir)
                    self.assertEqual(r["verdict"]["kind"], "exit")
                    self.assertEqual(r["verdict"]["exit_code"], 0)

    def test_unknown_interpreter_falls_back_to_native_stacks(self):
        pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        old = sorted(glob.glob(os.path.join(pyenv, "versions", "3.[5-8].*", "bin", "python3.[5-8]")))
        if not old:
            self.skipTest("no CPython older than 3.9 installed (pyenv)")
        run_dir = os.path.join(self.tmpdir(), "old")
        proc = self.traced(run_dir, [old[-1], self.leaks, str(self.STEPS)])
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout, "done %d %d\n" % (self.STEPS, 2 * self.STEPS))
        r = self.load_report(run_dir)
        notes = [n for n in r["notes"] if "Python frames are not recorded" in n]
        self.assertEqual(len(notes), 1, r["notes"])
        self.assertRegex(notes[0], r"CPython 3\.[5-8]\.\d+ is not supported \(3\.9 to 3\.13 are\); "
                                   r"stacks are native only")
        gil = suspect_of(r, 100_000)
        self.assertEqual(python_frames(gil["stack"]), [])
        self.assertTrue(gil["stack"])
        text = self.memledger("report", run_dir)
        self.assertEqual(text.stdout.count("Python frames are not recorded"), 1, text.stdout)


if __name__ == "__main__":
    mltest.main()
