"""Torn, corrupted and hostile trace files: `memledger report` gives a partial
report (exit 0) with the damage named, or a clear error (exit 1), and never
crashes or hangs. Ends with a small fuzz loop over mutations of a real trace.

The fuzz seed can be changed with MLTEST_FUZZ_SEED; inputs that fail are kept
in BUILD_DIR/meson-logs/fuzz-failures/ for reproduction."""

import concurrent.futures
import json
import os
import random
import shutil
import struct

import mltest

STEPS = 12


class DamagedTraces(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_tmpdir()
        run_dir = os.path.join(cls.tmp, "good")
        # 20 ms between steps: about one frame per step (the writer flushes
        # at each marker; with 5 ms, a writer slowed by a busy machine joined
        # the steps into 6 frames). tiny_steps and --stack-depth 2 keep libc out of the
        # stacks the report shows: symbolizing libc means inflating its
        # compressed separate debug info, ~150 ms per report; this way a
        # report takes ~25 ms and the 200 fuzz runs a few seconds.
        cls.proc = cls.traced(run_dir, [mltest.program("tiny_steps"), STEPS, 20],
                              options=("--host", "full", "--stack-depth", "2"))
        traces = [f for f in os.listdir(run_dir) if f.startswith("trace.")] if cls.proc.returncode == 0 else []
        cls.trace_path = os.path.join(run_dir, traces[0]) if traces else None
        with open(cls.trace_path, "rb") as f:
            cls.data = f.read()
        cls.header_end, cls.frames = mltest.split_frames(cls.data)

    def setUp(self):
        self.assertExit(self.proc, 0)
        self.assertGreaterEqual(len(self.frames), 8, "want a trace of many frames to damage")

    def write(self, name, data):
        path = os.path.join(self.tmpdir(), name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def report(self, path, expect=0):
        proc = self.memledger("report", "--format", "json", path, timeout=10)
        self.assertNoCrash(proc)
        self.assertExit(proc, expect)
        return json.loads(proc.stdout) if expect == 0 else proc

    def test_intact_trace_reads_fully(self):
        r = self.report(self.trace_path)
        self.assertEqual(r["stats"]["frames_read"], len(self.frames))
        self.assertEqual(r["stats"]["frames_damaged"], 0)
        self.assertFalse(r["stats"]["truncated"])
        self.assertEqual(len(r["steps"]), STEPS)

    def test_cut_at_frame_boundaries(self):
        previous = 0
        # The last two frames hold the exit record and the end record.
        for k in (1, 3, len(self.frames) // 2, len(self.frames) - 2):
            with self.subTest(frames=k):
                r = self.report(self.write("cut.mlt", self.data[:self.frames[k].offset]))
                self.assertEqual(r["stats"]["frames_read"], k)
                self.assertEqual(r["stats"]["frames_damaged"], 0)
                self.assertFalse(r["stats"]["truncated"])
                # No end record, no run.json: the process stopped without warning.
                self.assertEqual(r["verdict"]["kind"], "killed")
                self.assertGreaterEqual(len(r["steps"]), previous)
                self.assertLessEqual(len(r["steps"]), STEPS)
                previous = len(r["steps"])

    def test_cut_inside_a_frame(self):
        for k in (0, 1, len(self.frames) // 2, len(self.frames) - 2):
            with self.subTest(frame=k):
                frame = self.frames[k]
                boundary = self.report(self.write("boundary.mlt", self.data[:frame.offset]))
                r = self.report(self.write("torn.mlt", self.data[:frame.payload_offset + frame.stored_len // 2]))
                self.assertTrue(r["stats"]["truncated"])
                self.assertEqual(r["stats"]["frames_read"], k)
                self.assertEqual(r["stats"]["frames_damaged"], 0)
                self.assertTrue(any("ends inside frame %d" % k in n for n in r["notes"]), r["notes"])
                # Everything before the torn frame is there.
                self.assertEqual(r["steps"], boundary["steps"])
                self.assertEqual(r["stats"]["events"], boundary["stats"]["events"])

    def test_cut_at_many_offsets(self):
        last = self.frames[-1]
        offsets = [self.header_end, self.header_end + 1, self.header_end + 23, self.frames[1].offset + 5,
                   last.payload_offset, last.end - 1, len(self.data) - 1]
        for offset in offsets:
            with self.subTest(offset=offset):
                r = self.report(self.write("cut.mlt", self.data[:offset]))
                self.assertEqual(r["stats"]["frames_damaged"], 0)
                if offset != self.header_end:
                    self.assertTrue(r["stats"]["truncated"])
                    self.assertTrue(any("ends inside" in n for n in r["notes"]), r["notes"])
        # Inside the file header or its text: not a readable trace.
        for offset in (4, 12, self.header_end - 1):
            with self.subTest(offset=offset):
                proc = self.report(self.write("cut.mlt", self.data[:offset]), expect=1)
                self.assertIn("memledger:", proc.stderr)

    def frames_in_order(self, order):
        parts = [self.data[:self.header_end]]
        parts += [self.data[self.frames[i].offset:self.frames[i].end] for i in order]
        return b"".join(parts)

    def test_frames_out_of_order_are_replayed_in_order(self):
        # A thread preempted between taking its sequence number and storing
        # its event lands it in a later frame: the reader restores the order.
        intact = self.report(self.trace_path)
        n = len(self.frames)
        order = list(range(n))
        for a, b in ((1, 4), (n // 2, n // 2 + 2)):
            order[a], order[b] = order[b], order[a]
        r = self.report(self.write("shuffled.mlt", self.frames_in_order(order)))
        self.assertEqual(r["stats"]["frames_read"], n)
        self.assertEqual(r["steps"], intact["steps"])
        self.assertEqual(r["peak"], intact["peak"])
        self.assertEqual(r["exit_leaks"], intact["exit_leaks"])
        self.assertEqual(r["leak_suspects"], intact["leak_suspects"])
        self.assertFalse(any("late" in note for note in r["notes"]), r["notes"])

    def test_frame_far_out_of_order_is_named(self):
        # A frame moved behind more than the reorder window (8) of frames
        # that hold events. How a run splits into frames depends on the
        # writer's timing (on a loaded machine a frame may hold samples or
        # stacks only, or several steps), so this test traces a longer run of
        # its own and reads each frame's records from `memledger dump`.
        run_dir = os.path.join(self.tmpdir(), "long")
        proc = self.traced(run_dir, [mltest.program("tiny_steps"), 40, 5],
                           options=("--host", "full", "--stack-depth", "2"))
        self.assertExit(proc, 0)
        path = os.path.join(run_dir, next(f for f in os.listdir(run_dir) if f.startswith("trace.")))
        with open(path, "rb") as f:
            data = f.read()
        header_end, frames = mltest.split_frames(data)
        dump = self.memledger("dump", path, timeout=30)
        self.assertExit(dump, 0)
        with_allocs = set()
        frame = None
        for line in dump.stdout.splitlines():
            if line.startswith("frame "):
                frame = int(line.split()[1].rstrip(":"))
            elif line.startswith("alloc "):
                with_allocs.add(frame)
        window = 8
        k = next((i for i in sorted(with_allocs) if i >= 1 and len([j for j in with_allocs if j > i]) > window), None)
        self.assertIsNotNone(k, "want a frame of allocations followed by more than %d such frames: %s of %d"
                             % (window, sorted(with_allocs), len(frames)))
        order = [i for i in range(len(frames)) if i != k] + [k]
        moved = data[:header_end] + b"".join(data[frames[i].offset:frames[i].end] for i in order)
        r = self.report(self.write("late.mlt", moved))
        self.assertEqual(r["stats"]["frames_read"], len(frames))
        self.assertTrue(any("frames late and were replayed out of order" in note for note in r["notes"]), r["notes"])

    def test_corrupted_payload(self):
        k = len(self.frames) // 2
        frame = self.frames[k]
        data = bytearray(self.data)
        for i in range(8):
            data[frame.payload_offset + frame.stored_len // 3 + i] ^= 0xA5
        r = self.report(self.write("flipped.mlt", bytes(data)))
        self.assertEqual(r["stats"]["frames_damaged"], 1)
        self.assertEqual(r["stats"]["frames_read"], len(self.frames) - 1)
        self.assertTrue(any("damaged data at byte %d" % frame.offset in n for n in r["notes"]), r["notes"])
        self.assertGreaterEqual(len(r["steps"]), STEPS - 2)

    def test_damaged_frame_headers(self):
        k = len(self.frames) // 2
        frame = self.frames[k]
        cases = {
            "magic": (0, 0xDEADBEEF),
            "stored_len beyond the file": (8, 0x7FFFFFF0),
            "stored_len too long": (8, frame.stored_len + 100),
            "stored_len too short": (8, frame.stored_len - 100),
            "crc": (16, frame.crc32 ^ 1),
        }
        for name, (field, value) in cases.items():
            with self.subTest(field=name):
                data = bytearray(self.data)
                struct.pack_into("<I", data, frame.offset + field, value)
                r = self.report(self.write("header.mlt", bytes(data)))
                self.assertEqual(r["stats"]["frames_damaged"], 1)
                self.assertEqual(r["stats"]["frames_read"], len(self.frames) - 1)
                self.assertTrue(any("damaged" in n for n in r["notes"]), r["notes"])

    def test_undecodable_payloads(self):
        k = len(self.frames) // 2
        frame = self.frames[k]
        cases = {
            "compressed flag cleared": (4, frame.flags ^ 1),
            "raw_len wrong": (12, frame.raw_len + 7),
            "raw_len huge": (12, 60 << 20),
        }
        self.assertEqual(frame.flags & 1, 1, "the frames are expected to be compressed")
        for name, (field, value) in cases.items():
            with self.subTest(field=name):
                data = bytearray(self.data)
                struct.pack_into("<I", data, frame.offset + field, value)
                r = self.report(self.write("payload.mlt", bytes(data)))
                self.assertEqual(r["stats"]["frames_damaged"], 1)
                self.assertTrue(any("frame %d" % k in n for n in r["notes"]), r["notes"])

    def test_unreadable_files(self):
        magic = self.data[:8]
        header = bytearray(self.data)
        struct.pack_into("<I", header, 8, 99)
        huge_header = bytearray(self.data[:16])
        struct.pack_into("<I", huge_header, 12, 0xFFFFFFFF)
        cases = {
            "empty": (b"", "empty file"),
            "magic only": (magic, "too short"),
            "garbage": (random.Random(7).randbytes(4096), "not a memledger trace"),
            "version 99": (bytes(header), "version 99"),
            "version 0": (bytes(header[:8]) + struct.pack("<I", 0) + bytes(header[12:]), "version 0"),
            "header length beyond the file": (bytes(huge_header), "header"),
        }
        for name, (data, message) in cases.items():
            with self.subTest(case=name):
                path = self.write("bad.mlt", data)
                proc = self.report(path, expect=1)
                self.assertIn(message, proc.stderr)
                self.assertIn(path, proc.stderr)
                dump = self.memledger("dump", path, timeout=10)
                self.assertNoCrash(dump)
                self.assertExit(dump, 1)

    def test_folders(self):
        empty = self.tmpdir()
        proc = self.report(empty, expect=1)
        self.assertIn("no memledger traces", proc.stderr)
        proc = self.report(os.path.join(empty, "missing"), expect=1)
        self.assertIn("missing", proc.stderr)

        mixed = self.tmpdir()
        shutil.copy(self.trace_path, mixed)
        with open(os.path.join(mixed, "trace.4242.mlt"), "wb") as f:
            f.write(random.Random(3).randbytes(1000))
        r = self.report(mixed)
        self.assertEqual(len(r["processes"]), 1)
        self.assertEqual(os.path.basename(r["trace"]), os.path.basename(self.trace_path))
        self.assertEqual(len(r["steps"]), STEPS)
        self.assertEqual(len(r["problems"]), 1)
        self.assertIn("trace.4242.mlt", r["problems"][0])
        text = self.memledger("report", mixed, timeout=10)
        self.assertExit(text, 0)
        self.assertIn("trace.4242.mlt", text.stderr)

    def test_fuzz(self):
        seed = int(os.environ.get("MLTEST_FUZZ_SEED", "20241122"))
        rng = random.Random(seed)
        frame_offsets = [f.offset for f in self.frames]

        def mutate(i):
            data = bytearray(self.data)
            what = rng.randrange(7)
            if what == 0:  # flip bits anywhere
                for _ in range(rng.randint(1, 16)):
                    p = rng.randrange(len(data))
                    data[p] ^= 1 << rng.randrange(8)
            elif what == 1:  # overwrite a run of bytes with random ones
                p = rng.randrange(len(data))
                n = rng.randint(1, 64)
                data[p:p + n] = rng.randbytes(n)
            elif what == 2:  # an extreme value in a frame header field
                p = rng.choice(frame_offsets) + 4 * rng.randrange(6)
                value = rng.choice([0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 64 << 20, rng.getrandbits(32)])
                struct.pack_into("<I", data, p, value)
            elif what == 3:  # truncate
                del data[rng.randrange(len(data)):]
            elif what == 4:  # duplicate a chunk (repeated frames)
                p = rng.randrange(len(data))
                n = rng.randint(1, 20000)
                data[p:p] = data[p:p + n]
            elif what == 5:  # delete a chunk
                p = rng.randrange(len(data))
                del data[p:p + rng.randint(1, 5000)]
            else:  # damage the header text
                p = rng.randrange(16, self.header_end)
                data[p] = rng.randrange(256)
            return what, bytes(data)

        mutations = [mutate(i) for i in range(200)]
        folder = self.tmpdir()

        def check(item):
            i, (what, data) = item
            path = os.path.join(folder, "fuzz-%03d.mlt" % i)
            with open(path, "wb") as f:
                f.write(data)
            try:
                proc = self.memledger("report", "--format", "json", path, timeout=10)
            except Exception as e:  # noqa: BLE001 - a timeout is a failure too
                return i, what, path, "%s: %s" % (type(e).__name__, e)
            if proc.returncode not in (0, 1):
                return i, what, path, "exit %d: %s" % (proc.returncode, proc.stderr[-500:])
            if proc.returncode == 0:
                try:
                    json.loads(proc.stdout)
                except ValueError as e:
                    return i, what, path, "invalid JSON: %s" % e
            elif not proc.stderr.startswith("memledger: "):
                return i, what, path, "exit 1 without a message"
            os.unlink(path)
            return None

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            failures = [f for f in pool.map(check, enumerate(mutations)) if f is not None]
        if failures:
            keep = mltest.BUILD_DIR / "meson-logs" / "fuzz-failures"
            keep.mkdir(parents=True, exist_ok=True)
            for i, what, path, _ in failures:
                shutil.copy(path, keep / os.path.basename(path))
            self.fail("seed %d: %d of %d mutations failed (inputs kept in %s):\n%s" % (
                seed, len(failures), len(mutations), keep,
                "\n".join("#%d (mutation %d): %s" % (i, what, why) for i, what, _, why in failures[:10])))


if __name__ == "__main__":
    mltest.main()
