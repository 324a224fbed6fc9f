"""Host memory pressure in the trace and the verdicts made of it, on the host:

    every trace          pressure records (MemAvailable, swap, swap-in, PSI,
                         the memory cgroup's OOM kills) beside the samples,
                         and the report's host memory line
    OOM killer           a program that outgrows a memory cgroup of its own
                         (cgroup v2 or v1 subtree, or systemd-run --scope)
                         is SIGKILLed by the kernel: the verdict says so with
                         its RSS and the limit, and quotes the kernel's line
                         where /dev/kmsg can be read
    swap thrash          a program whose working set is four times its
                         cgroup's limit swaps until it ends: the report names
                         the freeze (needs swap: a swap file is made and
                         removed again where swapon is permitted)

The verdict logic itself is tested on synthetic records in
tests/unit/pressure_test.cpp, where no cgroup is needed.
"""
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from mltest import MEMLEDGER, TestCase, clean_env

# Keeps 8 MiB blocks, written so that every page is resident, until killed.
# 8 MiB every 20 ms: several of the writer's samples (every 100 ms) fall
# while it grows, where at full speed it reached a 200 MiB limit between two.
GROW = textwrap.dedent("""
    import time
    print("READY", flush=True)
    kept = []
    while True:
        kept.append(b"x" * (8 << 20))
        time.sleep(0.02)
""")

# A working set of 256 MiB, touched page by page for 8 s: with a 64 MiB
# limit every pass swaps most of it back in.
THRASH = textwrap.dedent("""
    import time
    blocks = [bytearray(b"y" * (8 << 20)) for _ in range(32)]
    end = time.monotonic() + 8
    passes = 0
    while time.monotonic() < end:
        for b in blocks:
            for i in range(0, len(b), 4096):
                b[i] = (b[i] + 1) & 0xff
        passes += 1
    print("PASSES", passes, flush=True)
""")


def own_cgroup_lines():
    with open("/proc/self/cgroup") as f:
        return [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]


class MemoryCgroup:
    """A memory cgroup made for one test, below this process's own (v2 with
    the memory controller enabled for children, else v1's memory
    hierarchy). `why_not` says why none could be made."""

    def __init__(self, limit_bytes):
        self.path = None
        self.v2 = False
        self.why_not = []
        name = "memledger-test-%d" % os.getpid()
        for _, controllers, rel in own_cgroup_lines():
            if controllers == "":
                base = "/sys/fs/cgroup" + rel.rstrip("/")
                try:
                    with open(os.path.join(base, "cgroup.subtree_control")) as f:
                        enabled = f.read().split()
                except OSError as e:
                    self.why_not.append("cgroup v2 at %s: %s" % (base, e.strerror))
                    continue
                if "memory" not in enabled:
                    self.why_not.append("cgroup v2 at %s: the memory controller is not enabled for children "
                                        "(cgroup.subtree_control: %s)" % (base, " ".join(enabled) or "empty"))
                    continue
                if self._make(base, name, "memory.max", limit_bytes):
                    self.v2 = True
                    return
            elif "memory" in controllers.split(","):
                base = "/sys/fs/cgroup/memory" + rel.rstrip("/")
                if self._make(base, name, "memory.limit_in_bytes", limit_bytes):
                    return

    def _make(self, base, name, limit_file, limit_bytes):
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
        except OSError as e:
            self.why_not.append("mkdir %s: %s" % (path, e.strerror))
            return False
        try:
            with open(os.path.join(path, limit_file), "w") as f:
                f.write(str(limit_bytes))
        except OSError as e:
            self.why_not.append("%s: %s" % (os.path.join(path, limit_file), e.strerror))
            os.rmdir(path)
            return False
        self.path = path
        return True

    def remove(self):
        if self.path is None:
            return
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except OSError as e:
                if e.errno != errno.EBUSY:
                    return
                import time
                time.sleep(0.05)

    def enter_command(self, command):
        """`command`, run by a shell that first moves itself into the cgroup."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *command]


def systemd_scope_why_not():
    try:
        proc = subprocess.run(["systemd-run", "--user", "--scope", "-q", "true"], capture_output=True, text=True,
                              timeout=20)
    except FileNotFoundError:
        return "systemd-run is not installed"
    except subprocess.TimeoutExpired:
        return "systemd-run --user --scope did not answer in 20 s"
    if proc.returncode != 0:
        return "systemd-run --user --scope: " + (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[0]
    return None


def kmsg_readable():
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


def dump(run_dir):
    traces = [f for f in os.listdir(run_dir) if f.startswith("trace.") and f.endswith(".mlt")]
    return {f: subprocess.run([MEMLEDGER, "dump", os.path.join(run_dir, f)], capture_output=True, text=True).stdout
            for f in traces}


class PressureRecords(TestCase):
    def test_every_trace_has_pressure_records(self):
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, [sys.executable, "-c", "import time; time.sleep(0.5)"],
                           options=("--host", "sampled"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        (text,) = dump(run_dir).values()
        version = re.search(r"format version (\d+)", text)
        self.assertIsNotNone(version, text[:200])
        self.assertGreaterEqual(int(version.group(1)), 7)
        lines = re.findall(r"^pressure ts=(\d+) present=0x([0-9a-f]+) mem_total=(\d+) mem_available=(\d+) "
                           r"swap_total=(\d+) swap_free=(\d+) swap_in=(\d+) swap_out=(\d+) "
                           r"psi_some_avg10=\S+ psi_full_avg10=\S+ psi_some_total=(\d+) psi_full_total=(\d+) "
                           r"cgroup_oom_kills=(\d+)$", text, re.M)
        # Every 100 ms over half a second, plus the last one.
        self.assertGreaterEqual(len(lines), 4, text[-2000:])
        samples = re.findall(r"^sample ts=", text, re.M)
        self.assertGreaterEqual(len(samples), len(lines))
        present = int(lines[-1][1], 16)
        self.assertTrue(present & 1, "/proc/meminfo read")
        self.assertTrue(present & 2, "/proc/vmstat read")
        self.assertEqual(bool(present & 4), os.path.exists("/proc/pressure/memory"))
        with open("/proc/meminfo") as f:
            total = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1)) * 1024
        self.assertEqual(int(lines[-1][2]), total)
        self.assertTrue(0 < int(lines[-1][3]) <= total)
        ts = [int(line[0]) for line in lines]
        self.assertEqual(ts, sorted(ts))
        cgroup = re.search(r"^# cgroup=(.*)$", text, re.M)
        if cgroup:
            self.assertTrue(os.path.isdir(cgroup.group(1)), cgroup.group(1))
            self.assertTrue(present & 8, "the cgroup's OOM kill count read")

        report = self.load_report(run_dir)
        memory = report["host_memory"]
        self.assertTrue(memory["sampled"])
        self.assertEqual(memory["mem_total"], total)
        self.assertGreater(memory["min_available"], 0)
        self.assertEqual(memory["freeze"], "")
        self.assertEqual(memory["psi"], os.path.exists("/proc/pressure/memory"))
        with open(os.path.join(run_dir, "report.txt")) as f:
            self.assertIn(memory["line"] + "\n", f.read())
        self.assertTrue(memory["line"].startswith("host memory: MemAvailable lowest "), memory["line"])
        with open(os.path.join(run_dir, "run.json")) as f:
            kernel = json.load(f)["kernel"]
        self.assertEqual(kernel["log_read"], kmsg_readable())
        self.assertEqual(kernel["oom_kills"], [])


class OomKiller(TestCase):
    LIMIT = 200 << 20

    def setUp(self):
        self.cgroup = MemoryCgroup(self.LIMIT)
        self.addCleanup(self.cgroup.remove)
        if self.cgroup.path is None:
            scope = systemd_scope_why_not()
            if scope is None:
                self.scope = True
                return
            self.skipTest("no memory-limited cgroup can be made here: " + "; ".join(self.cgroup.why_not + [scope]))
        self.scope = False
        swap = os.path.join(self.cgroup.path, "memory.memsw.limit_in_bytes")
        if os.path.exists(swap):  # v1 with swap accounting: no way out through swap
            with open(swap, "w") as f:
                f.write(str(self.LIMIT))
        elif self.cgroup.v2 and os.path.exists(os.path.join(self.cgroup.path, "memory.swap.max")):
            with open(os.path.join(self.cgroup.path, "memory.swap.max"), "w") as f:
                f.write("0")

    def test_oom_killed_program_gets_the_oom_killer_verdict(self):
        run_dir = self.tmpdir()
        command = [sys.executable, "-c", GROW]
        if self.scope:
            argv = ["systemd-run", "--user", "--scope", "-q", "-p", "MemoryMax=%d" % self.LIMIT,
                    "-p", "MemorySwapMax=0", MEMLEDGER, "run", "-q", "-o", run_dir, "--host", "sampled", "--", *command]
            proc = self.run_cmd(argv)
        else:
            proc = self.traced(run_dir, self.cgroup.enter_command(command), options=("--host", "sampled"))
        self.assertIn("READY", proc.stdout)
        self.assertEqual(proc.returncode, 128 + 9, proc.stderr)
        report = self.load_report(run_dir)
        verdict = report["verdict"]
        self.assertEqual(verdict["kind"], "host_oom_kill", verdict["summary"])
        summary = verdict["summary"]
        self.assertTrue(summary.startswith("killed by SIGKILL: killed by the kernel's OOM killer"), summary)
        self.assertIn("cgroup limit 200.0 MiB", summary)
        rss = re.search(r"last RSS ([\d.]+) MiB", summary)
        self.assertIsNotNone(rss, summary)
        # The last sample (every 100 ms) comes before the final allocations:
        # on a loaded machine it can lag well behind the kill. It may also
        # come while the kernel reclaims at the limit, before it kills: RSS
        # then holds the whole heap and the pages of mapped files (the
        # interpreter, the libraries), which the cgroup's limit does not
        # count where another cgroup read them first.
        self.assertGreater(float(rss.group(1)), 20, summary)
        self.assertLessEqual(float(rss.group(1)), 200 + 32, summary)
        pid = report["pid"]
        with open(os.path.join(run_dir, "run.json")) as f:
            kernel = json.load(f)["kernel"]
        if kmsg_readable():
            self.assertTrue(kernel["log_read"])
            self.assertEqual([k["pid"] for k in kernel["oom_kills"]], [pid], kernel)
            self.assertIn("Killed process %d " % pid, kernel["oom_kills"][0]["line"])
            self.assertNotIn("(likely)", summary)
            self.assertIn("the kernel log says: ", summary)
            self.assertIn("Killed process %d (" % pid, summary)
        else:
            self.assertFalse(kernel["log_read"])
            self.assertIn("(likely)", summary)
            self.assertIn("the kernel log could not be read (/dev/kmsg: ", summary)
        if not self.scope:
            # The shell that moved itself was traced in the cgroup it started in.
            self.assertIn(self.cgroup.path, kernel["cgroup_oom_kills"], kernel)
            self.assertGreaterEqual(kernel["cgroup_oom_kills"][self.cgroup.path], 1)
            self.assertEqual(report["host_memory"]["cgroup"], self.cgroup.path)
        with open(os.path.join(run_dir, "report.txt")) as f:
            self.assertIn("stop verdict: " + summary + "\n", f.read())


class SwapThrash(TestCase):
    LIMIT = 64 << 20

    def make_swap(self):
        if not shutil.which("mkswap") or not shutil.which("swapon"):
            self.skipTest("mkswap and swapon are not installed (util-linux)")
        folder = tempfile.mkdtemp(prefix="memledger-swap-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, folder, True)
        path = os.path.join(folder, "swapfile")
        with open(path, "wb") as f:
            f.truncate(0)
            block = b"\0" * (1 << 20)
            for _ in range(512):
                f.write(block)
        os.chmod(path, 0o600)
        made = subprocess.run(["mkswap", path], capture_output=True, text=True)
        if made.returncode != 0:
            self.skipTest("swap cannot be made here: mkswap: " + made.stderr.strip())
        on = subprocess.run(["swapon", path], capture_output=True, text=True)
        if on.returncode != 0:
            self.skipTest("swap cannot be made here: swapon %s: %s" % (path, on.stderr.strip()))
        self.addCleanup(subprocess.run, ["swapoff", path], capture_output=True)

    def test_swapping_to_the_end_is_named_the_freeze(self):
        cgroup = MemoryCgroup(self.LIMIT)
        self.addCleanup(cgroup.remove)
        if cgroup.path is None:
            self.skipTest("no memory-limited cgroup can be made here to confine the thrashing: " +
                          "; ".join(cgroup.why_not))
        self.make_swap()
        if not cgroup.v2:
            with open(os.path.join(cgroup.path, "memory.swappiness"), "w") as f:
                f.write("100")
        run_dir = self.tmpdir()
        proc = self.traced(run_dir, cgroup.enter_command([sys.executable, "-c", THRASH]), options=("--host", "sampled"),
                           timeout=110)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("PASSES", proc.stdout)
        report = self.load_report(run_dir)
        memory = report["host_memory"]
        self.assertGreater(memory["max_swap_used"], 64 << 20, memory)
        self.assertGreater(memory["max_swap_in_per_s"], 4 << 20, memory)
        self.assertGreaterEqual(memory["freeze_seconds"], 5, memory)
        freeze = [n for n in report["notes"] if "that is the freeze" in n]
        self.assertEqual(len(freeze), 1, report["notes"])
        self.assertTrue(freeze[0].startswith("the system was swapping hard for the last "), freeze[0])
        self.assertEqual(memory["freeze"], freeze[0])
        # It ended by itself: the verdict stays the exit.
        self.assertEqual(report["verdict"]["summary"], "clean exit (code 0)")


if __name__ == "__main__":
    unittest.main()
