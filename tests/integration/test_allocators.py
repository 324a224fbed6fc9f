"""Replacement allocators: a program on jemalloc, tcmalloc or mimalloc
(Debian's libjemalloc2, libtcmalloc-minimal4, libmimalloc2.0) keeps its
allocator under memledger, exits as it does untraced, and has its leak
through operator new found at its line, whether the allocator is linked in,
preloaded in front of `memledger run` or preloaded behind libmemledger.so
(tests/programs/alloc_steps). One that comes before memledger in the lookup
order cannot be traced: the report says so instead of showing totals."""

import os

import mltest

LIB = "/usr/lib/x86_64-linux-gnu/"
ALLOCATORS = {
    "jemalloc": LIB + "libjemalloc.so.2",
    "tcmalloc": LIB + "libtcmalloc_minimal.so.4",
    "mimalloc": LIB + "libmimalloc.so.2",
}
STEPS = 12
# Larger than the mean sample interval: sampled mode records each leaked
# object at its true size, so both modes can be held to the same figure.
LEAK = 160 * 1024
EXIT = 5  # alloc_steps' own exit status


class AllocatorCase(mltest.TestCase):
    allocator = None

    @classmethod
    def setUpClass(cls):
        cls.library = ALLOCATORS[cls.allocator]
        cls.linked = mltest.program("alloc_steps_" + cls.allocator)
        cls.plain = mltest.program("alloc_steps")
        cls.tmp = cls.class_tmpdir()

    def setUp(self):
        if not os.path.exists(self.library) or not os.path.exists(self.linked):
            self.skipTest("%s not installed (scripts/install-deps.sh installs it)" % self.library)

    def untraced(self, linked):
        env = mltest.clean_env() if linked else mltest.clean_env(LD_PRELOAD=self.library)
        return self.run_cmd([self.linked if linked else self.plain, STEPS, LEAK], env=env)

    def run_traced(self, how, host):
        """Runs alloc_steps traced; `how`: linked, front (LD_PRELOAD in front
        of memledger run), behind (raw LD_PRELOAD, memledger first). Returns
        (process, report)."""
        run_dir = os.path.join(self.tmp, "%s-%s" % (how, host))
        if how == "behind":
            env = mltest.clean_env(LD_PRELOAD="%s:%s" % (mltest.LIBRARY, self.library), MEMLEDGER_DIR=run_dir,
                                   MEMLEDGER_HOST=host)
            proc = self.run_cmd([self.plain, STEPS, LEAK], env=env)
            out = os.path.join(run_dir, "report.json")
            self.assertExit(self.memledger("report", run_dir, "--format", "json", "-o", out), 0)
        else:
            env = mltest.clean_env(LD_PRELOAD=self.library) if how == "front" else None
            program = self.linked if how == "linked" else self.plain
            proc = self.traced(run_dir, [program, STEPS, LEAK], options=("--host", host), env=env)
        return proc, self.load_report(run_dir)

    def check(self, how, host):
        direct = self.untraced(linked=how == "linked")
        self.assertExit(direct, EXIT)
        self.assertIn("SERVED_BY=%s" % self.allocator, direct.stdout)
        proc, report = self.run_traced(how, host)
        self.assertExit(proc, EXIT)
        # The same output but for TRACED: still served by its allocator.
        self.assertEqual(proc.stdout.replace("TRACED=1", "TRACED=0"), direct.stdout)
        out = mltest.parse_kv(proc.stdout)
        self.assertEqual(report["verdict"]["exit_code"], EXIT)
        self.assertEqual(report["stats"]["unknown_frees"], 0)
        # The six failing calls at the end, errno and results as untraced.
        self.assertEqual(report["stats"]["failed_allocations"], 6)
        suspects = report["leak_suspects"]
        self.assertTrue(suspects, report["notes"])
        top = suspects[0]
        self.assertEqual(mltest.site_parts(top["site"]), ("plant_leak", "alloc_steps.cpp", int(out["LEAK_LINE"])))
        self.assertEqual(top["kind"], "host")
        self.assertAlmostEqual(top["bytes_per_step_exact"], LEAK, delta=0.05 * LEAK)
        # Host live never goes negative (frees of blocks the hooks never saw).
        self.assertGreater(min(s["live"]["host"] for s in report["steps"]), 0)
        allocator = report["allocator"]
        self.assertEqual(allocator["name"], self.allocator)
        self.assertTrue(allocator["traced"])
        self.assertIn(os.path.basename(self.library), allocator["path"])
        return report

    def test_linked_full(self):
        report = self.check("linked", "full")
        self.assertIn("linked into the program", report["allocator"]["reached"])

    def test_linked_sampled(self):
        self.check("linked", "sampled")

    def test_preloaded_in_front_of_run_full(self):
        report = self.check("front", "full")
        self.assertIn("preloaded after memledger", report["allocator"]["reached"])
        # Held bytes come from the allocator's own statistics.
        self.assertTrue(report["allocator"]["held_source"])
        held = [s["held"]["host"] for s in report["steps"]]
        self.assertTrue(all(h > 0 for h in held), held)

    def test_preloaded_in_front_of_run_sampled(self):
        self.check("front", "sampled")

    def test_preloaded_behind_full(self):
        self.check("behind", "full")

    def test_preloaded_behind_sampled(self):
        self.check("behind", "sampled")

    def test_ahead_of_memledger_is_said_untraced(self):
        run_dir = os.path.join(self.tmp, "ahead")
        env = mltest.clean_env(LD_PRELOAD="%s:%s" % (self.library, mltest.LIBRARY), MEMLEDGER_DIR=run_dir,
                               MEMLEDGER_HOST="full")
        proc = self.run_cmd([self.plain, STEPS, LEAK], env=env)
        self.assertExit(proc, EXIT)
        self.assertIn("SERVED_BY=%s" % self.allocator, proc.stdout)
        text = self.memledger("report", run_dir)
        self.assertExit(text, 0)
        self.assertIn("host figures are incomplete, the host heap is not traced: the program's malloc is %s"
                      % self.allocator, text.stdout)
        self.assertIn("host allocator: %s" % self.allocator, text.stdout)
        self.assertRegex(text.stdout, r"\n +1 +untraced ")
        html = self.memledger("report", run_dir, "--format", "html")
        self.assertExit(html, 0)
        self.assertIn("host allocator: the host heap is not traced", html.stdout)
        self.assertIn("host figures are incomplete", html.stdout)
        # check does not judge host figures it never saw.
        gate = self.memledger("check", run_dir, "--max-growth-per-step", "1MiB")
        self.assertNotEqual(gate.returncode, 0)
        self.assertIn("the host heap was not traced", gate.stdout + gate.stderr)
        self.assertIn("peak live (host heap not traced)", text.stdout)
        out = os.path.join(run_dir, "report.json")
        self.assertExit(self.memledger("report", run_dir, "--format", "json", "-o", out), 0)
        report = self.load_report(run_dir)
        self.assertEqual(report["allocator"]["name"], self.allocator)
        self.assertFalse(report["allocator"]["traced"])
        self.assertEqual(report["leak_suspects"], [])


class FailingOperatorNew(mltest.TestCase):
    """A failed operator new reaches the program as it does untraced: NULL
    from the nothrow form, std::bad_alloc caught by the program's handler.
    The exception unwinds through memledger's hook frames, so the preload
    library must use the process's own unwinder (shared libgcc_s)."""

    def check(self, allocator):
        env = mltest.clean_env(LD_PRELOAD=allocator) if allocator else None
        expected = ("nothrow: null\nthrowing: bad_alloc caught\n"
                    "handler: called 3 times, then bad_alloc\n")
        untraced = self.run_cmd([mltest.program("new_fails")], env=env)
        self.assertExit(untraced, 3)
        self.assertEqual(untraced.stdout, expected)
        for host in ("full", "sampled"):
            run_dir = os.path.join(self.class_tmpdir(), "%s-%s" % (os.path.basename(allocator or "glibc"), host))
            proc = self.traced(run_dir, [mltest.program("new_fails")], options=("--host", host), env=env)
            self.assertExit(proc, 3)
            self.assertEqual(proc.stdout, expected)

    def test_glibc(self):
        self.check(None)

    def test_jemalloc(self):
        if not os.path.exists(ALLOCATORS["jemalloc"]):
            self.skipTest("jemalloc not installed")
        self.check(ALLOCATORS["jemalloc"])

    def test_tcmalloc(self):
        if not os.path.exists(ALLOCATORS["tcmalloc"]):
            self.skipTest("tcmalloc not installed")
        self.check(ALLOCATORS["tcmalloc"])


class OwnOperatorNew(mltest.TestCase):
    """A program that defines operator new and delete itself (tests/programs/
    own_new.cpp): its definitions come first in the lookup order, so memledger's
    C++ hooks must not stand in for them (they would call malloc and free
    themselves when operator new is libstdc++'s). Every new and delete still
    reaches the program's own, and the blocks they take from malloc are
    traced: the leak is found at its line."""

    STEPS = 10

    def test_own_definitions_keep_every_call(self):
        program = [mltest.program("own_new"), self.STEPS, LEAK]
        direct = self.run_cmd(program)
        self.assertExit(direct, 4)
        counts = mltest.parse_kv(direct.stdout)
        self.assertGreater(int(counts["NEWS"]), 4000)
        for host in ("full", "sampled"):
            run_dir = os.path.join(self.tmpdir(), host)
            proc = self.traced(run_dir, program, options=("--host", host))
            self.assertExit(proc, 4)
            self.assertEqual(proc.stdout, direct.stdout)
            report = self.load_report(run_dir)
            self.assertEqual(report["stats"]["unknown_frees"], 0)
            top = report["leak_suspects"][0]
            self.assertEqual(top["kind"], "host")
            frames = [(mltest.function_base(f.get("function") or ""), os.path.basename(f.get("file") or ""),
                       f.get("line")) for f in top["stack"]]
            self.assertIn(("plant_leak", "own_new.cpp", int(counts["LEAK_LINE"])), frames, top["site"])
            self.assertAlmostEqual(top["bytes_per_step_exact"], LEAK, delta=0.05 * LEAK)


class DlopenedAfterStart(mltest.TestCase):
    """An allocator dlopen'ed after memledger started (tests/programs/
    dlopen_allocator.c): a plugin loaded next calls its API by name, bound
    to memledger's hooks, which must forward to that allocator; blocks cross
    between the hooks and the allocator's own entry points."""

    STEPS = 8
    # jemalloc's static TLS is larger than what glibc keeps for dlopen.
    TUNABLES = "glibc.rtld.optional_static_tls=65536"

    def check(self, allocator, host):
        library = ALLOCATORS[allocator]
        if not os.path.exists(library):
            self.skipTest("%s not installed" % library)
        program = [mltest.program("dlopen_allocator"), library, mltest.preload("heap_plugin_" + allocator), self.STEPS, LEAK]
        env = mltest.clean_env(GLIBC_TUNABLES=self.TUNABLES)
        direct = self.run_cmd(program, env=env)
        self.assertExit(direct, 5)
        self.assertIn("SERVED_BY=%s" % allocator, direct.stdout)
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, program, options=("--host", host), env=env)
        # Same exit and output: served by the allocator, no block freed by
        # another heap (that aborts the program).
        self.assertExit(proc, 5)
        self.assertEqual(proc.stdout, direct.stdout)
        self.assertIn("CROSS=ok", proc.stdout)
        report = self.load_report(run_dir)
        if host == "full":
            # One: the block the allocator made through its own handle, which
            # no hook saw, freed through a hook.
            self.assertEqual(report["stats"]["unknown_frees"], 1)
        suspects = report["leak_suspects"]
        self.assertTrue(suspects, report["notes"])
        top = suspects[0]
        out = mltest.parse_kv(proc.stdout)
        self.assertEqual(mltest.site_parts(top["site"]), ("plant_leak", "heap_plugin.c", int(out["LEAK_LINE"])))
        if host == "full":
            self.assertAlmostEqual(top["bytes_per_step_exact"], LEAK, delta=0.05 * LEAK)

    def test_jemalloc_full(self):
        self.check("jemalloc", "full")

    def test_jemalloc_sampled(self):
        self.check("jemalloc", "sampled")

    def test_tcmalloc_full(self):
        self.check("tcmalloc", "full")


class Jemalloc(AllocatorCase):
    allocator = "jemalloc"


class Tcmalloc(AllocatorCase):
    allocator = "tcmalloc"


class Mimalloc(AllocatorCase):
    allocator = "mimalloc"


del AllocatorCase


class Glibc(mltest.TestCase):
    """Without a replacement allocator: glibc named, failed calls recorded."""

    def test_glibc_named_and_failed_allocations_recorded(self):
        program = [mltest.program("alloc_steps"), STEPS, LEAK]
        direct = self.run_cmd(program)
        self.assertExit(direct, EXIT)
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, program)
        self.assertExit(proc, EXIT)
        # errno and each failing call's result as untraced.
        self.assertEqual(proc.stdout.replace("TRACED=1", "TRACED=0"), direct.stdout)
        report = self.load_report(run_dir)
        self.assertEqual(report["stats"]["failed_allocations"], 6)
        self.assertEqual(report["allocator"]["name"], "glibc")
        self.assertEqual(report["allocator"]["held_source"], "mallinfo2")
        self.assertIn("host allocator: glibc, the C library's own; held bytes from mallinfo2",
                      self.memledger("report", run_dir).stdout)
        html = self.memledger("report", run_dir, "--format", "html").stdout
        self.assertIn("host allocator, the C library&#39;s own; held from mallinfo2", html)

if __name__ == "__main__":
    mltest.main()
