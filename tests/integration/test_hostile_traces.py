"""Hostile trace files (tests/fuzz/hostile/hostile-*.mlt, made by
tests/fuzz/make_corpus.py): each claims far more than it holds. `memledger
report` must finish under a memory limit with a partial report that names
what was skipped. Also: files named like traces that are not regular files
(a FIFO must not hang the reader), and terminal escapes in traced strings."""

import glob
import json
import os
import resource
import shutil
import subprocess
import tempfile

import mltest

CORPUS = os.path.join(mltest.SOURCE_DIR, "tests", "fuzz", "hostile")
# Address space allowed to `memledger report` on a trace of a few tens of KB
# (thread stacks, libraries and the mapped trace take about 150 MiB of it).
LIMIT = 768 << 20


def hostile(name):
    return os.path.join(CORPUS, "hostile-%s.mlt" % name)


class HostileTraces(mltest.TestCase):
    def report(self, path, fmt="json"):
        """`memledger report` under RLIMIT_AS, as a CompletedProcess."""
        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([mltest.MEMLEDGER, "report", "--format", fmt, path], stdout=out, stderr=err,
                                    env=mltest.clean_env(), preexec_fn=limit)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.fail("memledger report %s did not finish in 60 s" % path)
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode(errors="replace")
            stderr = err.read().decode(errors="replace")
        result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        self.assertNoCrash(result)
        self.assertNotIn("out of memory", stderr)
        return result

    def peak_rss_mib(self, path):
        """Peak RSS of `memledger report --format json PATH`, in MiB (no limit)."""
        pid = os.fork()
        if pid == 0:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.execve(mltest.MEMLEDGER, [mltest.MEMLEDGER, "report", "--format", "json", path], mltest.clean_env())
        _, _, usage = os.wait4(pid, 0)
        return usage.ru_maxrss / 1024

    def test_corpus_is_reported_under_a_memory_limit(self):
        files = sorted(glob.glob(os.path.join(CORPUS, "hostile-*.mlt")))
        self.assertGreaterEqual(len(files), 5, CORPUS)
        for path in files:
            for fmt in ("json", "text", "html"):
                with self.subTest(trace=os.path.basename(path), format=fmt):
                    proc = self.report(path, fmt)
                    self.assertIn(proc.returncode, (0, 1), self.describe(proc))

    def test_long_python_module_string(self):
        proc = self.report(hostile("python_module_60k"))
        self.assertExit(proc, 0)
        r = json.loads(proc.stdout)
        self.assertTrue(any("strings longer than 4096 bytes were cut" in n for n in r["notes"]), r["notes"])
        self.assertTrue(any("sites are shown with only some of their frames" in n and "the report is partial" in n
                            for n in r["notes"]), r["notes"])
        self.assertLess(self.peak_rss_mib(hostile("python_module_60k")), 250)

    def test_decompression_bombs(self):
        for name in ("allocation_bomb", "step_bomb"):
            with self.subTest(trace=name):
                proc = self.report(hostile(name))
                self.assertExit(proc, 0)
                r = json.loads(proc.stdout)
                skipped = [n for n in r["notes"] if "would decompress to more than" in n]
                self.assertTrue(skipped, r["notes"])
                self.assertIn("the report is partial", skipped[0])
                self.assertRegex(skipped[0], r"\d+ frames \(\d+ bytes; the first, frame \d+\) skipped")
                self.assertLess(self.peak_rss_mib(hostile(name)), 400)

    def test_claims_beyond_the_file(self):
        proc = self.report(hostile("deep_stack_claims"))
        self.assertExit(proc, 0)
        r = json.loads(proc.stdout)
        self.assertEqual(r["stats"]["frames_damaged"], 2, r["notes"])
        self.assertEqual(r["verdict"]["kind"], "exit")


class NotRegularFiles(mltest.TestCase):
    def run_dir(self):
        d = self.tmpdir()
        shutil.copy(hostile("terminal_escapes"), os.path.join(d, "trace.4242.mlt"))
        return d

    def test_fifo_named_like_a_trace(self):
        d = self.run_dir()
        os.mkfifo(os.path.join(d, "trace.99.mlt"))
        proc = self.memledger("report", "--format", "json", d, timeout=20)
        self.assertExit(proc, 0)
        self.assertIn("trace.99.mlt: not a regular file (a FIFO); skipped", proc.stderr)
        self.assertEqual(len(json.loads(proc.stdout)["processes"]), 1)
        # Alone, it is no trace at all: a clear error.
        os.remove(os.path.join(d, "trace.4242.mlt"))
        proc = self.memledger("report", d, timeout=20)
        self.assertExit(proc, 1)
        self.assertIn("not a regular file (a FIFO)", proc.stderr)
        proc = self.memledger("report", os.path.join(d, "trace.99.mlt"), timeout=20)
        self.assertExit(proc, 1)
        self.assertIn("not a regular file (a FIFO)", proc.stderr)

    def test_fifo_named_run_json(self):
        d = self.run_dir()
        os.mkfifo(os.path.join(d, "run.json"))
        proc = self.memledger("report", "--format", "json", d, timeout=20)
        self.assertExit(proc, 0)
        self.assertIn("run.json: not a regular file", proc.stderr)


class TerminalEscapes(mltest.TestCase):
    def test_text_report_escapes_control_characters(self):
        proc = self.memledger("report", hostile("terminal_escapes"))
        self.assertExit(proc, 0)
        for control in ("\x1b", "\x07"):
            self.assertNotIn(control, proc.stdout)
            self.assertNotIn(control, proc.stderr)
        self.assertIn("run\\x1b]2;owned\\x07 x", proc.stdout)
        self.assertIn("f\\x1b]2;owned\\x07", proc.stdout)
        self.assertIn("evil\\x1b[2J.py", proc.stdout)
        # JSON keeps the strings as they were (escaped by JSON itself).
        r = json.loads(self.memledger("report", "--format", "json", hostile("terminal_escapes")).stdout)
        self.assertEqual(r["command"], "run\x1b]2;owned\x07 x")

    def test_run_summary_escapes_control_characters(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        title = "\x1b]2;owned\x07"
        proc = self.memledger("run", "-o", run_dir, "--", mltest.program("exit_code"), "0", title)
        self.assertExit(proc, 0)
        for line in mltest.memledger_lines(proc.stderr):
            self.assertNotIn("\x1b", line)
        with open(os.path.join(run_dir, "report.txt")) as f:
            text = f.read()
        self.assertNotIn("\x1b", text)
        self.assertIn("\\x1b]2;owned\\x07", text)


if __name__ == "__main__":
    mltest.main()
