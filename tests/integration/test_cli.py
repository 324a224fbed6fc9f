"""The memledger command line: usage errors (exit 2), a missing command
(exit 127), exit status propagation, the run folder and its files."""

import json
import os
import stat
import sys

import mltest


class UsageErrors(mltest.TestCase):
    def assertUsage(self, proc, *phrases):
        """A usage error is one line that starts with memledger: and names
        the help to read, never the whole help."""
        self.assertExit(proc, 2)
        self.assertRegex(proc.stderr, r"^memledger: [^\n]*\(memledger( \w+)? --help\)\n$")
        for phrase in phrases:
            self.assertIn(phrase, proc.stderr)
        self.assertEqual(proc.stdout, "")

    def test_run_usage_errors(self):
        prog = mltest.program("exit_code")
        cases = {
            "unknown option": (["run", "--bogus", "--", prog, "0"], ["unknown option", "--bogus"]),
            "no command": (["run"], ["no command"]),
            "no command after --": (["run", "-o", "x", "--"], ["no command"]),
            "bad --host": (["run", "--host", "bogus", "--", prog, "0"], ["--host", "'bogus'"]),
            "zero --sample-interval": (["run", "--sample-interval", "0", "--", prog, "0"], ["--sample-interval"]),
            "bad --stack-depth": (["run", "--stack-depth", "999", "--", prog, "0"], ["--stack-depth"]),
            "bad --step-interval": (["run", "--step-interval", "-1", "--", prog, "0"], ["--step-interval"]),
            "missing value": (["run", "-o"], ["-o"]),
        }
        for name, (args, phrases) in cases.items():
            with self.subTest(case=name):
                cwd = self.tmpdir()
                self.assertUsage(self.memledger(*args, cwd=cwd), *phrases)
                self.assertEqual(os.listdir(cwd), [], "a usage error must not create a run folder")

    def test_other_usage_errors(self):
        cases = {
            "nothing": ([], ["no command"]),
            "unknown command": (["frobnicate"], ["frobnicate"]),
            "report without a path": (["report"], ["report"]),
            "report with two paths": (["report", "a", "b"], ["report"]),
            "report --format xml": (["report", "--format", "xml", "x"], ["--format"]),
            "report unknown option": (["report", "--bogus", "x"], ["--bogus"]),
            "dump without a file": (["dump"], ["dump"]),
            "check unknown option": (["check", "--bogus", "x"], ["--bogus"]),
            "diff unknown option": (["diff", "--bogus", "a", "b"], ["--bogus"]),
            "window unknown option": (["window", "--bogus", "x"], ["--bogus"]),
        }
        for name, (args, phrases) in cases.items():
            with self.subTest(case=name):
                self.assertUsage(self.memledger(*args), *phrases)

    def test_misspellings_get_a_suggestion(self):
        cases = {
            "run option": (["run", "--outptu", "x", "--", "true"], "unknown option --outptu; did you mean --output?"),
            "run option=value": (["run", "--sample-intreval=4", "--", "true"],
                                 "did you mean --sample-interval?"),
            "report option": (["report", "--formt", "json", "x"], "did you mean --format?"),
            "check option": (["check", "--max-peek", "1MiB", "x"], "did you mean --max-peak?"),
            "diff option": (["diff", "--max-stes", "3", "a", "b"], "did you mean --max-sites?"),
            "window option": (["window", "--frm-seq", "1", "x"], "did you mean --from-seq?"),
            "command": (["reprot", "x"], "unknown command 'reprot'; did you mean report?"),
        }
        for name, (args, expected) in cases.items():
            with self.subTest(case=name):
                cwd = self.tmpdir()
                self.assertUsage(self.memledger(*args, cwd=cwd), expected)
                self.assertEqual(os.listdir(cwd), [])
        # Nothing close: no guess.
        proc = self.memledger("run", "--zzzzzzzz", "--", "true")
        self.assertUsage(proc, "unknown option --zzzzzzzz")
        self.assertNotIn("did you mean", proc.stderr)

    def test_command_help_is_that_command_only(self):
        cases = {
            "run": "--sample-interval",
            "report": "--full-stacks",
            "check": "--max-peak",
            "diff": "--max-sites",
            "window": "--from-seq",
            "dump": "dump TRACE",
        }
        for command, expected in cases.items():
            with self.subTest(command=command):
                proc = self.memledger(command, "--help")
                self.assertExit(proc, 0)
                self.assertIn(expected, proc.stdout)
                self.assertNotIn("commands:", proc.stdout)
                self.assertLess(len(proc.stdout.splitlines()), 45, "more than one command's help")
        self.assertNotIn("--max-peak", self.memledger("run", "--help").stdout)
        self.assertNotIn("--sample-interval", self.memledger("report", "--help").stdout)

    def test_help_and_version(self):
        proc = self.memledger("--help")
        self.assertExit(proc, 0)
        self.assertIn("usage: memledger", proc.stdout)
        proc = self.memledger("--version")
        self.assertExit(proc, 0)
        self.assertRegex(proc.stdout, r"^memledger \S+ \(trace format \d+\)\n$")


class RunCommand(mltest.TestCase):
    def test_command_not_found(self):
        for command in ("/nonexistent/program", "memledger-test-no-such-command"):
            with self.subTest(command=command):
                run_dir = os.path.join(self.tmpdir(), "run")
                proc = self.memledger("run", "-o", run_dir, "--", command, "arg")
                self.assertExit(proc, 127)
                self.assertIn("memledger: %s: command not found" % command, proc.stderr)
                self.assertFalse(os.path.exists(run_dir), "an empty run folder is left behind")

    def test_command_not_executable(self):
        script = os.path.join(self.tmpdir(), "not-executable")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(script, 0o644)
        proc = self.memledger("run", "-o", os.path.join(self.tmpdir(), "run"), "--", script)
        self.assertExit(proc, 126)
        self.assertIn("memledger: %s:" % script, proc.stderr)

    def test_exit_status_propagates(self):
        for code in (0, 3, 77, 255):
            with self.subTest(code=code):
                run_dir = os.path.join(self.tmpdir(), "run")
                proc = self.traced(run_dir, [mltest.program("exit_code"), code, "word"])
                self.assertExit(proc, code)
                self.assertEqual(proc.stdout, "exit_code: word\n")
                with open(os.path.join(run_dir, "run.json")) as f:
                    self.assertEqual(json.load(f)["exit"], {"code": code})
                r = self.load_report(run_dir)
                self.assertEqual(r["verdict"]["kind"], "exit")
                self.assertEqual(r["verdict"]["exit_code"], code)

    def test_run_folder_contents_and_permissions(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        prog = mltest.program("exit_code")
        proc = self.memledger("run", "-o", run_dir, "--", prog, "0", "x")
        self.assertExit(proc, 0)
        with open(os.path.join(run_dir, "run.json")) as f:
            run = json.load(f)
        pid = run["root_pid"]
        self.assertEqual(run["command"], [prog, "0", "x"])
        self.assertEqual(run["host_mode"], "sampled")
        trace = os.path.join(run_dir, "trace.%d.mlt" % pid)
        self.assertTrue(os.path.exists(trace), os.listdir(run_dir))
        for name in ("report.txt", "report.json"):
            self.assertTrue(os.path.exists(os.path.join(run_dir, name)), name)
        # DESIGN.md: trace files are created 0600 in a folder the user owns.
        self.assertEqual(stat.S_IMODE(os.stat(trace).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(run_dir).st_mode), 0o700)
        self.assertEqual(os.stat(trace).st_uid, os.getuid())
        # Without -q: where the run went and a one-line summary.
        lines = mltest.memledger_lines(proc.stderr)
        self.assertTrue(any(run_dir in l for l in lines), proc.stderr)
        self.assertTrue(any("clean exit (code 0)" in l for l in lines), proc.stderr)

    def test_run_folder_holding_a_run(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        prog = mltest.program("exit_code")
        self.assertExit(self.traced(run_dir, [prog, "0"]), 0)
        first = sorted(f for f in os.listdir(run_dir) if f.startswith("trace."))
        self.assertEqual(len(first), 1)
        keep = os.path.join(run_dir, "notes.txt")
        with open(keep, "w") as f:
            f.write("mine")
        # A second run into the same folder would be reported as one job with the first.
        proc = self.traced(run_dir, [prog, "0"])
        self.assertExit(proc, 2)
        self.assertIn("already holds a run", proc.stderr)
        self.assertIn("--overwrite", proc.stderr)
        self.assertEqual(sorted(f for f in os.listdir(run_dir) if f.startswith("trace.")), first)
        # --overwrite replaces the run's own files and nothing else.
        proc = self.traced(run_dir, [prog, "0"], options=("--host", "full", "--overwrite"))
        self.assertExit(proc, 0)
        traces = sorted(f for f in os.listdir(run_dir) if f.startswith("trace."))
        self.assertEqual(len(traces), 1)
        self.assertNotEqual(traces, first)
        self.assertEqual(len(self.load_report(run_dir)["processes"]), 1)
        with open(keep) as f:
            self.assertEqual(f.read(), "mine")

    def test_quiet_and_no_report(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.memledger("run", "-q", "--no-report", "-o", run_dir, "--", mltest.program("exit_code"), "5")
        self.assertExit(proc, 5)
        self.assertEqual(mltest.memledger_lines(proc.stderr), [])
        files = sorted(os.listdir(run_dir))
        self.assertNotIn("report.json", files)
        self.assertNotIn("report.txt", files)
        self.assertIn("run.json", files)
        self.assertEqual(len([f for f in files if f.startswith("trace.")]), 1, files)
        # The report can be made afterwards, with the exit status from run.json.
        proc = self.memledger("report", "--format", "json", run_dir)
        self.assertExit(proc, 0)
        self.assertEqual(json.loads(proc.stdout)["verdict"]["exit_code"], 5)

    def test_default_run_folder_name(self):
        cwd = self.tmpdir()
        proc = self.memledger("run", "-q", "--", mltest.program("exit_code"), "0", cwd=cwd)
        self.assertExit(proc, 0)
        folders = os.listdir(cwd)
        self.assertEqual(len(folders), 1, folders)
        self.assertRegex(folders[0], r"^memledger-exit_code-\d{8}-\d{6}$")

    def test_step_interval(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, ["sleep", "0.6"], options=("--step-interval", "0.05"))
        self.assertExit(proc, 0)
        r = self.load_report(run_dir)
        self.assertEqual(r["step_source"], "interval")
        self.assertEqual({s["source"] for s in r["steps"]}, {"interval"})
        self.assertGreaterEqual(len(r["steps"]), 5)
        self.assertLessEqual(len(r["steps"]), 15)

    def test_step_interval_ends_before_python_teardown(self):
        # A list a module keeps growing is freed by the interpreter's
        # teardown, after the program's work; the writer goes on ending
        # steps there. Those are not steps: with them the last step fell to
        # nothing and the growth was judged to have stopped.
        script = os.path.join(self.tmpdir(), "grower.py")
        with open(script, "w") as f:
            # The teardown clears the module's names in order: `kept` first,
            # then `slow`, whose __del__ keeps the teardown going for steps.
            f.write("import time\nkept = []\nfor i in range(40):\n"
                    "    kept.append(bytearray(65536))  # GROWS\n    time.sleep(0.02)\n"
                    "class Slow:\n    def __del__(self):\n        time.sleep(0.3)\nslow = Slow()\n")
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [sys.executable, script], options=("--host", "full", "--step-interval", "0.05"))
        self.assertExit(proc, 0)
        r = self.load_report(run_dir)
        self.assertEqual(r["step_source"], "interval")
        suspects = [s for s in r["leak_suspects"] if "grower.py:4" in s["site"]]
        self.assertEqual(len(suspects), 1, [s["site"] for s in r["leak_suspects"]])
        # The last step still holds the list: at least 30 of its 40 blocks.
        self.assertGreater(r["steps"][-1]["live"]["host"], 30 * 65536, r["steps"][-1])

    def test_no_steps(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [mltest.program("exit_code"), "0"])
        self.assertExit(proc, 0)
        r = self.load_report(run_dir)
        self.assertEqual(r["step_source"], "none")
        self.assertEqual(r["steps"], [])
        self.assertTrue(any("no steps" in n for n in r["notes"]), r["notes"])


if __name__ == "__main__":
    mltest.main()
