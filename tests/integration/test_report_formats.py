"""The report's formats on real runs: the JSON report against golden files
(stable fields only), the pprof profile parsed back with the protobuf
library (profile.proto compiled by protoc at test time), folded stacks, the
Chrome trace, and the whole-job view of a run with several ranks.

Regenerate the golden files after an intended change of the report:

    MLTEST_UPDATE_GOLDEN=1 meson test -C build test_report_formats

and review the diff of tests/data/golden/.
"""

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import mltest

GOLDEN_DIR = mltest.SOURCE_DIR / "tests" / "data" / "golden"
PROFILE_PROTO = mltest.SOURCE_DIR / "report" / "proto" / "profile.proto"
UPDATE = os.environ.get("MLTEST_UPDATE_GOLDEN") == "1"

STEPS = 12
LEAK = 4096


# --- Golden JSON: the stable fields ------------------------------------------------


def stable_frames(stack, own_files):
    """The frames of the program's own source files: function and file name.
    Frames of libc, the loader and libstdc++ differ between machines; line
    numbers move with every edit of the program (the planted line is checked
    against its source apart)."""
    return [{"function": f["function"], "file": os.path.basename(f["file"])}
            for f in stack if os.path.basename(f["file"]) in own_files]


def stable_site(site):
    return re.sub(r":\d+$", ":LINE", site)


def planted_line(source):
    """The line of a test program that carries the "PLANTED LEAK" comment."""
    with open(source) as f:
        lines = [i for i, text in enumerate(f, 1) if re.search(r"//\s*PLANTED LEAK\s*$", text)]
    assert len(lines) == 1, "%s: %d PLANTED LEAK lines" % (source, len(lines))
    return lines[0]


def stable_process(p, own_files):
    steps = p["steps"]
    base = steps[0]["live"]["host"] if steps else 0
    out = {
        "host_mode": p["host_mode"],
        "rank": p["rank"],
        "step_source": p["step_source"],
        "warmup_steps": p["warmup_steps"],
        # Step 1 also holds the start-up allocations of libc and the loader.
        "steps": [{"index": s["index"], "source": s["source"], "label": s["label"],
                   "host_live_since_step_1": s["live"]["host"] - base,
                   "allocations": s["allocations"] if s["index"] > 1 else None,
                   "frees": s["frees"] if s["index"] > 1 else None} for s in steps],
        "leak_suspects": [{"kind": s["kind"], "site": stable_site(s["site"]), "bytes_per_step": s["bytes_per_step"],
                           "allocations_per_step": s["allocations_per_step"], "first_step": s["first_step"],
                           "monotonicity": round(s["monotonicity"], 3), "r_squared": round(s["r_squared"], 3),
                           "live_at_end": s["live_at_end"], "series": s["series"],
                           "stack": stable_frames(s["stack"], own_files)} for s in p["leak_suspects"]],
        "exit_leaks": {"bytes": p["exit_leaks"]["bytes"], "count": p["exit_leaks"]["count"],
                       "sites": [{"site": stable_site(s["site"]), "bytes": s["bytes"], "count": s["count"]}
                                 for s in p["exit_leaks"]["sites"]]},
        "peak": {"step": p["peak"]["step"], "kind": p["peak"]["kind"]},
        "verdict": {k: p["verdict"][k] for k in ("kind", "summary", "exit_code", "signal")},
    }
    return out


def normalize_pids(text, report):
    for p in sorted(report["processes"], key=lambda q: -len(str(q["pid"]))):
        text = re.sub(r"\b%d\b" % p["pid"], "PID", text)
    return text


def stable_report(report, own_files):
    """What a golden file holds: every process with steps (sorted by rank,
    then command) and the whole-job table, with pids, paths, times and
    addresses left out. A launcher's own memory (a shell, an image before
    exec) depends on the environment and the paths: only its role is kept."""
    processes = sorted((p for p in report["processes"] if p["steps"]), key=lambda p: (p["rank"], p["command"]))
    job = report["job"]
    rows = [{k: r[k] for k in ("steps", "suspects", "suspect_bytes_per_step", "verdict_kind")}
            | {"label": normalize_pids(r["label"], report), "role": normalize_pids(r["role"], report),
               "top_site": stable_site(r["top_site"]),
               "exit_leak_bytes": r["exit_leak_bytes"] if r["steps"] else None}
            for r in job["rows"]]
    return {
        "schema": report["schema"],
        "schema_version": report["schema_version"],
        "processes": [stable_process(p, own_files) for p in processes],
        "job": {"rows": rows, "conclusion": re.sub(r":\d+;", ":LINE;", normalize_pids(job["conclusion"], report)),
                "growing": len(job["growing"])},
    }


class Golden(mltest.TestCase):
    def check_golden(self, name, stable):
        path = GOLDEN_DIR / (name + ".json")
        text = json.dumps(stable, indent=2, sort_keys=True) + "\n"
        if UPDATE:
            GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print("test_report_formats: wrote %s" % path, file=sys.stderr)
            return
        self.assertTrue(path.exists(), "no golden file %s: run with MLTEST_UPDATE_GOLDEN=1" % path)
        self.assertEqual(json.loads(path.read_text()), json.loads(text),
                         "the report differs from %s (regenerate with MLTEST_UPDATE_GOLDEN=1 if intended)" % path)

    def test_leak_steps_full_mode(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [mltest.program("leak_steps"), str(STEPS), str(LEAK)])
        self.assertExit(proc, 0)
        report = self.load_report(run_dir)
        stable = stable_report(report, {"leak_steps.cpp"})
        # The planted figures, whatever the golden file says.
        self.assertEqual(mltest.site_parts(report["leak_suspects"][0]["site"]),
                         ("plant_leak", "leak_steps.cpp",
                          planted_line(mltest.SOURCE_DIR / "tests" / "programs" / "leak_steps.cpp")))
        suspect = stable["processes"][0]["leak_suspects"][0]
        self.assertEqual(suspect["bytes_per_step"], LEAK)
        self.assertEqual(suspect["series"][-1] - suspect["series"][0], LEAK * (STEPS - 1))
        self.check_golden("leak_steps", stable)

    def test_train_leak_example(self):
        run_dir = os.path.join(self.tmpdir(), "run")
        proc = self.traced(run_dir, [mltest.program("train_leak")])
        self.assertExit(proc, 0)
        report = self.load_report(run_dir)
        stable = stable_report(report, {"train_leak.cpp"})
        self.assertEqual(mltest.site_parts(report["leak_suspects"][0]["site"])[0], "record_history")
        self.check_golden("train_leak", stable)


# --- Ranks: the whole-job view -------------------------------------------------------

def run_ranks(test, run_dir, leaks):
    """One leak_steps per rank, started by a shell as a launcher would, with
    RANK and WORLD_SIZE set; leaks[i] bytes/step for rank i."""
    script = " ".join("RANK=%d WORLD_SIZE=%d %s %d %d &" % (i, len(leaks), mltest.program("leak_steps"), STEPS, leak)
                      for i, leak in enumerate(leaks)) + " wait"
    proc = test.traced(run_dir, ["/bin/sh", "-c", script])
    assert proc.returncode == 0, test.describe(proc)
    return proc


class WholeJob(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.run_dir = os.path.join(cls.class_tmpdir(), "ranks")
        run_ranks(cls, cls.run_dir, [0, 8192, 0])
        cls.report = cls.load_report(cls.run_dir)

    def test_one_row_per_process_and_the_growing_rank(self):
        job = self.report["job"]
        ranks = {p["rank"]: p for p in self.report["processes"] if p["rank"]}
        self.assertEqual(sorted(ranks), ["0", "1", "2"])
        self.assertEqual(len(job["rows"]), len(self.report["processes"]))
        self.assertEqual(job["rows"][0]["role"], "root")
        growing = [self.report["processes"][i] for i in job["growing"]]
        self.assertEqual([p["rank"] for p in growing], ["1"])
        self.assertTrue(job["conclusion"].startswith("rank 1 (pid %d) grows fastest: 8.0 KiB/step" % ranks["1"]["pid"]),
                        job["conclusion"])
        # sh forks each rank, which then execs leak_steps: two images per rank.
        self.assertIn("1 of 7 processes grows", job["conclusion"])
        by_rank = {r["label"].split(" (")[0]: r for r in job["rows"]}
        self.assertAlmostEqual(by_rank["rank 1"]["live_growth_per_step"], 8192, delta=64)
        self.assertAlmostEqual(by_rank["rank 0"]["live_growth_per_step"], 0, delta=64)
        self.assertIn("rank 1 of 3", by_rank["rank 1"]["role"])

    def test_text_report_has_the_table(self):
        with open(os.path.join(self.run_dir, "report.txt")) as f:
            text = f.read()
        self.assertIn("whole job: rank 1 (pid", text)
        self.assertRegex(text, r"rank 1 \(pid \d+\)\s+%d\s+[\d.]+ \w+\s+8\.0 KiB/step\s+1 " % STEPS)

    def test_golden(self):
        Golden.check_golden(self, "ranks", stable_report(self.report, {"leak_steps.cpp"}))

    def test_summary_line_names_the_growing_rank(self):
        # The launcher (here a shell) is the root and grows nothing: the
        # summary line `memledger run` prints at the end gives the whole
        # job's verdict, not the root's alone.
        run_dir = os.path.join(self.tmpdir(), "ranks-summary")
        script = " ".join("RANK=%d WORLD_SIZE=2 %s %d %d &" % (i, mltest.program("leak_steps"), STEPS, leak)
                          for i, leak in enumerate([0, 8192])) + " wait"
        proc = self.memledger("run", "-o", run_dir, "--host", "full", "--", "/bin/sh", "-c", script)
        self.assertExit(proc, 0)
        lines = [l for l in proc.stderr.splitlines() if l.startswith("memledger: ") and " steps (" in l]
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertRegex(lines[0], r"; whole job: rank 1 \(pid \d+\) grows fastest: 8\.0 KiB/step in 1 suspect, "
                                   r"top site .*leak_steps\.cpp:\d+; 1 of 5 processes grows$")
        self.assertNotIn("no growth suspects", proc.stderr)

    def test_fork_exec_roles(self):
        # A fork that lands while the trace writer is inside dl_iterate_phdr can
        # hang the child (test_fork_deadlock.py): up to three tries, as test_processes.
        for _ in range(3):
            run_dir = tempfile.mkdtemp(prefix="forker-", dir=self.tmpdir())
            try:
                proc = self.traced(run_dir, [mltest.program("forker"), mltest.program("leak_steps"), "6", "1000"],
                                   timeout=20)
                break
            except subprocess.TimeoutExpired:
                print("test_report_formats: forker hung (known fork/dl_iterate_phdr deadlock), retrying",
                      file=sys.stderr)
        else:
            self.fail("forker hung three times under memledger")
        self.assertExit(proc, 0)
        report = self.load_report(run_dir)
        roles = sorted(re.sub(r"\d+", "N", r["role"]) for r in report["job"]["rows"])
        self.assertEqual(roles, ["child of pid N", "child of pid N", "child of pid N, image N of N (exec)",
                                 "child of pid N, image N of N (exec)", "root"])


# --- Exports -----------------------------------------------------------------------


def protobuf_python():
    """An interpreter that can import google.protobuf (this one, or Debian's
    python3 with python3-protobuf), or None."""
    for exe in (sys.executable, "/usr/bin/python3"):
        if exe and os.path.exists(exe) and subprocess.run(
                [exe, "-c", "import google.protobuf"], capture_output=True).returncode == 0:
            return exe
    return None


# Runs in the interpreter that has the protobuf library: reads a pprof file
# and prints it as JSON (sample types, samples with their stacks and labels).
PPROF_TO_JSON = r"""
import gzip, json, sys
sys.path.insert(0, sys.argv[1])
import profile_pb2
p = profile_pb2.Profile()
p.ParseFromString(gzip.decompress(open(sys.argv[2], "rb").read()))
s = lambda i: p.string_table[i]
fn = {f.id: (s(f.name), s(f.filename)) for f in p.function}
loc = {l.id: l for l in p.location}
maps = {m.id: m for m in p.mapping}
out = {"sample_types": [[s(t.type), s(t.unit)] for t in p.sample_type],
       "default": s(p.default_sample_type), "comments": [s(c) for c in p.comment],
       "samples": [], "location_ids_unique": len(loc) == len(p.location),
       "mappings_ok": all(l.mapping_id == 0 or l.mapping_id in maps for l in p.location)}
for smp in p.sample:
    frames = []
    for i in smp.location_id:
        for line in loc[i].line:
            name, filename = fn[line.function_id]
            frames.append([name, filename, line.line])
    labels = {s(l.key): (s(l.str) if l.str else l.num) for l in smp.label}
    out["samples"].append({"values": list(smp.value), "frames": frames, "labels": labels})
print(json.dumps(out))
"""


class Exports(mltest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.run_dir = os.path.join(cls.class_tmpdir(), "run")
        proc = cls.traced(cls.run_dir, [mltest.program("leak_steps"), str(STEPS), str(LEAK)])
        assert proc.returncode == 0, cls.describe(proc)
        cls.report = cls.load_report(cls.run_dir)

    def export(self, fmt, *extra):
        out = os.path.join(self.tmpdir(), "out." + fmt)
        proc = self.memledger("report", self.run_dir, "--format", fmt, "-o", out, *extra)
        self.assertExit(proc, 0)
        with open(out, "rb") as f:
            return f.read()

    def test_pprof_reads_back(self):
        data = self.export("pprof")
        self.assertEqual(data[:2], b"\x1f\x8b", "not gzip")
        python = protobuf_python()
        protoc = shutil.which("protoc")
        if python is None or protoc is None:
            self.skipTest("SKIP: needs protoc and the Python protobuf library (protobuf-compiler, python3-protobuf)")
        gen = self.tmpdir()
        subprocess.run([protoc, "--proto_path=%s" % PROFILE_PROTO.parent, "--python_out=%s" % gen, str(PROFILE_PROTO)],
                       check=True)
        path = os.path.join(gen, "profile.pb.gz")
        with open(path, "wb") as f:
            f.write(data)
        proc = subprocess.run([python, "-c", PPROF_TO_JSON, gen, path], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        prof = json.loads(proc.stdout)
        self.assertEqual(prof["sample_types"], [["peak_objects", "count"], ["peak_space", "bytes"],
                                                ["exit_objects", "count"], ["exit_space", "bytes"]])
        self.assertEqual(prof["default"], "peak_space")
        self.assertTrue(prof["location_ids_unique"])
        self.assertTrue(prof["mappings_ok"])
        samples = prof["samples"]
        # The peak's live set adds up to the peak; the end's to what was live at the end.
        self.assertEqual(sum(s["values"][1] for s in samples), self.report["peak"]["bytes"])
        self.assertEqual(sum(s["values"][3] for s in samples),
                         self.report["exit_leaks"]["bytes"] + self.report["startup_allocations"]["bytes"])
        self.assertEqual(sum(s["values"][2] for s in samples),
                         self.report["exit_leaks"]["count"] + self.report["startup_allocations"]["count"])
        leak = [s for s in samples if any(mltest.function_base(f[0]) == "plant_leak" for f in s["frames"])]
        self.assertEqual(len(leak), 1)
        self.assertEqual(leak[0]["values"][2:], [STEPS, STEPS * LEAK])
        self.assertEqual(leak[0]["labels"]["kind"], "host")
        self.assertEqual(leak[0]["labels"]["pid"], self.report["pid"])
        names = [mltest.function_base(f[0]) for f in leak[0]["frames"]]
        self.assertLess(names.index("plant_leak"), names.index("main"), "leaf first")
        planted = [f for f in leak[0]["frames"] if mltest.function_base(f[0]) == "plant_leak"][0]
        self.assertEqual(os.path.basename(planted[1]), "leak_steps.cpp")
        self.assertGreater(planted[2], 0)

    def test_pprof_with_go_tool(self):
        go = shutil.which("go")
        if go is None:
            self.skipTest("SKIP: go is not installed (go tool pprof)")
        path = os.path.join(self.tmpdir(), "heap.pb.gz")
        with open(path, "wb") as f:
            f.write(self.export("pprof"))
        proc = self.run_cmd([go, "tool", "pprof", "-sample_index=exit_space", "-top", path], timeout=120)
        self.assertExit(proc, 0)
        self.assertIn("plant_leak", proc.stdout)

    def test_folded(self):
        peak = self.export("folded").decode()
        end = self.export("collapsed", "--at", "end").decode()
        for text, total in ((peak, self.report["peak"]["bytes"]),
                            (end, self.report["exit_leaks"]["bytes"] + self.report["startup_allocations"]["bytes"])):
            lines = text.splitlines()
            self.assertTrue(lines)
            values = []
            for line in lines:
                m = re.fullmatch(r"(\[host\](?:;[^;]+)*) (\d+)", line)
                self.assertIsNotNone(m, line)
                values.append(int(m.group(2)))
            self.assertEqual(sum(values), total)
        leak = [l for l in end.splitlines() if ";(anonymous namespace)::plant_leak(" in l]
        self.assertEqual(len(leak), 1, end)
        self.assertTrue(leak[0].endswith(" %d" % (STEPS * LEAK)))
        frames = leak[0].rsplit(" ", 1)[0].split(";")
        self.assertLess(frames.index("main"), [i for i, f in enumerate(frames) if "plant_leak" in f][0], "root first")

    def test_chrome_trace(self):
        trace = json.loads(self.export("chrome"))
        events = trace["traceEvents"]
        pid = self.report["pid"]
        slices = [e for e in events if e["ph"] == "X"]
        self.assertEqual([e["name"] for e in slices], ["step %d train" % i for i in range(1, STEPS + 1)])
        for a, b in zip(slices, slices[1:]):
            self.assertAlmostEqual(a["ts"] + a["dur"], b["ts"], places=3)
        live = [e for e in events if e["ph"] == "C" and e["name"] == "live bytes"]
        self.assertEqual([e["args"]["host"] for e in live], [s["live"]["host"] for s in self.report["steps"]])
        names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
        self.assertEqual([e["pid"] for e in names], [pid])
        self.assertTrue(all(e["pid"] == pid for e in events))
        verdict = [e for e in events if e["ph"] == "i" and e["cat"] == "verdict"]
        self.assertEqual(verdict[0]["args"]["summary"], "clean exit (code 0)")

    def test_bad_format_and_binary_to_terminal(self):
        proc = self.memledger("report", self.run_dir, "--format", "svg")
        self.assertExit(proc, 2)
        self.assertIn("--format must be text, json, html, pprof, folded or chrome, not 'svg'", proc.stderr)
        proc = self.memledger("report", self.run_dir, "--format", "folded", "--at", "middle")
        self.assertExit(proc, 2)
        self.assertIn("--at must be peak, end or growth", proc.stderr)


if __name__ == "__main__":
    mltest.main()
