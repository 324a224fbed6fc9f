"""A program that closes every inherited descriptor (daemons, data loaders,
subprocess(close_fds=True) children) and then takes low and high descriptor
numbers for files of its own (tests/programs/fd_closer): the trace goes on
(the tracer opens its file again by path), nothing of the trace lands in the
program's files, and no step is lost. When the file cannot be opened again,
the report says from when the trace is missing."""

import os
import resource

import mltest

STEPS = 8


def soft_nofile(limit):
    def set_limit():
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    return set_limit


class ClosedDescriptors(mltest.TestCase):
    def run_closer(self, *extra, limit=None):
        tmp = self.tmpdir()
        run_dir = os.path.join(tmp, "run")
        files_dir = os.path.join(tmp, "files")
        os.mkdir(files_dir)
        args = [mltest.MEMLEDGER, "run", "-q", "-o", run_dir, "--host", "full", "--",
                mltest.program("fd_closer"), files_dir, str(STEPS), *extra]
        env = mltest.clean_env()
        if limit is None:
            proc = self.run_cmd(args, env=env)
        else:
            # run_cmd has no preexec hook for limits: go through a shell.
            proc = self.run_cmd(["sh", "-c", 'ulimit -n %d && exec "$@"' % limit, "sh", *args], env=env)
        return proc, run_dir, files_dir

    def check_files(self, files_dir):
        first = STEPS // 2 + 1
        for i in range(8):
            with open(os.path.join(files_dir, "file%d.txt" % i), "rb") as f:
                content = f.read()
            expected = b"".join(b"step %d file %d\n" % (s, i) for s in range(first, STEPS + 1))
            self.assertEqual(content, expected, "file%d.txt holds bytes the program did not write" % i)

    def check_full_trace(self, proc, run_dir, files_dir):
        self.assertExit(proc, 0)
        self.assertIn("DONE", proc.stdout)
        self.assertEqual(mltest.memledger_lines(proc.stderr), [])
        self.check_files(files_dir)
        r = self.load_report(run_dir)
        self.assertEqual((r["verdict"]["kind"], r["verdict"]["exit_code"]), ("exit", 0), r["verdict"]["summary"])
        live = [s["live"]["host"] for s in r["steps"]]
        self.assertEqual(len(live), STEPS)
        self.assertEqual({b - a for a, b in zip(live, live[1:])}, {4096})
        self.assertFalse([n for n in r["notes"] if "tracer" in n or "trace ends" in n], r["notes"])
        self.assertEqual(r["stats"]["frames_damaged"], 0)

    def test_trace_survives_closing_and_reuse(self):
        self.check_full_trace(*self.run_closer())

    def test_trace_survives_with_a_low_descriptor_limit(self):
        # A soft limit of 1024 leaves no room above the closed range: the
        # program's own copies then take the number the tracer had.
        self.check_full_trace(*self.run_closer(limit=1024))

    def test_lost_trace_says_from_when(self):
        proc, run_dir, files_dir = self.run_closer("--move-trace")
        self.assertExit(proc, 0)
        self.check_files(files_dir)
        lines = mltest.memledger_lines(proc.stderr)
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertIn("cannot be opened again", lines[0])
        self.assertIn("tracing stopped for pid", lines[0])
        r = self.load_report(run_dir)
        # The exit status still comes from waitpid; the report says the trace stops early.
        self.assertEqual((r["verdict"]["kind"], r["verdict"]["exit_code"]), ("exit", 0), r["verdict"]["summary"])
        self.assertLessEqual(len(r["steps"]), STEPS // 2 + 1)
        self.assertGreaterEqual(len(r["steps"]), STEPS // 2)
        notes = [n for n in r["notes"] if "trace ends at" in n]
        self.assertEqual(len(notes), 1, r["notes"])


if __name__ == "__main__":
    mltest.main()
