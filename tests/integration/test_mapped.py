"""Memory mapped outside the heap (the kind `mapped`): anonymous mmap,
munmap and mremap made by the program, recorded with stacks in full and
sampled host mode (tests/programs/map_steps). The growth of a mapping
leaked per step is found at its line; live mapped bytes stay exact through
partial unmaps, mremap growth, shrinkage and moves and MAP_FIXED mappings
over others; file mappings, PROT_NONE reservations and memory from a raw
system call are not counted. A replacement allocator's own arenas, mapped
under malloc, are the heap's and never appear as mapped."""

import os

import mltest

STEPS = 12
LEAK = 64 * 1024
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def mapped_sites(report):
    sites = report["exit_leaks"]["sites"] + report["startup_allocations"]["sites"]
    return [s for s in sites if s["kind"] == "mapped"]


class MappedSteps(mltest.TestCase):
    def check(self, host):
        program = [mltest.program("map_steps"), STEPS]
        direct = self.run_cmd(program)
        self.assertExit(direct, 0)
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, program, options=("--host", host))
        self.assertExit(proc, 0)
        self.assertEqual(proc.stdout, direct.stdout)
        out = mltest.parse_kv(proc.stdout)
        report = self.load_report(run_dir)
        self.assertEqual(report["stats"]["unknown_frees"], 0)
        self.assertEqual(report["stats"]["double_allocations"], 0)
        # Each step end: exactly the mappings leaked so far.
        steps = report["steps"]
        self.assertEqual(len(steps), STEPS)
        self.assertEqual([s["live"].get("mapped", 0) for s in steps], [LEAK * (k + 1) for k in range(STEPS)])
        suspects = [s for s in report["leak_suspects"] if s["kind"] == "mapped"]
        self.assertEqual(len(suspects), 1, report["leak_suspects"])
        self.assertEqual(mltest.site_parts(suspects[0]["site"]), ("leak_mapping", "map_steps.c", int(out["LEAK_LINE"])))
        self.assertAlmostEqual(suspects[0]["bytes_per_step_exact"], LEAK, delta=0.05 * LEAK)
        # Live at exit, to the byte: the leaked mappings and the two ends
        # of the last one (allocated after the last step).
        self.assertEqual(sum(s["bytes"] for s in mapped_sites(report)), int(out["EXPECT_LIVE"]))
        sites = {mltest.site_parts(s["site"])[0] for s in mapped_sites(report)}
        self.assertEqual(sites, {"leak_mapping", "map_or_die"})
        text = self.memledger("report", run_dir)
        self.assertExit(text, 0)
        self.assertRegex(text.stdout, r"step +host live +host held +mapped +RSS")
        self.assertRegex(text.stdout, r"64\.0 KiB/step .*mapped\n +leak_mapping at map_steps\.c")
        gate = self.memledger("check", run_dir, "--max-growth-per-step", "mapped=16KiB")
        self.assertEqual(gate.returncode, 1, mltest.TestCase.describe(gate))
        self.assertIn("growth per step (mapped)", gate.stdout)
        # The host heap does not grow: the mappings are not host bytes.
        self.assertExit(self.memledger("check", run_dir, "--max-growth-per-step", "host=16KiB"), 0)
        html = self.memledger("report", run_dir, "--format", "html")
        self.assertExit(html, 0)
        self.assertIn("mapped live", html.stdout)
        return report

    def test_full(self):
        self.check("full")

    def test_sampled(self):
        self.check("sampled")

    def test_host_off_records_none(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [mltest.program("map_steps"), STEPS], options=("--host", "off"))
        self.assertExit(proc, 0)
        report = self.load_report(run_dir)
        self.assertTrue(all("mapped" not in s["live"] for s in report["steps"]))
        self.assertEqual(mapped_sites(report), [])


class JemallocArenas(mltest.TestCase):
    """jemalloc maps its arenas itself, under the malloc memledger forwards
    to: those are heap bytes (held), not mapped ones."""

    def test_arenas_are_not_mapped(self):
        if not os.path.exists(JEMALLOC):
            self.skipTest("%s not installed (scripts/install-deps.sh installs it)" % JEMALLOC)
        for host in ("full", "sampled"):
            run_dir = os.path.join(self.tmpdir(), host)
            env = mltest.clean_env(LD_PRELOAD=JEMALLOC)
            proc = self.traced(run_dir, [mltest.program("alloc_steps"), STEPS, 160 * 1024], options=("--host", host),
                               env=env)
            self.assertExit(proc, 5)
            self.assertIn("SERVED_BY=jemalloc", proc.stdout)
            report = self.load_report(run_dir)
            self.assertEqual(report["allocator"]["name"], "jemalloc")
            self.assertTrue(all("mapped" not in s["live"] for s in report["steps"]), report["steps"])
            self.assertEqual(mapped_sites(report), [])
            self.assertEqual([s["kind"] for s in report["leak_suspects"]][:1], ["host"])


if __name__ == "__main__":
    mltest.main()
