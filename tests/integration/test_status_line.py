"""The live status line of `memledger run` on a terminal (tools/status_line.h):
memledger runs on a pseudo-terminal, as its controlling terminal, with a
program that writes numbered lines slowly (some in two halves, some on
stderr) while the status is redrawn; everything read from the terminal is
fed to a terminal emulator (pyte), and every line of the program must stand
whole on a row of its own, in order, with no row mixing it with the status.

pyte comes from Debian (python3-pyte, which scripts/install-deps.sh installs
for the tests): this interpreter's, else Debian's python3 runs this file; the
test is skipped with a message where neither has it."""

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time
import unittest

import mltest


def _find_pyte():
    try:
        import pyte
        return pyte
    except ImportError:
        return None


pyte = _find_pyte()

# This interpreter cannot import pyte: run the file in one that can.
if pyte is None and __name__ == "__main__" and "MLTEST_PYTE_RERUN" not in os.environ:
    for exe in ("/usr/bin/python3", os.environ.get("MLTEST_PYTHON_ML", "")):
        if exe and os.access(exe, os.X_OK) and subprocess.run(
                [exe, "-c", "import pyte"], capture_output=True).returncode == 0:
            os.environ["MLTEST_PYTE_RERUN"] = "1"
            os.execv(exe, [exe, os.path.abspath(__file__), *sys.argv[1:]])

# The traced program: N numbered lines DELAY seconds apart; every fourth is
# written in two halves with a pause between (a redraw may come in the middle
# of it, as with a progress bar), every third is followed by a line on stderr;
# after line PAUSE_AFTER it pauses for two seconds.
PROGRAM = textwrap.dedent('''
    import os, sys, time
    n, delay, pause_after = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    print("program isatty %d %d" % (os.isatty(1), os.isatty(2)), flush=True)
    kept = []
    for i in range(1, n + 1):
        kept.append(bytearray(256 << 10))
        text = "program line %02d of %d: %s" % (i, n, "abcdefghij" * 3)
        if i % 4 == 0:
            sys.stdout.write(text[:20])
            sys.stdout.flush()
            time.sleep(delay * 3)
            sys.stdout.write(text[20:] + "\\n")
            sys.stdout.flush()
        else:
            print(text, flush=True)
        if i % 3 == 0:
            sys.stderr.write("program stderr %02d\\n" % i)
            sys.stderr.flush()
        time.sleep(2.0 if i == pause_after else delay)
''')


def expected_lines(n):
    lines = ["program isatty 1 1"]
    for i in range(1, n + 1):
        lines.append("program line %02d of %d: %s" % (i, n, "abcdefghij" * 3))
        if i % 3 == 0:
            lines.append("program stderr %02d" % i)
    return lines


def set_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def take_terminal():
    """preexec_fn, after setsid: the pseudo-terminal becomes the controlling
    terminal, memledger's process group its foreground (as in a shell)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`memledger run` on a pseudo-terminal of ROWS x COLS, its output fed to
    a pyte screen that keeps the rows scrolled off the top."""

    def __init__(self, case, rows, cols, lines, delay, term="xterm", pause_after=0):
        self.case = case
        self.rows, self.cols = rows, cols
        tmp = case.tmpdir()
        script = os.path.join(tmp, "lines.py")
        with open(script, "w") as f:
            f.write(PROGRAM)
        self.master, slave = os.openpty()
        set_size(slave, rows, cols)
        env = mltest.clean_env()
        env.pop("TERM", None)
        if term is not None:
            env["TERM"] = term
        self.proc = subprocess.Popen(
            [mltest.MEMLEDGER, "run", "-o", os.path.join(tmp, "run"), "--",
             "/usr/bin/python3", script, str(lines), str(delay), str(pause_after)],
            stdin=slave, stdout=slave, stderr=slave, env=env,
            start_new_session=True, preexec_fn=take_terminal)
        os.close(slave)
        self.screen = pyte.HistoryScreen(cols, rows, history=100000)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.closed = False

    def read(self, seconds):
        """Feeds what the terminal shows for up to SECONDS, or until every
        writer has closed it."""
        end = time.monotonic() + seconds
        while not self.closed and time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], min(0.05, max(0.0, end - time.monotonic())))
            if not ready:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                data = b""
            if not data:
                self.closed = True
                break
            self.raw += data
            self.stream.feed(data)

    def drain(self):
        """Feeds what is already written, without waiting."""
        while not self.closed and select.select([self.master], [], [], 0)[0]:
            self.read(0.01)

    def wait_for(self, count, what=b"[memledger]"):
        """Reads until WHAT has been written COUNT times."""
        end = time.monotonic() + mltest.TIMEOUT
        while self.raw.count(what) < count and not self.closed and time.monotonic() < end:
            self.read(0.1)
        self.case.assertGreaterEqual(self.raw.count(what), count, self.describe())

    def resize(self, rows, cols):
        """What a window manager does: the emulator first, then the kernel's
        size (which sends SIGWINCH to the foreground process group)."""
        self.drain()
        self.screen.resize(rows, cols)
        self.rows, self.cols = rows, cols
        set_size(self.master, rows, cols)

    def finish(self):
        self.read(mltest.TIMEOUT)
        try:
            code = self.proc.wait(timeout=mltest.TIMEOUT)
        finally:
            if self.proc.poll() is None:
                mltest.kill_session(self.proc.pid)
                self.proc.wait()
            os.close(self.master)
        return code

    def rows_seen(self):
        """Every row the screen showed, top to bottom: those scrolled off
        the top, then the screen's."""
        rows = []
        for line in self.screen.history.top:
            width = max(line.keys(), default=-1) + 1
            rows.append("".join(line[x].data for x in range(width)).rstrip())
        rows += [row.rstrip() for row in self.screen.display]
        return rows

    def describe(self):
        return "--- rows\n%s\n--- raw tail\n%r" % ("\n".join(self.rows_seen()), bytes(self.raw[-1500:]))


class StatusLine(mltest.TestCase):
    def assert_program_intact(self, term, lines):
        rows = term.rows_seen()
        where = []
        for line in expected_lines(lines):
            self.assertIn(line, rows, "a program line is not whole on a row of its own\n" + term.describe())
            where.append(rows.index(line))
        self.assertEqual(where, sorted(where), "the program's lines are out of order\n" + term.describe())
        for row in rows:
            if "[memledger]" in row:
                self.assertTrue(row.startswith("[memledger] ") and "program" not in row,
                                "a row mixes the program's output with the status: %r\n%s" % (row, term.describe()))
        return rows

    def assert_row_given_back(self, term, rows):
        self.assertFalse([r for r in rows if "[memledger]" in r], "the status row was left\n" + term.describe())
        self.assertIn(term.screen.margins, (None, (0, term.rows - 1)), "the scroll region was left set")

    def test_program_lines_never_share_a_row_with_the_status(self):
        term = Terminal(self, rows=10, cols=100, lines=24, delay=0.12)
        term.wait_for(4)
        code = term.finish()
        self.assertEqual(code, 0, term.describe())
        rows = self.assert_program_intact(term, 24)
        self.assert_row_given_back(term, rows)
        # memledger's closing lines follow the program's output.
        last = rows.index(expected_lines(24)[-1])
        self.assertTrue(any(r.startswith("memledger: run folder:") for r in rows[last + 1:]), term.describe())
        # Each redraw keeps the last row out of the scroll region.
        self.assertIn(b"\x1b[1;9r", term.raw)

    def test_resize_moves_the_status_to_the_new_last_row(self):
        # Resized while the program is quiet: until memledger has handled
        # SIGWINCH the terminal scrolls the whole screen, as for any
        # program that keeps a row.
        term = Terminal(self, rows=10, cols=100, lines=24, delay=0.12, pause_after=7)
        term.wait_for(1, expected_lines(24)[9].encode() + b"\r\n")
        term.read(0.2)
        term.resize(14, 100)
        since = len(term.raw)
        term.wait_for(1, b"\x1b[1;13r")
        self.assertIn(b"\x1b[14;1H", term.raw[since:], term.describe())
        self.assertEqual(term.finish(), 0, term.describe())
        self.assert_program_intact(term, 24)
        self.assertIn(term.screen.margins, (None, (0, 13)))

    def test_forwarded_signal_gives_the_row_back(self):
        term = Terminal(self, rows=10, cols=100, lines=60, delay=0.1)
        term.wait_for(3)
        os.kill(term.proc.pid, signal.SIGTERM)
        code = term.finish()
        self.assertEqual(code, 128 + signal.SIGTERM, term.describe())
        rows = term.rows_seen()
        self.assert_row_given_back(term, rows)
        for row in rows:
            self.assertFalse("[memledger]" in row and "program" in row, term.describe())

    def test_stopped_program_gets_the_whole_screen(self):
        term = Terminal(self, rows=10, cols=100, lines=40, delay=0.1)
        term.wait_for(2)
        with open("/proc/%d/task/%d/children" % (term.proc.pid, term.proc.pid)) as f:
            child = int(f.read().split()[0])
        os.kill(child, signal.SIGSTOP)
        term.read(1.5)
        self.assertIn(term.screen.margins, (None, (0, 9)), term.describe())
        self.assertFalse([r for r in term.screen.display if "[memledger]" in r], term.describe())
        since = len(term.raw)
        term.read(1.0)
        self.assertNotIn(b"[memledger]", term.raw[since:], "a status drawn while the program is stopped")
        os.kill(child, signal.SIGCONT)
        term.wait_for(term.raw.count(b"[memledger]") + 1)
        self.assertIn(b"\x1b[1;9r", term.raw[since:])
        self.assertEqual(term.finish(), 0, term.describe())
        rows = self.assert_program_intact(term, 40)
        self.assert_row_given_back(term, rows)

    def test_no_status_on_a_dumb_or_small_terminal(self):
        for term_name, rows in (("dumb", 24), (None, 24), ("xterm", 3)):
            with self.subTest(TERM=term_name, rows=rows):
                term = Terminal(self, rows=rows, cols=100, lines=8, delay=0.15, term=term_name)
                code = term.finish()
                self.assertEqual(code, 0, term.describe())
                self.assertNotIn(b"[memledger]", term.raw, term.describe())
                self.assertNotIn(b"\x1b[1;", term.raw, term.describe())
                self.assertIn(b"program line 08 of 8", term.raw)


if __name__ == "__main__":
    if pyte is None:
        print("SKIP: pyte cannot be imported here or by /usr/bin/python3 (Debian's python3-pyte; "
              "scripts/test.sh installs it)", flush=True)
        sys.exit(77)
    mltest.main()
