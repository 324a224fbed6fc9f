"""fork() while another thread is inside dl_iterate_phdr, or inside sigaction().

A thread inside dl_iterate_phdr holds glibc's loader lock; a fork() from
another thread copies that lock, locked, into the child, where no thread
will ever release it. A child that never calls dl_iterate_phdr does not
care; under memledger every child does: libunwind looks up unwind info with
it when the child's first allocation captures a stack, and the child's new
writer thread calls it in its first cycle. Both then wait forever.

memledger's own writer thread calls dl_iterate_phdr in every cycle, so this
happens to ordinary programs: test_processes.py hit it about once in twenty
runs on a loaded 2-core machine (forked child stuck in unw_backtrace ->
dl_iterate_phdr, the writer in TraceWriter::cycle -> dl_iterate_phdr).
tests/programs/fork_race.c makes the window certain by holding the lock in a
thread of its own while it forks."""

import os
import unittest

import mltest


class ForkWhileLoaderLockHeld(mltest.TestCase):
    COMMAND = [mltest.program("fork_race"), 5]

    def test_untraced_control(self):
        proc = self.run_cmd(self.COMMAND)
        self.assertExit(proc, 0)
        self.assertEqual(mltest.parse_kv(proc.stdout), {"FORKS": "5", "HUNG": "0"})

    # Known limitation (README, Limits): memledger's fork handler waits for its
    # own unwinds and module scans, but a lock held by a thread of the program
    # itself is copied locked into the child, whose first stack then hangs
    # whenever libunwind has not cached the unwind info it needs. Whether it
    # has depends on what the parent unwound before, so the outcome varies
    # from run to run: skipped with the reason rather than left to chance.
    @unittest.skip("known limitation: a fork while a thread of the program holds glibc's loader lock "
                   "can leave a traced child hung on its first stack (README, Limits)")
    def test_forked_children_do_not_hang(self):
        run_dir = os.path.join(self.tmpdir(), "race")
        proc = self.traced(run_dir, self.COMMAND, options=("--no-report",))
        self.assertEqual(mltest.parse_kv(proc.stdout).get("HUNG"), "0", self.describe(proc))
        self.assertExit(proc, 0)


class ForkWhileSigactionRuns(mltest.TestCase):
    """fork() while another thread is inside sigaction() for a signal memledger
    watches: memledger keeps the program's actions under a lock, which it
    takes before the fork and releases in both processes after it, so the
    child's own sigaction() finds it free. `tests/programs/fork_race.c
    sigaction` has a thread set SIGTERM's action without pause while the
    main thread forks; each child sets it too."""

    COMMAND = [mltest.program("fork_race"), 50, "sigaction"]

    def test_untraced_control(self):
        proc = self.run_cmd(self.COMMAND)
        self.assertExit(proc, 0)
        self.assertEqual(mltest.parse_kv(proc.stdout), {"FORKS": "50", "HUNG": "0"})

    def test_forked_children_do_not_hang(self):
        run_dir = os.path.join(self.tmpdir(), "race")
        proc = self.traced(run_dir, self.COMMAND, options=("--no-report",))
        self.assertEqual(mltest.parse_kv(proc.stdout).get("HUNG"), "0", self.describe(proc))
        self.assertExit(proc, 0)




SIM_DRIVER_DIR = mltest.BUILD_DIR / "tests" / "sim_cuda" / "driver"
SIM_FORK_RACE = mltest.BUILD_DIR / "tests" / "sim_cuda" / "programs" / "cuda_fork_race"


@unittest.skipUnless(SIM_FORK_RACE.exists(), "the simulated CUDA is not built (no CUDA 13 headers)")
class ForkWhilePoolAllocates(mltest.TestCase):
    """fork() while another thread allocates from a CUDA memory pool: the
    CUDA hooks look the pool up in a table under a lock, which memledger
    takes before the fork and releases in both processes after it (with its
    other locks of the CUDA, CUPTI and start-up paths: ForkHeldLocks), so
    the child's own allocation finds it free. `tests/sim_cuda/programs/
    cuda_fork_race.cpp` forks 200 times; each child allocates from the pool
    once. Without the lock held across the fork, 3 of 200 children hung."""

    COMMAND = [str(SIM_FORK_RACE), 200]

    def env(self):
        return mltest.clean_env(LD_LIBRARY_PATH=str(SIM_DRIVER_DIR))

    def test_untraced_control(self):
        proc = self.run_cmd(self.COMMAND, env=self.env())
        self.assertExit(proc, 0)
        self.assertEqual(mltest.parse_kv(proc.stdout).get("HUNG"), "0")

    def test_forked_children_do_not_hang(self):
        run_dir = os.path.join(self.tmpdir(), "race")
        proc = self.traced(run_dir, self.COMMAND, options=("--no-report", "--host", "full"), env=self.env())
        self.assertEqual(mltest.parse_kv(proc.stdout).get("HUNG"), "0", self.describe(proc))
        self.assertExit(proc, 0)


if __name__ == "__main__":
    mltest.main()
