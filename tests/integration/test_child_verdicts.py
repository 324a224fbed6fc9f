"""Every process of a job gets its true verdict (tests/programs/child_endings):
children that end with exit(4), _exit(5), a return from main or /bin/false,
a fork child that calls execl at once (its pre-exec image was replaced, not
killed), and one killed by SIGKILL. The statuses the parent's waitpid saw are
the truth; the job table shows them."""

import os
import signal

import mltest


class ChildVerdicts(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.run_dir = os.path.join(cls.class_tmpdir(), "children")
        command = [mltest.program("child_endings"), mltest.program("exit_code")]
        cls.proc = cls.traced(cls.run_dir, command, timeout=30)
        cls.out = mltest.parse_kv(cls.proc.stdout)
        cls.report = cls.load_report(cls.run_dir) if os.path.exists(os.path.join(cls.run_dir, "report.json")) else None

    def setUp(self):
        self.assertExit(self.proc, 17)
        self.assertIsNotNone(self.report, self.describe(self.proc))

    def images(self, name):
        """The report's processes of child NAME, in start order."""
        pid = int(self.out[name + "_PID"])
        found = [p for p in self.report["processes"] if p["pid"] == pid]
        self.assertTrue(found, "no trace of %s (pid %d)" % (name, pid))
        return found

    def assertExited(self, process, code):
        self.assertEqual((process["verdict"]["kind"], process["verdict"]["exit_code"]), ("exit", code),
                         process["verdict"]["summary"])
        self.assertNotIn("not recorded", process["verdict"]["summary"])

    def test_waitpid_saw_what_the_program_meant(self):
        statuses = {k[:-len("_STATUS")]: int(v) for k, v in self.out.items() if k.endswith("_STATUS")}
        self.assertEqual({k: os.waitstatus_to_exitcode(v) for k, v in statuses.items()},
                         {"EXIT_FOUR": 4, "UNDERSCORE_EXIT": 5, "EXECL": 0, "FALSE": 1, "RETURN_THREE": 3, "KILLED": -signal.SIGKILL})

    def test_exit_and_underscore_exit(self):
        (exit4,) = self.images("EXIT_FOUR")
        self.assertExited(exit4, 4)
        (uexit5,) = self.images("UNDERSCORE_EXIT")
        self.assertExited(uexit5, 5)

    def test_exec_right_after_fork_hands_over(self):
        for name, image, code in (("EXECL", "/bin/true", 0), ("FALSE", "false", 1),
                                  ("RETURN_THREE", mltest.program("exit_code"), 3)):
            with self.subTest(child=name):
                before, after = self.images(name)
                self.assertEqual(before["verdict"]["kind"], "exec", before["verdict"]["summary"])
                self.assertIn("exec(%s)" % image, before["verdict"]["summary"])
                self.assertExited(after, code)

    def test_root_exit_recorded_in_its_trace(self):
        root = [p for p in self.report["processes"] if p["pid"] == self.report["root_pid"]]
        self.assertExited(root[0], 17)

    def test_job_table_shows_true_statuses(self):
        text = self.memledger("report", self.run_dir).stdout
        table = {}
        for line in text.splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[0] == "pid" and fields[1].isdigit():
                table.setdefault(int(fields[1]), []).append(line.split("  ")[-1].strip())
        pid = lambda name: int(self.out[name + "_PID"])
        self.assertEqual(table[pid("EXIT_FOUR")], ["exit 4"])
        self.assertEqual(table[pid("UNDERSCORE_EXIT")], ["exit 5"])
        self.assertEqual(table[pid("EXECL")], ["exec", "exit 0"])
        self.assertEqual(table[pid("FALSE")], ["exec", "exit 1"])
        self.assertEqual(table[pid("RETURN_THREE")], ["exec", "exit 3"])
        self.assertEqual(table[pid("KILLED")], ["killed"])
        self.assertEqual(table[self.report["root_pid"]], ["exit 17 (root)"])


if __name__ == "__main__":
    mltest.main()
