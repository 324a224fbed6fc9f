"""A headless Chromium driven over the DevTools protocol (not a test itself).

Chromium is started with --remote-debugging-pipe: it reads protocol
commands from fd 3 and writes replies and events to fd 4, as NUL-terminated
JSON; no port, no WebSocket library. Used by test_html_report.py to open
the HTML report as a user's browser would, collect console messages and
errors, measure elements, and take screenshots.
"""

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class ProtocolError(Exception):
    pass


class Chromium:
    def __init__(self, exe, width=1280, height=900, timeout=30):
        self.timeout = timeout
        self.width = width
        self.height = height
        self.profile = tempfile.mkdtemp(prefix="mltest-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Above any descriptor the child's fds 3 and 4 could collide with, and
        # close-on-exec: the child gets them only as fds 3 and 4 (dup2 clears
        # the flag), other descriptors of this process are not inheritable.
        high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def child_fds():
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio",
             "--user-data-dir=" + self.profile, "--window-size=%d,%d" % (width, height), "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            close_fds=False, preexec_fn=child_fds, start_new_session=True)
        os.close(high_r)
        os.close(high_w)
        self._next_id = 0
        self._replies = {}
        self._events = queue.Queue()
        self._lock = threading.Condition()
        self._stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.session = None

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self._stderr.append(line.decode(errors="replace"))

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        self._replies[msg["id"]] = msg
                        self._lock.notify_all()
                else:
                    self._events.put(msg)
        with self._lock:
            self._replies[None] = {"error": {"message": "chromium closed the pipe"}}
            self._lock.notify_all()

    def send(self, method, params=None, session=True):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while self._next_id not in self._replies and None not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError("%s: no reply within %s s\n%s" % (method, self.timeout, "".join(self._stderr[-20:])))
                self._lock.wait(left)
            reply = self._replies.pop(self._next_id, None) or self._replies[None]
        if "error" in reply:
            raise ProtocolError("%s: %s" % (method, reply["error"].get("message")))
        return reply.get("result", {})

    def events(self):
        """Every event received so far, in order."""
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def wait_event(self, method, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        seen = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError("no %s within the time limit" % method)
                try:
                    ev = self._events.get(timeout=left)
                except queue.Empty:
                    raise ProtocolError("no %s within the time limit" % method) from None
                seen.append(ev)
                if ev.get("method") == method:
                    return ev
        finally:
            # Keep every event for events(), the awaited one included.
            for ev in seen:
                self._events.put(ev)

    def open_page(self):
        """A new tab with the page domains enabled; commands go to it from now on."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(domain + ".enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})

    def navigate(self, url):
        self.events()  # drop what came before
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression):
        """Runs JavaScript in the page (DevTools evaluation is not subject to the
        page's Content-Security-Policy) and returns its JSON value."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise ProtocolError("evaluation failed: %s" % json.dumps(result["exceptionDetails"])[:2000])
        return result["result"].get("value")

    def screenshot(self, clip=None):
        """PNG bytes of the viewport, of the whole page (clip="page"), or of a
        {x, y, width, height} rectangle of the page."""
        params = {"format": "png", "captureBeyondViewport": clip is not None}
        if clip == "page":
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            clip = {"x": 0, "y": 0, "width": size[0], "height": size[1]}
        if clip is not None:
            params["clip"] = dict(clip, scale=1)
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])

    def problems(self):
        """Console errors and warnings, uncaught exceptions and browser log
        errors (CSP violations, failed loads) since the last navigation."""
        found = []
        for ev in self.events():
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append("console.%s: %s" % (params["type"], " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params.get("args", []))))
            elif method == "Runtime.exceptionThrown":
                found.append("exception: %s" % params.get("exceptionDetails", {}).get("text"))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                entry = params["entry"]
                found.append("log %s (%s): %s" % (entry["level"], entry.get("source"), entry.get("text")))
        return found

    def close(self):
        try:
            self.send("Browser.close", session=False)
        except (ProtocolError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)
