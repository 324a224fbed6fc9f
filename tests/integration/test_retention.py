"""Retention paths: who keeps a growth suspect's memory alive.

A PyTorch loop keeps every step's output (256 KiB) in a module-level list, in
a dict attribute of a module-level object, or in a list local to the
function that runs the loop (which calls memledger.snapshot() before it
returns). Plain `memledger run -- CMD`, no markers: the Python module walks
the referrers of the program's large tensors at exit (or at the snapshot),
and the report prints the chain from the container to its named root under
the suspect. The clean control keeps nothing: no suspect, and no path.

A Keras model.fit whose callback keeps every batch's logits (TensorFlow
eager tensors) and tf.Variable copies of them in its attributes; a JAX loop
that keeps every step's output in a dict `outputs`, global or local. A loop
sent SIGTERM: the walk runs in its SIGTERM handler and the process still
dies of SIGTERM; blocked in native code, it dies of SIGTERM by the
deadline."""

import json
import os
import re
import signal
import subprocess
import textwrap
import time

import clients
import mltest

SCRIPT = os.path.join(clients.CLIENTS_DIR, "retention_client.py")
KERAS = os.path.join(clients.CLIENTS_DIR, "retention_keras_client.py")
JAX = os.path.join(clients.CLIENTS_DIR, "retention_jax_client.py")
SIGTERM = os.path.join(clients.CLIENTS_DIR, "retention_sigterm_client.py")


# A program of 300,000 tracked objects, which the walk at exit or at a
# snapshot lists and sorts.
MANY_OBJECTS = textwrap.dedent("""
    import memledger

    class Node:
        pass

    kept = [Node() for _ in range(300_000)]
""")


# Owners of every kind the walk knows on the host, held in several ways; the
# walk at a snapshot run three times: the searches in C (for owners,
# memledger_py_referents; for the instances that hold an attribute dict,
# memledger_py_dict_holders), the same with room for 4 referents a call (so
# that single containers overflow it and are searched in Python), and the
# searches in Python and the collector alone. Prints each run's owners and
# paths.
BOTH_SEARCHES = textwrap.dedent("""
    import abc
    import json
    import numpy
    import torch
    import memledger
    from memledger import _retention


    class Big(bytes):
        pass


    class Holder:
        pass


    kept = {"bytes": b"x" * 100000, "bytearray": bytearray(70000), "subclass": Big(b"y" * 90000),
            "small": b"z" * 10, "array": numpy.zeros(20000), "view": numpy.zeros(30000)[10:],
            "tensor": torch.zeros(50000), "parameter": torch.nn.Parameter(torch.zeros(40000))}
    twice = [kept["bytes"], kept["bytes"], kept["tensor"]]
    tensors = [torch.zeros(20000 + i) for i in range(12)]
    holder = Holder()
    holder.arrays = [numpy.ones(10000 + i) for i in range(5)]
    # Containers the collector does not track: a dict of arrays, a dict of
    # bytes, tuples of arrays in a list (a collection stops tracking them).
    cache = {"a%d" % i: numpy.full(9000 + i, 1.0) for i in range(3)}
    blobs = {"blob": b"w" * 80000}
    batches = [(numpy.zeros(12000 + i), numpy.zeros(13000 + i)) for i in range(2)]
    _retention.gc.collect()
    print("UNTRACKED", json.dumps([_retention.gc.is_tracked(o) for o in (cache, blobs, batches[0])]))
    objects = _retention.gc.get_objects()
    in_c = None not in (_retention._ReferentScan.make(objects, (bytes,)), _retention._HolderScan.make(objects))
    del objects
    print("C_SEARCH", json.dumps(in_c))


    # The search in C compares types' method resolution orders: a class
    # registered with an abstract base class (as JAX once registered its
    # arrays with jax.Array) is not in it.
    class Buffer(abc.ABC):
        pass


    class Registered:
        pass


    Buffer.register(Registered)
    held = [Registered()]
    objects = _retention.gc.get_objects()
    scan = _retention._ReferentScan.make(objects, (Buffer,))
    pairs, after = scan.run(0, len(objects))
    print("REGISTERED", json.dumps([after == len(objects), any(child is held[0] for _, child in pairs)]))
    del objects, scan, pairs


    def walk(capacity, python):
        makes = _retention._ReferentScan.make, _retention._HolderScan.make
        _retention._ReferentScan.CAPACITY = capacity
        if python:
            _retention._ReferentScan.make = classmethod(lambda cls, objects, candidates: None)
            _retention._HolderScan.make = classmethod(lambda cls, objects: None)
        try:
            result = _retention.find(30)
        finally:
            _retention._ReferentScan.make, _retention._HolderScan.make = makes
        return sorted((o["address"], o["bytes"], o["what"], o["name"], o["root"], result["paths"][o["path"]])
                      for o in result["owners"])


    for name, capacity, python in (("c", 1 << 14, False), ("overflow", 4, False), ("python", 1 << 14, True)):
        print("WALK", name, json.dumps(walk(capacity, python)))
""")


# A cache of NumPy arrays that grows by one a step: a dict that the
# collector does not track (it holds only strings and arrays).
NUMPY_CACHE = textwrap.dedent("""
    import numpy

    cache = {}


    def step(i):
        x = numpy.random.rand(64, 1024)
        cache["batch%d" % i] = x * 2
        return float(x.sum())


    for i in range(40):
        step(i)
    print("DONE")
""")


# Each step keeps two rows of a batch: views, whose base (the whole batch)
# only the view holds.
NUMPY_VIEWS = textwrap.dedent("""
    import numpy

    history = []
    kept = numpy.zeros((64, 1024))


    def step(i):
        batch = numpy.random.rand(64, 1024)
        history.append(batch[:2])
        return float((batch * 2).sum())


    for i in range(40):
        step(i)
    also = kept[1:]  # a view of an array a global holds: the array is named
    print("DONE")
""")


def leak_line(mode, script=SCRIPT):
    """The client's line marked `# LEAK_SITE(mode)`."""
    with open(script) as f:
        return next(n for n, text in enumerate(f, 1) if "# LEAK_SITE(%s)" % mode in text)


def frames(suspect):
    return ["%s:%s" % (os.path.basename(f.get("file") or ""), f.get("line")) for f in suspect["stack"]]


class Retention(clients.ClientTestCase):
    def run_client(self, keep, *options, python=clients.PYTHON_TORCH, script=SCRIPT):
        run_dir = os.path.join(self.tmpdir(), "run")
        env = mltest.clean_env(MEMLEDGER_RETENTION_BUDGET="30", **clients.QUIET)
        proc = self.memledger("run", "-q", "-o", run_dir, *options, "--", python, script, "--keep", keep,
                              env=env, timeout=240)
        self.assertExit(proc, 0)
        self.assertIn("DONE", proc.stdout)
        report = self.load_report(run_dir)
        with open(os.path.join(run_dir, "report.txt")) as f:
            text = f.read()
        return report, text, run_dir

    def kept_by(self, report, count=1):
        """The paths of the suspect that has them (the outputs' site); with
        count > 1, the `count` suspects that have them."""
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertIsNotNone(process["stats"]["retention"], process["notes"])
        with_paths = [s for s in process["leak_suspects"] if s.get("kept_by")]
        self.assertEqual(len(with_paths), count, [(s["site"], s.get("kept_by")) for s in process["leak_suspects"]])
        return with_paths[0] if count == 1 else with_paths

    def test_global_list(self):
        clients.skip_unless(self, "torch")
        report, text, _ = self.run_client("global")
        suspect = self.kept_by(report)
        self.assertIn("retention_client.py:%d" % leak_line("output"), suspect["site"])
        top = suspect["kept_by"][0]
        self.assertEqual(top["hops"][0], "list `history` (40 items), global in __main__ (retention_client.py)")
        self.assertTrue(top["hops"][-1].startswith("Tensor (float32[64, 1024], requires_grad, grad_fn "), top)
        # Sampled mode records most 256 KiB blocks (and all that it does are matched).
        self.assertGreaterEqual(top["objects"], 20)
        self.assertIn("     kept by: list `history` (40 items), global in __main__ (retention_client.py)\n", text)
        self.assertIn("         ← Tensor (float32[64, 1024]", text)

    def test_attribute(self):
        clients.skip_unless(self, "torch")
        report, _, _ = self.run_client("attribute", "--host", "full")
        suspect = self.kept_by(report)
        self.assertIn("retention_client.py:%d" % leak_line("copy"), suspect["site"])
        top = suspect["kept_by"][0]
        self.assertEqual(top["hops"][:2], ["Trainer object `trainer`, global in __main__ (retention_client.py)",
                                           "attribute `cache`: dict (40 items)"])
        self.assertEqual(top["hops"][2], "Tensor (float32[64, 1024])")
        self.assertEqual(top["objects"], 40)  # full mode: every block
        self.assertEqual(top["bytes"], 40 * 64 * 1024 * 4)

    def test_local_at_snapshot(self):
        # The list dies when train() returns: the snapshot taken before that
        # is matched with the live set of its moment.
        clients.skip_unless(self, "torch")
        report, _, run_dir = self.run_client("local", "--host", "full")
        suspect = self.kept_by(report)
        top = suspect["kept_by"][0]
        self.assertRegex(top["hops"][0], r"^list `kept` \(40 items\), local in train \(retention_client\.py:\d+\)$")
        # The last step's output is also the local `out`: a path of its own.
        self.assertEqual(sum(k["objects"] for k in suspect["kept_by"]), 40, suspect["kept_by"])
        self.assertGreaterEqual(top["objects"], 39)
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertEqual(process["stats"]["retention"]["when"], "snapshot")

    def test_clean_and_switched_off(self):
        clients.skip_unless(self, "torch")
        report, _, run_dir = self.run_client("none")
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertEqual(process["leak_suspects"], [])
        self.assertEqual(process["stats"]["retention"]["when"], "exit")
        self.assertLess(process["stats"]["retention"]["seconds"], 30)
        report, _, run_dir = self.run_client("global", "--no-retention")
        self.assertEqual([f for f in os.listdir(run_dir) if f.startswith("retention.")], [])
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertIsNone(process["stats"]["retention"])
        self.assertTrue(process["leak_suspects"])
        self.assertEqual([s for s in process["leak_suspects"] if s.get("kept_by")], [])

    def test_fake_and_meta_tensors_are_left_alone(self):
        # torch.compile leaves fake tensors alive; their storage is on the
        # meta device and owns no memory. Asking one for its data pointer
        # prints a deprecation warning on the program's stderr (PyTorch 2.3
        # and later) and uses up a warning the program may want to see.
        clients.skip_unless(self, "torch")
        run_dir = os.path.join(self.tmpdir(), "run")
        env = mltest.clean_env(**clients.QUIET)
        proc = self.memledger("run", "-q", "-o", run_dir, "--host", "full", "--", clients.PYTHON_TORCH, SCRIPT,
                              "--keep", "global", "--fake", env=env, timeout=240)
        self.assertExit(proc, 0)
        self.assertIn("DONE", proc.stdout)
        self.assertNotIn("DATA_PTR OF A META STORAGE", proc.stderr)
        self.assertNotIn("FakeTensor", proc.stderr)
        report = self.load_report(run_dir)
        suspect = self.kept_by(report)
        self.assertEqual(suspect["kept_by"][0]["hops"][0],
                         "list `history` (40 items), global in __main__ (retention_client.py)")
        self.assertNotIn("fakes", json.dumps(suspect["kept_by"]))

    def walked_at_exit(self, script):
        """`script` run in full and in sampled mode, each with the walk at
        exit: (mode, the report's process) for each."""
        for mode in ("full", "sampled"):
            run_dir = os.path.join(self.tmpdir(), mode)
            proc = self.memledger("run", "-q", "-o", run_dir, "--host", mode, "--", "/usr/bin/python3", script,
                                  env=mltest.clean_env(), timeout=240)
            self.assertExit(proc, 0)
            process = self.load_report(run_dir)["processes"][0]
            self.assertEqual(process["stats"]["retention"]["when"], "exit", mode)
            yield mode, process

    def test_the_walk_is_not_the_programs_peak(self):
        # 300,000 tracked objects: the walk's list of them and their sorted
        # addresses take about 8 MiB at exit, after the program's own peak
        # (a 2 MiB buffer in every step). Sorted as one list of Python
        # integers, the addresses took 17.3 MiB.
        script = os.path.join(self.tmpdir(), "many_objects.py")
        with open(script, "w") as f:
            f.write(MANY_OBJECTS + textwrap.dedent("""
                for step in range(5):
                    buffer = bytearray(2 << 20)
                    del buffer
                    memledger.step()
                print("DONE")
            """))
        for mode, process in self.walked_at_exit(script):
            notes = [n for n in process["notes"] if n.startswith("memledger's own walk of the Python heap")]
            self.assertEqual(len(notes), 1, (mode, process["notes"]))
            held = re.search(r"held up to ([\d.]+) MiB", notes[0])
            self.assertIsNotNone(held, notes[0])
            self.assertGreater(float(held.group(1)), 4, notes[0])
            self.assertLess(float(held.group(1)), 12, notes[0])
            # The peak is the program's own: in a step, no more than the
            # largest step end and the step's buffer.
            peak = process["peak"]
            self.assertNotEqual(peak["phase"], "after the last step", (mode, peak))
            step_ends = max(sum(row["live"].values()) if isinstance(row["live"], dict) else row["live"]
                            for row in process["steps"])
            self.assertLess(peak["bytes"], step_ends + (3 << 20), (mode, peak, step_ends))

    def test_a_program_that_grows_to_its_end_peaks_in_its_last_step(self):
        # What follows the program's end (memledger's walk at exit, the
        # module it imports, the interpreter's teardown) is not its peak: a
        # program whose memory is highest at its end peaks in its last step.
        script = os.path.join(self.tmpdir(), "grow_to_end.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""
                import memledger
                kept = []
                for step in range(5):
                    kept.append(bytearray(1 << 20))
                    memledger.step()
                print("DONE")
            """))
        for mode, process in self.walked_at_exit(script):
            peak = process["peak"]
            self.assertEqual(peak["phase"], "in step 5", (mode, peak))
            last = process["steps"][-1]
            live = sum(last["live"].values()) if isinstance(last["live"], dict) else last["live"]
            self.assertLess(peak["bytes"], live + (1 << 20), (mode, peak, live))

    def test_the_walk_leaves_nothing_behind(self):
        # The walk's lists (every tracked object, their sorted addresses)
        # must go when it ends: left to a reference cycle, 300,000 objects'
        # worth (5.4 MiB) stayed until the program's next collection and
        # counted as the program's, at a snapshot or between the walk at
        # exit and the end.
        script = os.path.join(self.tmpdir(), "after_walk.py")
        with open(script, "w") as f:
            f.write(MANY_OBJECTS + textwrap.dedent("""
                import json

                memledger.snapshot()  # the first one imports what the walk needs
                before = memledger.live().live["host"]
                memledger.snapshot()
                after = memledger.live().live["host"]
                print("GROWTH", json.dumps(after - before))
            """))
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.memledger("run", "-q", "-o", run_dir, "--host", "full", "--", "/usr/bin/python3", script,
                              env=mltest.clean_env(), timeout=240)
        self.assertExit(proc, 0)
        growth = int(re.search(r"GROWTH (-?\d+)", proc.stdout).group(1))
        self.assertLess(growth, 256 << 10, proc.stdout)

    def test_the_search_in_c_finds_what_python_finds(self):
        clients.skip_unless(self, "torch")
        script = os.path.join(self.tmpdir(), "both_searches.py")
        with open(script, "w") as f:
            f.write(BOTH_SEARCHES)
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.memledger("run", "-q", "-o", run_dir, "--no-report", "--", clients.PYTHON_TORCH, script,
                              env=mltest.clean_env(), timeout=240)
        self.assertExit(proc, 0)
        self.assertIn("C_SEARCH true", proc.stdout)
        self.assertIn("UNTRACKED [false, false, false]", proc.stdout)
        self.assertIn("REGISTERED [true, true]", proc.stdout)
        walks = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^WALK (\w+) (.*)$", proc.stdout, re.M)}
        self.assertEqual(sorted(walks), ["c", "overflow", "python"])
        whats = sorted(o[2].split(" ")[0] for o in walks["python"])
        # Every large owner, once each; not the small bytes, nor a subclass
        # of bytes (bytes are recognised by their exact type). The view
        # stands for its base, which only the view holds.
        self.assertEqual(whats, [*["Tensor"] * 14, "bytearray", "bytes", "bytes", *["ndarray"] * 14],
                         walks["python"])
        views = [o for o in walks["python"] if o[2].startswith("ndarray view")]
        self.assertEqual([(o[1], o[2], o[3]) for o in views],
                         [(240000, "ndarray view (float64[29990]) of ndarray (float64[30000])", "view")], views)
        # Those in untracked containers, by the container's name.
        roots = {(o[3], json.dumps(o[5])) for o in walks["python"] if o[2].startswith(("ndarray (float64[9", "bytes (8"))}
        self.assertEqual(roots, {("a0", '[{"what": "dict (3 items)", "name": "cache", "root": "global in __main__ (both_searches.py)"}]'),
                                 ("a1", '[{"what": "dict (3 items)", "name": "cache", "root": "global in __main__ (both_searches.py)"}]'),
                                 ("a2", '[{"what": "dict (3 items)", "name": "cache", "root": "global in __main__ (both_searches.py)"}]'),
                                 ("blob", '[{"what": "dict (1 items)", "name": "blobs", "root": "global in __main__ (both_searches.py)"}]')},
                         walks["python"])
        pairs = [o for o in walks["python"] if o[2].startswith(("ndarray (float64[12", "ndarray (float64[13"))]
        self.assertEqual(sorted(json.dumps(o[5]) for o in pairs),
                         ['[{"what": "tuple (2 items)", "name": "[%d]"}, {"what": "list (2 items)", "name": "batches", '
                          '"root": "global in __main__ (both_searches.py)"}]' % i for i in (0, 0, 1, 1)], pairs)
        self.assertEqual(walks["c"], walks["python"])
        self.assertEqual(walks["overflow"], walks["python"])

    def run_numpy(self, name, source):
        """Runs a NumPy script under memledger run; its run folder and text report."""
        clients.skip_unless(self, "torch")  # its interpreter has NumPy
        script = os.path.join(self.tmpdir(), name)
        with open(script, "w") as f:
            f.write(source)
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.memledger("run", "-q", "-o", run_dir, "--", clients.PYTHON_TORCH, script,
                              env=mltest.clean_env(), timeout=240)
        self.assertExit(proc, 0)
        with open(os.path.join(run_dir, "report.txt")) as f:
            return run_dir, f.read()

    def test_a_dict_of_numpy_arrays(self):
        _, text = self.run_numpy("numpy_cache.py", NUMPY_CACHE)
        self.assertIn("     kept by: dict `cache` (40 items), global in __main__ (numpy_cache.py)\n"
                      "         ← ndarray (float64[64, 1024])  (40 objects, 20.0 MiB)\n", text)

    def test_views_keep_their_base(self):
        run_dir, text = self.run_numpy("numpy_views.py", NUMPY_VIEWS)
        self.assertIn("     kept by: list `history` (40 items), global in __main__ (numpy_views.py)\n"
                      "         ← ndarray view (float64[2, 1024]) of ndarray (float64[64, 1024])"
                      "  (40 objects, 20.0 MiB)\n", text)
        retention = [f for f in os.listdir(run_dir) if f.startswith("retention.")]
        with open(os.path.join(run_dir, retention[0])) as f:
            owners = json.load(f)["owners"]
        # The array a global holds is its own owner, not the view of it.
        kept = [o for o in owners if o["bytes"] == 64 * 1024 * 8 and o["name"] in ("kept", "also")]
        self.assertEqual([(o["what"], o["name"]) for o in kept], [("ndarray (float64[64, 1024])", "kept")], owners)

    def test_keras_callback_keeps_logits(self):
        # Eager tensors and variables give their buffer's address through
        # DLPack (no copy); the callback is reached from the module-level
        # list the client passed to fit.
        clients.skip_unless(self, "tensorflow")
        # Sampled mode (full host mode is slow with TensorFlow) records every
        # block of the sample interval or more: 500 KiB blocks, all of them.
        report, text, _ = self.run_client("both", python=clients.PYTHON_ML, script=KERAS)
        suspects = self.kept_by(report, count=2)
        by_line = {}
        for suspect in suspects:
            for mode in ("logits", "variables"):
                if "retention_keras_client.py:%d" % leak_line(mode, KERAS) in frames(suspect):
                    by_line[mode] = suspect
        self.assertEqual(sorted(by_line), ["logits", "variables"], [frames(s)[:12] for s in suspects])
        root = ["list `callbacks` (2 items), global in __main__ (retention_keras_client.py)", "KeepLogits object"]
        top = by_line["logits"]["kept_by"][0]
        self.assertEqual(top["hops"], root + ["attribute `kept`: list (20 items)", "tf.Tensor (float32[128, 1000])"])
        self.assertEqual(top["objects"], 20)
        self.assertEqual(top["bytes"], 20 * 128 * 1000 * 4)
        top = by_line["variables"]["kept_by"][0]
        self.assertEqual(top["hops"][:3], root + ["attribute `copies`: list (20 items)"])
        self.assertRegex(top["hops"][3], r"^tf\.Variable `Variable(_\d+)?:0` \(float32\[128, 1000\]\)$")
        self.assertEqual(top["objects"], 20)
        self.assertIn("     kept by: list `callbacks` (2 items), global in __main__ (retention_keras_client.py)\n"
                      "         ← KeepLogits object\n"
                      "         ← attribute `kept`: list (20 items)\n", text)

    def test_jax_outputs_in_a_global_dict(self):
        clients.skip_unless(self, "jax")
        report, text, _ = self.run_client("global", python=clients.PYTHON_ML, script=JAX)
        suspect = self.kept_by(report)
        # Made on XLA's thread: attributed to the main thread's line of the moment.
        self.assertIn("retention_jax_client.py:%d" % leak_line("output", JAX), frames(suspect))
        top = suspect["kept_by"][0]
        self.assertEqual(top["hops"], ["dict `outputs` (20 items), global in __main__ (retention_jax_client.py)",
                                       "jax.Array (float32[256, 512])"])
        # Sampled mode records every block of the sample interval or more;
        # an output that XLA made while the main thread was elsewhere (the
        # first step's, compiled then) belongs to another site.
        self.assertGreaterEqual(top["objects"], 12)
        self.assertEqual(top["bytes"], top["objects"] * 256 * 512 * 4)
        self.assertIn("     kept by: dict `outputs` (20 items), global in __main__ (retention_jax_client.py)\n", text)

    def test_jax_outputs_in_a_local_dict(self):
        clients.skip_unless(self, "jax")
        report, _, _ = self.run_client("local", "--host", "full", python=clients.PYTHON_ML, script=JAX)
        suspect = self.kept_by(report)
        top = suspect["kept_by"][0]
        self.assertRegex(top["hops"][0],
                         r"^dict `outputs` \(20 items\), local in train_local \(retention_jax_client\.py:\d+\)$")
        self.assertEqual(top["hops"][1], "jax.Array (float32[256, 512])")
        self.assertGreaterEqual(top["objects"], 12)


class RetentionAtSigterm(clients.ClientTestCase):
    """The walk at SIGTERM, and that SIGTERM still ends the process."""

    def start(self, block, env, memledger_run=None):
        """Starts the client (under `memledger run -o memledger_run` when
        given, else as env says), waits for its READY line, and returns
        (process, client pid)."""
        command = [clients.PYTHON_TORCH, SIGTERM, "--block", block]
        if memledger_run is not None:
            command = [mltest.MEMLEDGER, "run", "-q", "-o", memledger_run, "--host", "full", "--"] + command
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.addCleanup(self.reap, proc)
        line = proc.stdout.readline()
        if not line.startswith("READY "):
            proc.kill()
            self.fail(line + proc.communicate()[1])
        return proc, int(line.split()[1])

    @staticmethod
    def reap(proc):
        if proc.poll() is None:
            mltest.kill_session(proc.pid)
        proc.communicate()

    def terminate(self, proc, pid):
        """Sends SIGTERM to the client; (exit status, seconds to exit, the
        rest of its output)."""
        start = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        return proc.returncode, time.monotonic() - start, out

    def test_kept_by_at_sigterm(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        env = mltest.clean_env(MEMLEDGER_RETENTION_BUDGET="30")
        proc, pid = self.start("none", env, memledger_run=run_dir)
        status, _, _ = self.terminate(proc, pid)
        self.assertEqual(status, 128 + signal.SIGTERM)  # memledger run's status for a child killed by SIGTERM
        report = self.load_report(run_dir)
        self.assertEqual(report["verdict"]["kind"], "signal", report["verdict"])
        self.assertIn("SIGTERM", report["verdict"]["summary"])
        process = report["processes"][report["job"]["rows"][0]["process"]]
        self.assertEqual(process["stats"]["retention"]["when"], "sigterm")
        with_paths = [s for s in process["leak_suspects"] if s.get("kept_by")]
        self.assertEqual(len(with_paths), 1, process["leak_suspects"])
        self.assertIn("retention_sigterm_client.py:%d" % leak_line("history", SIGTERM), frames(with_paths[0]))
        top = with_paths[0]["kept_by"][0]
        self.assertRegex(top["hops"][0], r"^list `history` \(\d+ items\), global in __main__ "
                                         r"\(retention_sigterm_client\.py\)$")
        self.assertEqual(top["hops"][1], "bytearray (262144)")
        self.assertGreaterEqual(top["objects"], 20)

    def raw_env(self, run_dir):
        """What `memledger run` sets for a traced Python program, without
        it: the parent sees the program's own exit status."""
        package = os.environ.get("MLTEST_PYTHON_PACKAGE", str(mltest.SOURCE_DIR / "tools" / "python"))
        boot = os.path.join(package, "memledger", "_boot")
        return mltest.clean_env(LD_PRELOAD=mltest.LIBRARY, MEMLEDGER_DIR=run_dir, PYTHONPATH="%s:%s" % (boot, package))

    def test_status_is_still_sigterm(self):
        run_dir = os.path.join(self.tmpdir(), "raw")
        proc, pid = self.start("none", self.raw_env(run_dir))
        status, _, _ = self.terminate(proc, pid)
        self.assertEqual(status, -signal.SIGTERM)
        self.assertEqual([f for f in os.listdir(run_dir) if f.startswith("retention.")], ["retention.%d.json" % pid])

    def test_program_sees_the_default_and_its_handler_wins(self):
        # What Lightning does: install its SIGTERM handler only where none is.
        program = ("import os, signal, sys\n"
                   "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)\n"
                   "def own(signum, frame):\n"
                   "    print('OWN', flush=True)\n"
                   "    sys.exit(3)\n"
                   "print(signal.signal(signal.SIGTERM, own) is signal.SIG_DFL, flush=True)\n"
                   "print(signal.getsignal(signal.SIGTERM) is own, flush=True)\n"
                   "os.kill(os.getpid(), signal.SIGTERM)\n")
        for env in (mltest.clean_env(), self.raw_env(os.path.join(self.tmpdir(), "raw"))):
            proc = self.run_cmd([clients.PYTHON_TORCH, "-c", program], env=env)
            self.assertEqual((proc.returncode, proc.stdout), (3, "True\nTrue\nTrue\nOWN\n"), proc.stderr)
        # The walk ran at exit, not at the signal.
        run_dir = os.path.join(self.tmpdir(), "raw")
        self.run_cmd([clients.PYTHON_TORCH, "-c", program], env=self.raw_env(run_dir))
        files = [f for f in os.listdir(run_dir) if f.startswith("retention.")]
        self.assertEqual(len(files), 1)
        with open(os.path.join(run_dir, files[0])) as f:
            self.assertEqual(json.load(f)["when"], "exit")

    def test_blocked_in_native_code(self):
        # Untraced, SIGTERM ends the blocked program at once; traced, its
        # Python handler cannot run, and the deadline ends it, by SIGTERM.
        proc, pid = self.start("native", mltest.clean_env())
        status, _, _ = self.terminate(proc, pid)
        self.assertEqual(status, -signal.SIGTERM)
        run_dir = os.path.join(self.tmpdir(), "raw")
        proc, pid = self.start("native", self.raw_env(run_dir))
        time.sleep(0.5)  # from READY to the wait: one call
        status, seconds, out = self.terminate(proc, pid)
        self.assertEqual(status, -signal.SIGTERM)
        self.assertNotIn("NOT_REACHED", out)
        self.assertGreaterEqual(seconds, 1.5)  # the deadline: 2 s after the signal
        self.assertLess(seconds, 10)
        self.assertEqual([f for f in os.listdir(run_dir) if f.startswith("retention.")], [])


if __name__ == "__main__":
    mltest.main()
