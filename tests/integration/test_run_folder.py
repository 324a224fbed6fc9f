"""The run folder and the files memledger writes: a folder that already
existed keeps its mode (memledger sets only the mode of a folder it makes),
every file memledger writes is 0600 (the live status file made afresh, never
through a symlink or hard link planted under its name), a full disk is reported and never
announced as a written report, and a run that traced nothing says why."""

import os
import shutil
import stat
import subprocess
import sys

import mltest


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


class RunFolder(mltest.TestCase):
    def run_in(self, run_dir, *args, **kwargs):
        return self.memledger("run", "-o", run_dir, "--", mltest.program("exit_code"), *args, **kwargs)

    def assert_private_files(self, run_dir):
        files = sorted(os.listdir(run_dir))
        for name in ("run.json", "report.txt", "report.json", "report.html"):
            self.assertIn(name, files)
        for name in files:
            if name.startswith(("trace.", "status.", "report.", "run.json")):
                self.assertEqual(mode(os.path.join(run_dir, name)), 0o600, name)

    def test_shared_folder_keeps_its_mode(self):
        shared = os.path.join(self.tmpdir(), "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        other = os.path.join(shared, "someone-elses")
        with open(other, "w") as f:
            f.write("theirs\n")
        os.chmod(other, 0o644)
        proc = self.run_in(shared, "0", "x")
        self.assertExit(proc, 0)
        self.assertEqual(mode(shared), 0o1777)
        self.assertEqual(mode(other), 0o644)
        self.assert_private_files(shared)

    def test_current_folder_keeps_its_mode(self):
        cwd = self.tmpdir()
        os.chmod(cwd, 0o755)
        proc = self.memledger("run", "-q", "-o", ".", "--", mltest.program("exit_code"), "0", cwd=cwd)
        self.assertExit(proc, 0)
        self.assertEqual(mode(cwd), 0o755)
        self.assert_private_files(cwd)

    def test_symlinked_folder_is_not_changed(self):
        tmp = self.tmpdir()
        target = os.path.join(tmp, "target")
        os.mkdir(target)
        os.chmod(target, 0o755)
        link = os.path.join(tmp, "link")
        os.symlink(target, link)
        self.assertExit(self.run_in(link, "0"), 0)
        self.assertEqual(mode(target), 0o755)
        self.assertTrue(os.path.islink(link))
        self.assert_private_files(target)

    def test_new_folder_is_private_whatever_the_umask(self):
        run_dir = os.path.join(self.tmpdir(), "a", "run")
        proc = subprocess.run([mltest.MEMLEDGER, "run", "-q", "-o", run_dir, "--", mltest.program("exit_code"), "0"],
                              env=mltest.clean_env(), capture_output=True, text=True, umask=0o077,
                              timeout=mltest.TIMEOUT)
        self.assertExit(proc, 0)
        self.assertEqual(mode(run_dir), 0o700)
        self.assert_private_files(run_dir)

    def test_raw_preload_leaves_an_existing_folder_alone(self):
        shared = os.path.join(self.tmpdir(), "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        env = mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR=shared)
        self.assertExit(self.run_cmd([mltest.program("exit_code"), "0"], env=env), 0)
        self.assertEqual(mode(shared), 0o1777)
        traces = [f for f in os.listdir(shared) if f.startswith("trace.")]
        self.assertEqual(len(traces), 1)
        self.assertEqual(mode(os.path.join(shared, traces[0])), 0o600)

    def test_planted_status_file_is_not_followed(self):
        # The traced process's pid is known before it runs: the link is
        # planted by the child itself, between fork and exec.
        for kind in ("symlink", "hardlink"):
            d = self.tmpdir()
            run_dir = os.path.join(d, "run")
            os.mkdir(run_dir)
            victim = os.path.join(d, "victim")
            with open(victim, "w") as f:
                f.write("precious\n")
            os.chmod(victim, 0o644)

            def plant():
                (os.symlink if kind == "symlink" else os.link)(victim, os.path.join(run_dir, "status.%d" % os.getpid()))

            env = mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR=run_dir)
            # Longer than the first status update (250 ms after start).
            proc = subprocess.run([sys.executable, "-c", "import time; time.sleep(1)"], env=env, preexec_fn=plant,
                                  capture_output=True, text=True, timeout=mltest.TIMEOUT)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(victim) as f:
                self.assertEqual(f.read(), "precious\n", kind)
            self.assertEqual(mode(victim), 0o644, kind)
            names = [n for n in os.listdir(run_dir) if n.startswith("status.")]
            self.assertEqual(len(names), 1, names)
            path = os.path.join(run_dir, names[0])
            self.assertTrue(stat.S_ISREG(os.lstat(path).st_mode), kind)
            self.assertEqual(os.lstat(path).st_nlink, 1, kind)
            self.assertEqual(mode(path), 0o600, kind)
            with open(path) as f:
                self.assertTrue(f.read().startswith("step="), kind)

    def test_command_not_found_keeps_an_existing_empty_folder(self):
        empty = os.path.join(self.tmpdir(), "empty")
        os.mkdir(empty)
        proc = self.memledger("run", "-o", empty, "--", "/nonexistent/program")
        self.assertExit(proc, 127)
        self.assertTrue(os.path.isdir(empty))
        made = os.path.join(self.tmpdir(), "made")
        self.assertExit(self.memledger("run", "-o", made, "--", "/nonexistent/program"), 127)
        self.assertFalse(os.path.exists(made))


class FullDisk(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        cls.run_dir = os.path.join(cls.tmp, "run")
        proc = cls.traced(cls.run_dir, [mltest.program("tiny_steps"), 3, 1])
        assert proc.returncode == 0, cls.describe(proc)

    def test_report_to_a_full_stdout(self):
        for fmt in ("text", "json", "html"):
            with self.subTest(format=fmt), open("/dev/full", "w") as full:
                proc = subprocess.run([mltest.MEMLEDGER, "report", "--format", fmt, self.run_dir], stdout=full,
                                      stderr=subprocess.PIPE, text=True, env=mltest.clean_env(), timeout=mltest.TIMEOUT)
                self.assertEqual(proc.returncode, 1, proc.stderr)
                self.assertIn("cannot write", proc.stderr)
                self.assertIn("No space left on device", proc.stderr)

    def test_dump_to_a_full_stdout(self):
        trace = [f for f in os.listdir(self.run_dir) if f.startswith("trace.")][0]
        with open("/dev/full", "w") as full:
            proc = subprocess.run([mltest.MEMLEDGER, "dump", os.path.join(self.run_dir, trace)], stdout=full,
                                  stderr=subprocess.PIPE, text=True, env=mltest.clean_env(), timeout=mltest.TIMEOUT)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("cannot write to standard output", proc.stderr)

    def test_report_to_a_full_file(self):
        proc = self.memledger("report", "-o", "/dev/full", self.run_dir)
        self.assertExit(proc, 1)
        self.assertIn("cannot write /dev/full: No space left on device", proc.stderr)

    def in_small_tmpfs(self, script, size="256k"):
        """Runs a shell script with $D on a tmpfs of SIZE of its own (a private
        mount namespace); skips where mounts cannot be made."""
        mnt = self.tmpdir()
        for prefix in (["unshare", "--mount"], ["unshare", "--user", "--map-root-user", "--mount"]):
            probe = subprocess.run(prefix + ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", mnt],
                                   capture_output=True)
            if probe.returncode == 0:
                break
        else:
            self.skipTest("no mount namespace here for a small tmpfs")
        env = mltest.clean_env(D=mnt, MEMLEDGER=mltest.MEMLEDGER, PROG=mltest.program("tiny_steps"))
        return self.run_cmd(prefix + ["sh", "-c", "mount -t tmpfs -o size=%s tmpfs \"$D\" && %s" % (size, script)],
                            env=env)

    def test_full_disk_is_said_and_not_announced(self):
        # The program fills the disk and exits 17: the reports do not fit
        # (run.json does: its space is held from the start). memledger says
        # so, claims no report, keeps no partial file and exits with the
        # program's status; once there is room, the report is made from the
        # traces.
        proc = self.in_small_tmpfs(
            '"$MEMLEDGER" run --host off -o "$D/run" -- sh -c \'"$PROG" 2 1; '
            'cat /dev/zero > "$D/fill" 2>/dev/null; exit 17\'; echo "RUN_EXIT=$?"; ls -a "$D/run"; '
            'rm "$D/fill"; "$MEMLEDGER" report "$D/run" > /dev/null; echo "REPORT_EXIT=$?"')
        out = mltest.parse_kv(proc.stdout)
        self.assertEqual(out.get("RUN_EXIT"), "17", self.describe(proc))
        lines = mltest.memledger_lines(proc.stderr)
        self.assertTrue(any(l.startswith("memledger: no report written: cannot write ") and "report.txt" in l and
                            "No space left" in l for l in lines), proc.stderr)
        self.assertFalse(any(l.startswith("memledger: report:") for l in lines), proc.stderr)
        listing = proc.stdout.split()
        for name in ("report.txt", "report.json", "report.html", "report.txt.tmp", "run.json.tmp"):
            self.assertNotIn(name, listing)
        self.assertEqual(out.get("REPORT_EXIT"), "0", self.describe(proc))

    def test_partly_full_disk_keeps_no_partial_report(self):
        # Room for the text report but not the HTML page: no report file is
        # kept (a partial set would pass for the report), and the exit status
        # says the run folder is incomplete (the program exited 0).
        proc = self.in_small_tmpfs(
            '"$MEMLEDGER" run --host off -o "$D/run" -- sh -c \'"$PROG" 2 1; '
            'head -c $(( $(stat -f -c "%a*%S" "$D") - 40960 )) /dev/zero > "$D/fill"\'; echo "RUN_EXIT=$?"; '
            'ls -a "$D/run"')
        out = mltest.parse_kv(proc.stdout)
        listing = proc.stdout.split()
        lines = mltest.memledger_lines(proc.stderr)
        self.assertIn("run.json", listing, self.describe(proc))
        for name in ("report.txt", "report.json", "report.html", "report.html.tmp"):
            self.assertNotIn(name, listing)
        self.assertTrue(any(l.startswith("memledger: no report written: cannot write ") for l in lines), proc.stderr)
        self.assertFalse(any(l.startswith("memledger: report:") for l in lines), proc.stderr)
        self.assertEqual(out.get("RUN_EXIT"), "1", self.describe(proc))


class NothingTraced(mltest.TestCase):
    def test_static_program(self):
        prog = mltest.program("static_exit")
        if not os.path.exists(prog):
            self.skipTest("no static C library to link a static program with")
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.memledger("run", "-o", run_dir, "--", prog, "4")
        self.assertExit(proc, 4)
        self.assertIn("is statically linked", proc.stderr)
        self.assertIn(prog, proc.stderr)
        later = self.memledger("report", run_dir)
        self.assertExit(later, 1)
        self.assertIn("statically linked", later.stderr)

    def test_setuid_program(self):
        if os.getuid() != 0:
            self.skipTest("needs root to give a program to another user")
        tmp = self.tmpdir()
        os.chmod(tmp, 0o755)
        prog = os.path.join(tmp, "exit_code")
        shutil.copy(mltest.program("exit_code"), prog)
        os.chown(prog, 65534, 65534)
        os.chmod(prog, 0o4755)
        run_dir = os.path.join(tmp, "run")
        proc = self.memledger("run", "-o", run_dir, "--", prog, "3")
        self.assertExit(proc, 3)
        self.assertIn("secure-execution mode", proc.stderr)
        self.assertIn("set-user-ID", proc.stderr)


if __name__ == "__main__":
    mltest.main()
