"""A Python program with threads, subprocess and os.fork runs unchanged under
memledger (same output, exit 0) and each of its processes gets a trace."""

import glob
import os
import re
import shutil
import sys
import textwrap

import mltest

PROGRAM = textwrap.dedent('''
    import hashlib, os, subprocess, sys, threading

    def work(n):
        blocks = [bytes([n % 256]) * (64 * (i % 50 + 1)) for i in range(3000)]
        table = {i: str(i) * 3 for i in range(5000)}
        return hashlib.sha256(b"".join(blocks) + repr(sorted(table.items())[:10]).encode()).hexdigest()[:16]

    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, work(i))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("threads", [results[i] for i in range(4)], flush=True)

    sub = subprocess.run([sys.executable, "-c", "print(sum(range(100000)))"],
                         capture_output=True, text=True, check=True)
    print("subprocess", sub.stdout.strip(), flush=True)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, work(9).encode())
        os._exit(0)
    os.close(w)
    data = os.read(r, 100).decode()
    _, status = os.waitpid(pid, 0)
    print("fork", data, os.waitstatus_to_exitcode(status), flush=True)
    print("FORK_PID=%d" % pid, file=sys.stderr)
    print("SELF_PID=%d" % os.getpid(), file=sys.stderr)
''')


class PythonProgram(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        cls.script = os.path.join(cls.tmp, "program.py")
        with open(cls.script, "w") as f:
            f.write(PROGRAM)
        cls.direct = cls.run_cmd([sys.executable, cls.script])

    def setUp(self):
        self.assertExit(self.direct, 0)

    def check_mode(self, host):
        run_dir = os.path.join(self.tmpdir(), "py-" + host)
        proc = self.traced(run_dir, [sys.executable, self.script], options=("--host", host))
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout, self.direct.stdout)
        # Only the program's own stderr lines (pids), nothing from Python or memledger.
        self.assertEqual([l.split("=")[0] for l in proc.stderr.splitlines()], ["FORK_PID", "SELF_PID"], proc.stderr)
        pids = mltest.parse_kv(proc.stderr)
        r = self.load_report(run_dir)
        self.assertEqual(r["problems"], [])
        self.assertEqual(r["pid"], int(pids["SELF_PID"]))
        self.assertEqual(r["verdict"]["kind"], "exit")
        self.assertEqual(r["verdict"]["exit_code"], 0)
        by_pid = {p["pid"]: p for p in r["processes"]}
        fork = by_pid.get(int(pids["FORK_PID"]))
        self.assertIsNotNone(fork, "no trace for the forked child")
        self.assertEqual(fork["ppid"], r["pid"])
        subs = [p for p in r["processes"] if "print(sum(range(100000)))" in p["command"]]
        self.assertEqual(len(subs), 1, [p["command"] for p in r["processes"]])
        self.assertEqual(subs[0]["ppid"], r["pid"])
        self.assertEqual(subs[0]["verdict"]["kind"], "exit")
        for p in r["processes"]:
            self.assertEqual(p["stats"]["dropped"], 0, p["command"])
            self.assertEqual(p["stats"]["frames_damaged"], 0, p["command"])
            self.assertEqual(p["host_mode"], host)
            # The helpers started in the interpreters started here; a forked
            # child has its parent's.
            self.assertEqual([n for n in p["notes"] if "Python helpers" in n], [], p["command"])
        if host == "full":
            # Every free matches an allocation of the same process.
            self.assertEqual(r["stats"]["unknown_frees"], 0)
            self.assertEqual(r["stats"]["double_allocations"], 0)

    def test_sampled_mode(self):
        self.check_mode("sampled")

    def test_full_mode(self):
        self.check_mode("full")

    def test_python_without_the_helpers_is_told(self):
        # A script that sets PYTHONPATH anew, python -I, and the helpers
        # turned off: the program runs unchanged; the report says what the
        # first two went without, and nothing of the third.
        script = os.path.join(self.tmpdir(), "small.py")
        with open(script, "w") as f:
            f.write("kept = [bytearray(1000) for _ in range(100)]\nprint('DONE')\n")
        cases = {
            "replaced": (["env", "PYTHONPATH=" + self.tmpdir(), sys.executable, script], "did not hold the folder"),
            "isolated": ([sys.executable, "-I", script], "Python ran with -I, -E or -S"),
            "off": (["env", "MEMLEDGER_PYTHON_HOOKS=0", sys.executable, script], None),
            "with them": ([sys.executable, script], None),
            # Killed at once: it may have ended before any interpreter
            # reached the helpers, and is not judged; after 2 s it is.
            "killed at once": ([sys.executable, "-I", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                               None),
            "killed later": ([sys.executable, "-I", "-c", "import os, signal, time; time.sleep(2.5); "
                              "os.kill(os.getpid(), signal.SIGKILL)"], "Python ran with -I, -E or -S"),
        }
        # memledger and its library alone, without the Python package beside them.
        bare = os.path.join(self.tmpdir(), "bare")
        for part, source in (("bin", mltest.MEMLEDGER), ("lib", mltest.LIBRARY)):
            os.makedirs(os.path.join(bare, part))
            shutil.copy(source, os.path.join(bare, part))
        cases["not installed"] = ([sys.executable, script], "found no memledger Python package beside it")
        for name, (command, said) in cases.items():
            with self.subTest(name):
                run_dir = os.path.join(self.tmpdir(), name.replace(" ", "_"))
                if name == "not installed":
                    proc = self.run_cmd([os.path.join(bare, "bin", "memledger"), "run", "-q", "-o", run_dir, "--"] +
                                        command, env=mltest.clean_env())
                else:
                    proc = self.traced(run_dir, command)
                killed = name.startswith("killed")
                self.assertExit(proc, 128 + 9 if killed else 0)
                self.assertEqual(proc.stdout, "" if killed else "DONE\n")
                r = self.load_report(run_dir)
                python = [p for p in r["processes"] if p["command"].startswith(sys.executable)]
                self.assertEqual(len(python), 1, [p["command"] for p in r["processes"]])
                notes = [n for n in python[0]["notes"] if "Python helpers" in n]
                if said is None:
                    self.assertEqual(notes, [])
                else:
                    self.assertEqual(len(notes), 1, python[0]["notes"])
                    self.assertIn(said, notes[0])
                    self.assertIn("no retention paths", notes[0])

    def test_older_pythons_run_unchanged(self):
        # The start-up hook runs in every traced Python, Python 2 included:
        # the program imports as it would, the sitecustomize it hides still
        # runs, nothing is printed; the helpers stay out of an interpreter
        # before 3.9, and the report says so.
        pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        old = sorted(glob.glob(os.path.join(pyenv, "versions", "2.7.*", "bin", "python2.7")) +
                     glob.glob(os.path.join(pyenv, "versions", "3.[5-8].*", "bin", "python3.[5-8]")))
        if not old:
            self.skipTest("no CPython older than 3.9 installed (pyenv)")
        other = os.path.join(self.tmpdir(), "other")
        os.mkdir(other)
        with open(os.path.join(other, "sitecustomize.py"), "w") as f:
            f.write("import sys\nsys.stdout.write('their sitecustomize\\n')\n")
        command = ["-c", "import json, collections; print(json.dumps({'ok': 1}))"]
        for python in old:
            with self.subTest(python):
                direct = self.run_cmd([python] + command, env=mltest.clean_env(PYTHONPATH=other))
                self.assertExit(direct, 0)
                self.assertEqual(direct.stdout, 'their sitecustomize\n{"ok": 1}\n')
                run_dir = os.path.join(self.tmpdir(), os.path.basename(os.path.dirname(os.path.dirname(python))))
                proc = self.traced(run_dir, [python] + command, env=mltest.clean_env(PYTHONPATH=other))
                self.assertExit(proc, 0)
                self.assertEqual(proc.stdout, direct.stdout)
                self.assertEqual(proc.stderr, direct.stderr)
                r = self.load_report(run_dir)
                notes = [n for n in r["notes"] if "Python helpers" in n]
                self.assertEqual(len(notes), 1, r["notes"])
                self.assertRegex(notes[0], r"start on Python 3\.9 and later, and this process ran Python [23]\.\d+\.\d+")

    def test_fork_warns_as_untraced(self):
        # CPython 3.12 on warns at os.fork() in a process of more than one
        # thread: memledger's own threads must not make a single-threaded
        # program warn, and a program with a thread of its own warns as it
        # would untraced, from its own line.
        pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        pythons = sorted(glob.glob(os.path.join(pyenv, "versions", "3.1[2-9].*", "bin", "python3.1[2-9]")))
        if sys.version_info >= (3, 12):
            pythons.insert(0, sys.executable)
        if not pythons:
            self.skipTest("no CPython 3.12 or later installed (pyenv)")
        script = os.path.join(self.tmpdir(), "forks.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""
                import os, sys, threading, warnings
                if sys.argv[2] == "always":  # a filter of the program's before memledger's
                    warnings.simplefilter("always")
                ev = threading.Event()
                if sys.argv[1] == "thread":
                    threading.Thread(target=ev.wait).start()
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
                ev.set()
                print("forked")
            """))
        cases = [(threads, filters, flags) for threads in ("alone", "thread") for filters in ("as set", "always")
                 for flags in ([], ["-X", "dev"], ["-W", "error"])]
        for python in pythons:
            for threads, filters, flags in cases:
                with self.subTest(python=python, threads=threads, filters=filters, flags=flags):
                    command = [python] + flags + [script, threads, filters]
                    direct = self.run_cmd(command, env=mltest.clean_env())
                    run_dir = os.path.join(self.tmpdir(), "fork-%s-%s-%d" % (threads, filters[:2], len(flags)))
                    proc = self.traced(run_dir, command, options=("--no-report",), env=mltest.clean_env())
                    self.assertExit(proc, 0)
                    self.assertEqual(proc.stdout, direct.stdout)
                    pids = re.compile(r"pid=\d+")
                    self.assertEqual(pids.sub("pid=N", proc.stderr), pids.sub("pid=N", direct.stderr))
                    warned = "is multi-threaded, use of fork()" in direct.stderr
                    self.assertEqual(warned, threads == "thread" and (filters == "always" or flags != ["-W", "error"]),
                                     direct.stderr)

    def test_raw_preload(self):
        run_dir = os.path.join(self.tmpdir(), "raw")
        proc = self.run_cmd([sys.executable, self.script],
                            env=mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR=run_dir))
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout, self.direct.stdout)
        traces = [f for f in os.listdir(run_dir) if f.startswith("trace.")]
        self.assertGreaterEqual(len(traces), 3, traces)


if __name__ == "__main__":
    mltest.main()
