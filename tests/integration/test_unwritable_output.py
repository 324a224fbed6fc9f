"""When traces cannot be written, memledger says so in exactly one line and
the program runs unchanged, untraced: through `memledger run -o` and through
raw LD_PRELOAD with MEMLEDGER_DIR. (The tests run as root, for whom a chmod'ed
folder is still writable: the unwritable places are under /proc, or below a
regular file.)"""

import os
import re

import mltest


class UnwritableOutput(mltest.TestCase):
    def places(self):
        tmp = self.tmpdir()
        a_file = os.path.join(tmp, "a-file")
        with open(a_file, "w") as f:
            f.write("not a folder\n")
        return {
            "under /proc": "/proc/forbidden/x",
            "below a regular file": os.path.join(a_file, "run"),
            "a regular file": a_file,
        }

    def direct(self, *args):
        proc = self.run_cmd([mltest.program("exit_code"), *args])
        self.assertEqual(mltest.memledger_lines(proc.stderr), [])
        return proc

    def test_run_with_an_unwritable_folder(self):
        direct = self.direct("3", "hello", "world")
        self.assertExit(direct, 3)
        for name, place in self.places().items():
            with self.subTest(place=name):
                proc = self.memledger("run", "-o", place, "--", mltest.program("exit_code"), "3", "hello", "world")
                self.assertExit(proc, 3)
                self.assertEqual(proc.stdout, direct.stdout)
                lines = mltest.memledger_lines(proc.stderr)
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertIn("cannot write the run folder %s" % place, lines[0])
                self.assertIn("without tracing", lines[0])
                # The program's own stderr is all there is besides.
                others = [l for l in proc.stderr.splitlines() if not l.startswith("memledger:")]
                self.assertEqual(others, direct.stderr.splitlines())
                if name == "a regular file":
                    with open(place) as f:
                        self.assertEqual(f.read(), "not a folder\n")

    def test_raw_preload_with_an_unwritable_folder(self):
        direct = self.direct("4", "raw")
        self.assertExit(direct, 4)
        for name, place in self.places().items():
            with self.subTest(place=name):
                env = mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR=place)
                proc = self.run_cmd([mltest.program("exit_code"), "4", "raw"], env=env)
                self.assertExit(proc, 4)
                self.assertEqual(proc.stdout, direct.stdout)
                lines = mltest.memledger_lines(proc.stderr)
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertRegex(lines[0], r"^memledger: cannot create .*; tracing is off for pid \d+, "
                                           r"the program goes on$")
                others = [l for l in proc.stderr.splitlines() if not l.startswith("memledger:")]
                self.assertEqual(others, direct.stderr.splitlines())

    def test_raw_preload_unwritable_with_children(self):
        # The first process image says it once for the whole tree; forked
        # children inherit the decision silently, exec'ed and spawned images
        # stay quiet about the same folder; every process still does its work.
        args = [mltest.program("forker"), mltest.program("exit_code"), "0", "child"]
        direct = self.run_cmd(args)
        self.assertExit(direct, 0)
        env = mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR="/proc/forbidden/x")
        proc = self.run_cmd(args, env=env)
        self.assertExit(proc, 0)

        def without_pids(text):
            return [l for l in text.splitlines() if not re.match(r"[A-Z_]*PID=", l)]

        self.assertEqual(without_pids(proc.stdout), without_pids(direct.stdout))
        out = mltest.parse_kv(proc.stdout)
        lines = mltest.memledger_lines(proc.stderr)
        pids = [int(re.search(r"tracing is off for pid (\d+)", l).group(1)) for l in lines]
        # forker, the exec'ed image and the spawned one: three process images,
        # one message (the images started later find it told in their
        # environment).
        self.assertEqual(pids, [int(out["PARENT_PID"])], proc.stderr)


if __name__ == "__main__":
    mltest.main()
