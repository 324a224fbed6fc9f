"""Drives a running Jupyter server as a notebook user would, for
test_jupyter.py (run with the Python that has jupyter_client):

    notebook_driver.py URL TOKEN RUNTIME_DIR SCENARIO...

Each scenario starts a kernel through the REST API (POST /api/kernels) and
runs cells in it through its connection file:
- killed: a cell that grows a list, then one that SIGKILLs its own kernel;
  the server restarts the kernel (same id, new process), which is then shut
  down;
- crashed: a cell that reads address 0 (SIGSEGV); restarted, then shut down;
- oom: a cell that keeps memory until the kernel's OOM killer ends the
  kernel (the server runs in a memory-limited cgroup); restarted, then shut
  down;
- clean: a cell, a restart asked of the server, then a shut-down.

Prints one JSON object: for each scenario the kernel's id and the pids of its
processes in start order."""

import json
import os
import sys
import time
import urllib.request

from jupyter_client import BlockingKernelClient

URL, TOKEN, RUNTIME = sys.argv[1:4]
DEADLINE = 40


def request(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method,
                                 headers={"Authorization": "token " + TOKEN, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=DEADLINE) as response:
        text = response.read()
    return json.loads(text) if text else None


def client(kernel_id, timeout=DEADLINE):
    path = os.path.join(RUNTIME, "kernel-%s.json" % kernel_id)
    end = time.monotonic() + DEADLINE
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit("no connection file " + path)
        time.sleep(0.1)
    kc = BlockingKernelClient()
    kc.load_connection_file(path)
    # jupyter_client takes a kernel whose heartbeat answers more than a
    # second late for dead ("Kernel died before replying to kernel_info");
    # a traced kernel starting on a loaded machine can be that late. Its
    # readiness is what this waits for (the kernel_info reply, within
    # `timeout`); a kernel that is really gone is found by that timeout.
    kc.hb_channel.time_to_dead = 10.0
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=timeout)
    except RuntimeError:
        kc.stop_channels()
        raise
    return kc


def run(kc, code, timeout=DEADLINE):
    """Runs a cell; returns what it printed."""
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            raise SystemExit("cell failed: %s: %s" % (msg["content"]["ename"], msg["content"]["evalue"]))

    kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    return "".join(out)


def pid_of(kc, timeout=DEADLINE):
    return int(run(kc, "import os; print(os.getpid())", timeout))


def restarted(kc, kernel_id, old_pid):
    """A client of the kernel's next process and its pid, once the server
    has restarted it (on new ports after a death: the connection file is
    read again)."""
    kc.stop_channels()
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        time.sleep(0.5)
        try:
            kc = client(kernel_id, timeout=3)
        except Exception:
            continue
        try:
            pid = pid_of(kc, timeout=5)
            if pid != old_pid:
                return kc, pid
        except Exception:
            pass
        kc.stop_channels()
    raise SystemExit("the kernel was not restarted")


def scenario(name):
    kernel_id = request("POST", "/api/kernels", {"name": "python3"})["id"]
    kc = client(kernel_id)
    pids = [pid_of(kc)]
    if name == "clean":
        run(kc, "data = [bytearray(1 << 20) for _ in range(4)]")
        request("POST", "/api/kernels/%s/restart" % kernel_id, {})
        kc, pid = restarted(kc, kernel_id, pids[0])
        pids.append(pid)
    else:
        run(kc, "leak = []\nfor _ in range(8): leak.append(bytearray(1 << 20))")
        if name == "killed":
            kc.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        elif name == "oom":
            kc.execute("kept = []\nwhile True: kept.append(b'x' * (8 << 20))")
        else:
            kc.execute("import ctypes; ctypes.string_at(0)")
        kc, pid = restarted(kc, kernel_id, pids[0])
        pids.append(pid)
    kc.stop_channels()
    request("DELETE", "/api/kernels/%s" % kernel_id)
    return {"id": kernel_id, "pids": pids}


print(json.dumps({name: scenario(name) for name in sys.argv[4:]}))
