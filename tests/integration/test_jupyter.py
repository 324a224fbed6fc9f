"""`memledger run -- jupyter lab`: the server starts, serves and shuts down as
it would untraced, every kernel it starts is traced, and the job table names
each kernel by the notebook's kernel id with its own stop verdict.

One run drives three kernels through the REST API and their connection files
(jupyter/notebook_driver.py): one that SIGKILLs itself from a cell, one that
segfaults, each restarted by the server under the same id, and one restarted
on request; then the server is shut down (POST /api/shutdown). A control run
whose only kernel ends normally names no dead kernel; it is stopped with
SIGTERM, on which the server shuts down cleanly as it does untraced.

Needs jupyterlab and ipykernel in .venv (scripts/install-deps.sh); skipped
with the reason otherwise."""

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

import mltest
from test_host_pressure import MemoryCgroup

VENV = mltest.SOURCE_DIR / ".venv" / "bin"
JUPYTER = str(VENV / "jupyter")
PYTHON = str(VENV / "python3")
DRIVER = str(mltest.SOURCE_DIR / "tests" / "integration" / "jupyter" / "notebook_driver.py")
TOKEN = "memledger-test"
OOM_LIMIT = 768 << 20


def missing():
    """Why the test cannot run here, or None."""
    if not os.access(JUPYTER, os.X_OK):
        return "%s not found (scripts/install-deps.sh installs jupyterlab and ipykernel into .venv)" % JUPYTER
    probe = subprocess.run([PYTHON, "-c", "import jupyterlab, ipykernel, jupyter_client"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return "%s cannot import jupyterlab, ipykernel and jupyter_client: %s (scripts/install-deps.sh)" % (PYTHON, last)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterRun:
    """A traced `jupyter lab` in TMP, driven through SCENARIOS, then shut down
    through the REST API, or with SIGTERM to memledger (which forwards it)."""

    def __init__(self, case, tmp, scenarios, stop="api", cgroup=None):
        self.run_dir = os.path.join(tmp, "run")
        runtime = os.path.join(tmp, "runtime")
        env = mltest.clean_env(JUPYTER_RUNTIME_DIR=runtime, JUPYTER_CONFIG_DIR=os.path.join(tmp, "config"),
                               JUPYTER_DATA_DIR=os.path.join(tmp, "data"), IPYTHONDIR=os.path.join(tmp, "ipython"),
                               JUPYTER_PLATFORM_DIRS="1")
        port = free_port()
        url = "http://127.0.0.1:%d" % port
        server = [JUPYTER, "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1", "--port=%d" % port,
                  "--ServerApp.port_retries=0", "--IdentityProvider.token=" + TOKEN, "--ServerApp.root_dir=" + tmp,
                  # A kernel asked to shut down gets SIGTERM after half of
                  # this and SIGKILL after all of it (5 s by default). A
                  # traced kernel's exit takes longer (the retention walk,
                  # up to 1 s, and the trace's last frames), and under a
                  # loaded machine may pass 2.5 s: it would then be
                  # terminated, and rightly counted as such.
                  "--KernelManager.shutdown_wait_time=30"]
        if cgroup is not None:
            server = cgroup.enter_command(server)
        command = [mltest.MEMLEDGER, "run", "-q", "-o", self.run_dir, "--", *server]
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
        try:
            self.up_seconds = self.wait_up(proc, url)
            driver = subprocess.run([PYTHON, DRIVER, url, TOKEN, runtime, *scenarios], env=env, capture_output=True,
                                    text=True, timeout=120)
            if driver.returncode != 0:
                raise AssertionError("the notebook driver failed (exit %d):\n%s%s" %
                                     (driver.returncode, driver.stdout, driver.stderr[-3000:]))
            self.kernels = json.loads(driver.stdout)
            if stop == "api":
                request = urllib.request.Request(url + "/api/shutdown", method="POST",
                                                 headers={"Authorization": "token " + TOKEN})
                urllib.request.urlopen(request, timeout=30).read()
            else:
                proc.send_signal(signal.SIGTERM)
            self.output, _ = proc.communicate(timeout=60)
        except BaseException:
            mltest.kill_session(proc.pid)
            proc.communicate()
            raise
        self.returncode = proc.returncode
        self.report = case.load_report(self.run_dir)
        with open(os.path.join(self.run_dir, "report.txt")) as f:
            self.text = f.read()

    @staticmethod
    def wait_up(proc, url):
        start = time.monotonic()
        while time.monotonic() - start < 90:
            if proc.poll() is not None:
                raise AssertionError("the server ended before serving: exit %s\n%s" % (proc.returncode, proc.stdout.read()))
            try:
                request = urllib.request.Request(url + "/api/status", headers={"Authorization": "token " + TOKEN})
                urllib.request.urlopen(request, timeout=5).read()
                return time.monotonic() - start
            except OSError:
                time.sleep(0.3)
        raise AssertionError("the traced server did not answer at %s in 90 s" % url)


class Jupyter(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = missing()
        if why:
            print("test_jupyter: skipped: " + why)
            raise mltest.unittest.SkipTest(why)
        # The server in a memory-limited cgroup where one can be made: a
        # kernel that outgrows it meets the kernel's OOM killer.
        cls.cgroup = MemoryCgroup(OOM_LIMIT)
        cls.addClassCleanup(cls.cgroup.remove)
        scenarios = ["killed", "crashed", "clean"]
        if cls.cgroup.path is not None:
            swap = os.path.join(cls.cgroup.path, "memory.memsw.limit_in_bytes")
            if os.path.exists(swap):  # v1 with swap accounting: no way out through swap
                with open(swap, "w") as f:
                    f.write(str(OOM_LIMIT))
            elif cls.cgroup.v2 and os.path.exists(os.path.join(cls.cgroup.path, "memory.swap.max")):
                with open(os.path.join(cls.cgroup.path, "memory.swap.max"), "w") as f:
                    f.write("0")
            scenarios.append("oom")
        cls.job = JupyterRun(cls, cls.class_tmpdir(), scenarios,
                             cgroup=cls.cgroup if cls.cgroup.path is not None else None)
        cls.control = JupyterRun(cls, cls.class_tmpdir(), ["clean"], stop="sigterm")

    def rows(self, run, kernel):
        """The job table's rows of one kernel, by pid."""
        rows = {r["label"]: r for r in run.report["job"]["rows"]}
        found = {}
        for pid in kernel["pids"]:
            label = "Jupyter kernel %s (pid %d)" % (kernel["id"], pid)
            self.assertIn(label, rows, sorted(rows))
            found[pid] = rows[label]
            self.assertEqual((rows[label]["python_role"], rows[label]["kernel_id"]), ("Jupyter kernel", kernel["id"]))
        return found

    @staticmethod
    def deaths(run):
        """What a failure shows of the processes that died: their verdicts,
        and the end of the server's output (the kernels' stderr)."""
        rows = {r["process"]: r for r in run.report["job"]["rows"]}
        lines = ["%s: %s" % (rows[i]["label"], rows[i]["verdict"]) for i in run.report["job"]["died"]]
        return "\n".join(lines + ["--- the server's output, last lines:", run.output[-3000:]])

    def test_server_serves_and_exits_cleanly(self):
        for run in (self.job, self.control):  # POST /api/shutdown, SIGTERM
            self.assertEqual(run.returncode, 0, run.output[-3000:])
            servers = [r for r in run.report["job"]["rows"] if r["python_role"] == "Jupyter server"]
            self.assertEqual(len(servers), 1, [(r["label"], r["role"]) for r in run.report["job"]["rows"]])
            self.assertEqual((servers[0]["verdict_kind"], servers[0]["status"]), ("exit", "exit 0"), servers[0]["verdict"])
            self.assertRegex(servers[0]["label"], r"^Jupyter server \(pid \d+\)$")

    def test_kernel_killed_by_sigkill_then_restarted(self):
        kernel = self.job.kernels["killed"]
        dead, new = kernel["pids"]
        rows = self.rows(self.job, kernel)
        with open(os.path.join(self.job.run_dir, "run.json")) as f:
            log_read = json.load(f)["kernel"]["log_read"]
        if log_read or "oom" not in self.job.kernels:
            # The OOM kill the cgroup counted later is the other kernel's:
            # the kernel log names it.
            self.assertEqual(rows[dead]["verdict_kind"], "killed", rows[dead]["verdict"])
        else:
            # Without the kernel log, the cgroup's OOM kill count rose after
            # this kernel's last sample: the OOM killer is called likely.
            self.assertIn(rows[dead]["verdict_kind"], ("killed", "host_oom_kill"), rows[dead]["verdict"])
        self.assertTrue(rows[dead]["verdict"].startswith("killed by SIGKILL"), rows[dead]["verdict"])
        self.assertEqual(rows[new]["status"], "exit 0", rows[new]["verdict"])
        server = next(r for r in self.job.report["job"]["rows"] if r["python_role"] == "Jupyter server")
        for row in rows.values():
            self.assertIn("child of %s" % re.sub(r"^Jupyter server \((pid \d+)\)$", r"\1", server["label"]), row["role"])
        label = "Jupyter kernel %s (pid %d)" % (kernel["id"], dead)
        self.assertIn(label + " was killed by SIGKILL", self.job.report["job"]["conclusion"])
        self.assertIn("whole job: ", self.job.text)
        self.assertRegex(self.job.text, re.escape(label) + r" +\d+ .*(killed|host_oom_kill) SIGKILL")
        self.assertIn("== process %d (Jupyter kernel %s): " % (dead, kernel["id"]), self.job.text)

    def test_kernel_segfault_then_restarted(self):
        kernel = self.job.kernels["crashed"]
        dead, new = kernel["pids"]
        rows = self.rows(self.job, kernel)
        self.assertEqual((rows[dead]["verdict_kind"], rows[dead]["status"]), ("crash", "crash SIGSEGV"), rows[dead]["verdict"])
        self.assertEqual(rows[new]["status"], "exit 0", rows[new]["verdict"])
        self.assertIn("Jupyter kernel %s (pid %d) crashed with SIGSEGV" % (kernel["id"], dead),
                      self.job.report["job"]["conclusion"])

    def test_kernel_killed_by_the_oom_killer(self):
        if "oom" not in self.job.kernels:
            self.skipTest("no memory-limited cgroup can be made here: " + "; ".join(self.cgroup.why_not))
        kernel = self.job.kernels["oom"]
        dead, new = kernel["pids"]
        rows = self.rows(self.job, kernel)
        self.assertEqual(rows[dead]["verdict_kind"], "host_oom_kill", rows[dead]["verdict"])
        self.assertIn("cgroup limit 768.0 MiB", rows[dead]["verdict"])
        self.assertEqual(rows[new]["status"], "exit 0", rows[new]["verdict"])
        self.assertIn("Jupyter kernel %s (pid %d) was killed by SIGKILL: killed by the kernel's OOM killer" % (kernel["id"], dead),
                      self.job.report["job"]["conclusion"], self.deaths(self.job))

    def test_kernel_restarted_on_request_ends_cleanly(self):
        kernel = self.job.kernels["clean"]
        for pid, row in self.rows(self.job, kernel).items():
            self.assertEqual(row["status"], "exit 0", row["verdict"])
        labels = {r["process"]: r["label"] for r in self.job.report["job"]["rows"]}
        dead = sorted(labels[i] for i in self.job.report["job"]["died"])
        self.assertEqual(dead, sorted("Jupyter kernel %s (pid %d)" % (self.job.kernels[k]["id"], self.job.kernels[k]["pids"][0])
                                      for k in ("killed", "crashed", "oom") if k in self.job.kernels),
                         self.deaths(self.job))

    def test_html_names_the_kernels(self):
        with open(os.path.join(self.job.run_dir, "report.html")) as f:
            html = f.read()
        for kernel in self.job.kernels.values():
            self.assertIn("Jupyter kernel %s (pid %d)" % (kernel["id"], kernel["pids"][0]), html)

    def test_control_names_no_dead_kernel(self):
        kernel = self.control.kernels["clean"]
        for row in self.rows(self.control, kernel).values():
            self.assertEqual(row["status"], "exit 0", row["verdict"])
        self.assertEqual(self.control.report["job"]["died"], [])
        self.assertNotIn("killed", self.control.report["job"]["conclusion"])
        self.assertNotIn("crashed", self.control.report["job"]["conclusion"])


if __name__ == "__main__":
    mltest.main()
