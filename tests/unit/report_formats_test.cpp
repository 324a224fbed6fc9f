// The report's renderers and exports: HTML escaping, folded stacks, the pprof
// profile (parsed back with libprotobuf), the Chrome trace, the whole-job
// table, and the live sets at the peak and at the end they are built from.
#include <zlib.h>

#include <catch2/catch.hpp>

#include "chrome_trace.h"
#include "folded.h"
#include "html_report.h"
#include "job_report.h"
#include "pprof.h"
#include "profile.pb.h"
#include "trace_format.h"

using namespace memledger::report;

namespace {

Frame frame(const std::string& function, const std::string& file, int line, uint64_t address, bool inlined = false) {
  Frame f;
  f.function = function;
  f.file = file;
  f.line = line;
  f.address = address;
  f.module = "/opt/app/train";
  f.inlined = inlined;
  return f;
}

SiteTotal site(uint32_t stack, int64_t bytes, uint64_t count, std::vector<Frame> frames, uint8_t kind = 0) {
  SiteTotal t;
  t.site.stack = stack;
  t.site.kind = kind;
  t.site.frames = std::move(frames);
  t.bytes = bytes;
  t.count = count;
  return t;
}

// Innermost first, as the symbolizer gives them.
std::vector<Frame> leak_stack() {
  return {frame("malloc", "", 0, 0x1000), frame("plant_leak", "train.cpp", 44, 0x2000),
          frame("main", "train.cpp", 90, 0x3000)};
}

ProcessReport process(int pid, const std::string& rank, int64_t growth) {
  ProcessReport p;
  p.pid = pid;
  p.rank = rank;
  p.command = "train --rank " + rank;
  p.host_mode = "full";
  p.step_source = "marker";
  p.warmup_steps = 1;
  for (int k = 1; k <= 10; ++k) {
    StepStats s;
    s.index = k;
    s.source = "marker";
    s.end_ns = 1000000ull * k;
    s.live[0] = 100000 + growth * k;
    s.held_host = 400000;
    s.rss = 2000000;
    p.steps.push_back(s);
  }
  p.peak.bytes = 100000 + growth * 10;
  p.peak.step = 10;
  p.verdict.kind = "exit";
  p.verdict.summary = "clean exit (code 0)";
  p.live_at_peak = {site(1, 60000, 3, leak_stack()), site(2, 40000, 1, {frame("load", "io.cpp", 7, 0x4000)})};
  p.live_at_end = {site(1, 50000, 2, leak_stack())};
  if (growth > 0) {
    LeakSuspect s;
    s.site = site(1, 0, 0, leak_stack()).site;
    s.bytes_per_step = double(growth);
    s.allocations_per_step = 1;
    s.first_step = 1;
    s.monotonicity = 1;
    s.r_squared = 1;
    for (int k = 1; k <= 10; ++k) s.series.push_back(growth * k);
    p.leak_suspects.push_back(s);
  }
  return p;
}

RunReport one_process() {
  RunReport run;
  run.run_dir = "/runs/r1";
  run.command = {"train"};
  run.processes.push_back(process(100, "", 4096));
  return run;
}

std::string gunzip(const std::string& data) {
  z_stream z{};
  REQUIRE(inflateInit2(&z, 15 + 16) == Z_OK);
  std::string out(1 << 20, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&z, Z_FINISH);
  out.resize(z.total_out);
  inflateEnd(&z);
  REQUIRE(rc == Z_STREAM_END);
  return out;
}

}  // namespace

TEST_CASE("html_escape replaces markup characters and bad bytes", "[html]") {
  CHECK(html_escape("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;");
  CHECK(html_escape("\"><img src=x onerror='a()'>&") == "&quot;&gt;&lt;img src=x onerror=&#39;a()&#39;&gt;&amp;");
  CHECK(html_escape("operator<< (caf\xC3\xA9) \xE2\x82\xAC \xF0\x9F\x98\x80") ==
        "operator&lt;&lt; (caf\xC3\xA9) \xE2\x82\xAC \xF0\x9F\x98\x80");
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(html_escape("a\xFF" "b") == "a" + fffd + "b");             // not UTF-8
  CHECK(html_escape("\xC0\xAF") == fffd + fffd);                   // overlong '/'
  CHECK(html_escape("\xED\xA0\x80") == fffd + fffd + fffd);        // a surrogate
  CHECK(html_escape("\xE2\x82") == fffd + fffd);                   // cut short
  CHECK(html_escape(std::string("a\0b\x1b", 4)) == "a" + fffd + "b" + fffd);
  CHECK(html_escape("tab\tline\n") == "tab\tline\n");
}

TEST_CASE("the HTML page carries no markup from the trace", "[html]") {
  RunReport run = one_process();
  const std::string hostile = "<script>document.title='PWNED'</script>\"><img src=x onerror=alert(1)>";
  ProcessReport& p = run.processes[0];
  p.command = hostile;
  p.notes.push_back(hostile);
  p.verdict.summary = hostile;
  for (std::vector<Frame>* frames : {&p.leak_suspects[0].site.frames, &p.live_at_peak[0].site.frames}) {
    (*frames)[1].function = hostile;
    (*frames)[1].file = "/src/" + hostile + ".cpp";
  }
  run.command = {hostile};
  const std::string html = render_html(run);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("<img") == std::string::npos);
  CHECK(html.find("onerror=alert(1)&gt;") != std::string::npos);
  CHECK(html.find("&lt;script&gt;document.title=&#39;PWNED&#39;&lt;/script&gt;") != std::string::npos);
  // No script may run and nothing may load, even if escaping ever failed.
  CHECK(html.find("default-src 'none'") != std::string::npos);
}

TEST_CASE("the HTML page has the charts, tables and flame graphs", "[html]") {
  const std::string html = render_html(one_process());
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(html.find("Live and held bytes per step") != std::string::npos);
  CHECK(html.find("Fragmentation per step") != std::string::npos);
  CHECK(html.find("Host RSS against the limit") != std::string::npos);
  CHECK(html.find("step (source: marker)") != std::string::npos);
  CHECK(html.find("Live bytes at the peak (in step 10)") != std::string::npos);
  CHECK(html.find("Live bytes at the end") != std::string::npos);
  CHECK(html.find("plant_leak at train.cpp:44") != std::string::npos);
  CHECK(html.find("4.0 KiB") != std::string::npos);
  CHECK(html.find("http://") == std::string::npos);
  CHECK(html.find("https://") == std::string::npos);
}

TEST_CASE("Python frames come first, native frames are folded", "[html]") {
  RunReport run = one_process();
  std::vector<Frame>& frames = run.processes[0].leak_suspects[0].site.frames;
  Frame py = frame("train_step", "/work/train.py", 12, 0);
  py.module = "";
  frames.insert(frames.begin(), py);
  Frame frozen = frame("_find_and_load", "<frozen importlib._bootstrap>", 1007, 0);
  frozen.python = true;  // marked Python by the symbolizer, whatever its file is called
  frames.insert(frames.begin() + 1, frozen);
  CHECK(is_python_frame(frozen));
  const std::string html = render_html(run);
  const size_t py_at = html.find("<li class=\"py\"><span class=\"fn\">train_step</span> <span class=\"loc\">/work/train.py:12");
  CHECK(html.find("<li class=\"py\"><span class=\"fn\">_find_and_load</span> <span class=\"loc\">&lt;frozen importlib._bootstrap&gt;:1007") != std::string::npos);
  const size_t native_at = html.find("<details class=\"native\"><summary>native frames (3 frames)</summary>");
  REQUIRE(py_at != std::string::npos);
  REQUIRE(native_at != std::string::npos);
  CHECK(py_at < native_at);
}

TEST_CASE("flame paths: root first; Python frames, then native frames below the interpreter", "[folded]") {
  std::vector<Frame> native = leak_stack();
  std::vector<const Frame*> path = flame_path(native);
  REQUIRE(path.size() == 3);
  CHECK(path[0]->function == "main");
  CHECK(path[2]->function == "malloc");

  Frame interp = frame("_PyEval_EvalFrameDefault", "", 0, 0x9000);
  interp.module = "/usr/lib/libpython3.11.so.1.0";
  std::vector<Frame> mixed = {frame("train_step", "train.py", 12, 0), frame("<module>", "train.py", 30, 0),
                              frame("malloc", "", 0, 0x1000),         frame("list_append", "", 0, 0x1100),
                              interp,                                 frame("main", "", 0, 0x3000)};
  mixed[3].module = "/usr/lib/libpython3.11.so.1.0";
  path = flame_path(mixed);
  std::vector<std::string> names;
  for (const Frame* f : path) names.push_back(frame_label(*f));
  // list_append is the interpreter's module: the native part stops there.
  CHECK(names == std::vector<std::string>{"<module> (train.py:30)", "train_step (train.py:12)", "malloc"});
}

TEST_CASE("folded stacks: root first, one line per site, kind as the root frame", "[folded]") {
  RunReport run = one_process();
  CHECK(render_folded(run, Snapshot::kPeak) == "[host];main;plant_leak;malloc 60000\n[host];load 40000\n");
  CHECK(render_folded(run, Snapshot::kEnd) == "[host];main;plant_leak;malloc 50000\n");

  run.processes.push_back(process(200, "1", 0));
  run.processes[1].live_at_end[0].site.frames[1].function = "odd;name\nwith breaks";
  const std::string two = render_folded(run, Snapshot::kEnd);
  CHECK(two == "[pid 100];[host];main;plant_leak;malloc 50000\n[rank 1 pid 200];[host];main;odd,name?with breaks;malloc 50000\n");
}

TEST_CASE("pprof: a gzip'd profile.proto that reads back", "[pprof]") {
  RunReport run = one_process();
  // An inline chain: plant_leak's copy loop inlined at the same address.
  std::vector<Frame>& frames = run.processes[0].live_at_peak[0].site.frames;
  frames.insert(frames.begin() + 1, frame("copy_piece", "piece.h", 3, 0x2000, true));
  run.processes[0].live_at_end[0].site.frames = frames;

  const std::string gz = render_pprof(run);
  REQUIRE(gz.size() > 18);
  CHECK(static_cast<unsigned char>(gz[0]) == 0x1f);
  CHECK(static_cast<unsigned char>(gz[1]) == 0x8b);
  perftools::profiles::Profile prof;
  REQUIRE(prof.ParseFromString(gunzip(gz)));
  auto str = [&](int64_t i) { return prof.string_table(static_cast<int>(i)); };
  CHECK(str(0).empty());
  REQUIRE(prof.sample_type_size() == 4);
  CHECK(str(prof.sample_type(0).type()) == "peak_objects");
  CHECK(str(prof.sample_type(0).unit()) == "count");
  CHECK(str(prof.sample_type(1).type()) == "peak_space");
  CHECK(str(prof.sample_type(1).unit()) == "bytes");
  CHECK(str(prof.sample_type(3).type()) == "exit_space");
  CHECK(str(prof.default_sample_type()) == "peak_space");
  REQUIRE(prof.sample_size() == 2);

  std::map<uint64_t, const perftools::profiles::Location*> locations;
  for (const auto& l : prof.location()) locations[l.id()] = &l;
  std::map<uint64_t, std::string> functions;
  for (const auto& f : prof.function()) functions[f.id()] = str(f.name());
  bool leak_seen = false;
  for (const auto& s : prof.sample()) {
    REQUIRE(s.value_size() == 4);
    std::vector<std::string> leaf_first;
    for (uint64_t id : s.location_id()) {
      REQUIRE(locations.count(id) == 1);
      std::string names;
      for (const auto& line : locations[id]->line()) names += (names.empty() ? "" : "+") + functions.at(line.function_id());
      leaf_first.push_back(names);
    }
    if (leaf_first.front() == "malloc") {
      leak_seen = true;
      CHECK(leaf_first == std::vector<std::string>{"malloc", "copy_piece+plant_leak", "main"});
      CHECK(s.value(0) == 3);
      CHECK(s.value(1) == 60000);
      CHECK(s.value(2) == 2);
      CHECK(s.value(3) == 50000);
    } else {
      CHECK(leaf_first == std::vector<std::string>{"load"});
      CHECK(s.value(1) == 40000);
      CHECK(s.value(3) == 0);  // freed by the end
    }
    REQUIRE(s.label_size() >= 2);
    CHECK(str(s.label(0).key()) == "kind");
    CHECK(str(s.label(0).str()) == "host");
    CHECK(str(s.label(1).key()) == "pid");
    CHECK(s.label(1).num() == 100);
  }
  CHECK(leak_seen);
  REQUIRE(prof.mapping_size() == 1);
  CHECK(str(prof.mapping(0).filename()) == "/opt/app/train");
  CHECK(prof.mapping(0).has_functions());
  CHECK(prof.mapping(0).memory_start() == 0x1000);
  CHECK(prof.mapping(0).memory_limit() == 0x4001);  // load at 0x4000 is the highest address
  for (const auto& l : prof.location()) {
    CHECK(l.mapping_id() == 1);
    CHECK(l.address() >= prof.mapping(0).memory_start());
    CHECK(l.address() < prof.mapping(0).memory_limit());
  }
}

TEST_CASE("Chrome trace: a process track, steps as slices, counters per step", "[chrome]") {
  RunReport run = one_process();
  run.processes.push_back(process(200, "1", 0));
  run.processes[0].host = run.processes[1].host = "node1";
  run.processes[0].start_mono_ns = 5000000;
  run.processes[1].start_mono_ns = 7000000;
  const nlohmann::json trace = render_chrome_trace(run);
  size_t slices = 0, live_counters = 0, names = 0;
  double first_slice_of_200 = -1;
  for (const auto& e : trace["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name") ++names;
    if (ph == "X") {
      ++slices;
      if (e["pid"] == 200 && first_slice_of_200 < 0) first_slice_of_200 = e["ts"];
    }
    if (ph == "C" && e["name"] == "live bytes") {
      ++live_counters;
      CHECK(e["args"].contains("host"));
    }
  }
  CHECK(names == 2);
  CHECK(slices == 20);
  CHECK(live_counters == 20);
  CHECK(first_slice_of_200 == Approx(2000.0));  // started 2 ms after pid 100, on the same host
}

TEST_CASE("the whole-job table says which rank grows", "[job]") {
  RunReport run;
  run.processes.push_back(process(100, "", 0));
  run.processes[0].command = "torchrun train.py";
  run.processes.push_back(process(101, "0", 0));
  run.processes.push_back(process(102, "1", 8192));
  run.processes.push_back(process(103, "2", 0));
  for (size_t i = 1; i < 4; ++i) {
    run.processes[i].ppid = 100;
    run.processes[i].world_size = "3";
  }
  run.root = 0;
  const JobSummary job = summarize_job(run);
  REQUIRE(job.rows.size() == 4);
  CHECK(job.rows[0].role == "root");
  CHECK(job.rows[1].label == "rank 0 (pid 101)");
  CHECK(job.rows[2].role == "child of pid 100, rank 1 of 3");
  REQUIRE(job.growing.size() == 1);
  CHECK(job.rows[job.growing[0]].index == 2);
  CHECK(job.rows[2].live_growth_per_step == Approx(8192));
  CHECK(job.conclusion.rfind("rank 1 (pid 102) grows fastest: 8.0 KiB/step", 0) == 0);
  CHECK(job.conclusion.find("1 of 4 processes grows") != std::string::npos);
  CHECK(job_json(job)["growing"] == nlohmann::json::array({2}));
  const std::string html = render_html(run);
  CHECK(html.find("Whole job: 4 processes") != std::string::npos);
}

TEST_CASE("the whole-job table names Jupyter kernels by id and the ones that died", "[job]") {
  RunReport run;
  run.processes.push_back(process(100, "", 0));
  run.processes[0].python_role = "Jupyter server";
  auto kernel = [&](int pid, const std::string& kind, const std::string& summary) {
    ProcessReport k = process(pid, "", 0);
    k.ppid = 100;
    k.python_role = "Jupyter kernel";
    k.kernel_id = "5f0c-e21a";
    k.verdict.kind = kind;
    k.verdict.summary = summary;
    run.processes.push_back(k);
  };
  kernel(101, "killed", "killed by SIGKILL; last RSS 58.0 MiB");
  kernel(102, "exit", "clean exit (code 0)");
  kernel(103, "crash", "crashed with SIGSEGV at address 0x0");
  run.root = 0;
  const JobSummary job = summarize_job(run);
  REQUIRE(job.rows.size() == 4);
  CHECK(job.rows[0].label == "Jupyter server (pid 100)");
  CHECK(job.rows[0].root);
  CHECK(job.rows[1].label == "Jupyter kernel 5f0c-e21a (pid 101)");
  CHECK(job.rows[1].role == "Jupyter kernel 5f0c-e21a, child of pid 100");
  CHECK(job.died == std::vector<size_t>{1, 3});
  CHECK(job.conclusion.find("; Jupyter kernel 5f0c-e21a (pid 101) was killed by SIGKILL; last RSS 58.0 MiB") !=
        std::string::npos);
  CHECK(job.conclusion.find("; Jupyter kernel 5f0c-e21a (pid 103) crashed with SIGSEGV at address 0x0") !=
        std::string::npos);
  CHECK(job.conclusion.find("pid 102") == std::string::npos);
  CHECK(job_json(job)["died"] == nlohmann::json::array({1, 3}));
  CHECK(job_json(job)["rows"][1]["kernel_id"] == "5f0c-e21a");
  const std::string text = render_job_text(job);
  CHECK(text.find("  Jupyter kernel 5f0c-e21a (pid 101)") != std::string::npos);
  CHECK(text.find("exit 0 (root)") != std::string::npos);
}

TEST_CASE("analysis keeps the live set by site at the peak and at the end", "[analysis]") {
  Trace trace;
  trace.path = "synthetic";
  trace.header["pid"] = "100";
  trace.header["host_mode"] = "full";
  uint64_t seq = 0;
  auto event = [&](EvType type, uint64_t addr, uint64_t size, uint32_t stack) {
    TraceEvent e;
    e.type = type;
    e.seq = ++seq;
    e.ts = seq;
    e.addr = addr;
    e.size = size;
    e.stack = stack;
    trace.events.push_back(e);
  };
  event(EvType::kAlloc, 0x10, 100, 1);
  event(EvType::kAlloc, 0x20, 200, 2);
  event(EvType::kAlloc, 0x30, 300, 2);  // the peak: 600 live
  event(EvType::kFree, 0x20, 0, 0);
  event(EvType::kFree, 0x30, 0, 0);
  event(EvType::kAlloc, 0x40, 50, 1);
  event(EvType::kAlloc, 0x50, 60, 3);
  event(EvType::kAlloc, 0x60, 100, 2);  // 310 live: below the peak
  const ProcessReport r = analyze(trace, ExitInfo{}, AnalysisOptions{});
  CHECK(r.peak.bytes == 600);
  auto by_stack = [](const std::vector<SiteTotal>& sites) {
    std::map<uint32_t, std::pair<int64_t, uint64_t>> out;
    for (const SiteTotal& t : sites) out[t.site.stack] = {t.bytes, t.count};
    return out;
  };
  using Totals = std::map<uint32_t, std::pair<int64_t, uint64_t>>;
  CHECK(by_stack(r.live_at_peak) == Totals{{1, {100, 1}}, {2, {500, 2}}});
  CHECK(by_stack(r.live_at_end) == Totals{{1, {150, 2}}, {2, {100, 1}}, {3, {60, 1}}});
  REQUIRE(r.live_at_peak.size() == 2);
  CHECK(r.live_at_peak[0].site.stack == 2);  // largest first
}

TEST_CASE("device live bytes per device ordinal, per step", "[analysis][html]") {
  Trace trace;
  trace.path = "synthetic";
  trace.header["pid"] = "100";
  trace.header["host_mode"] = "full";
  uint64_t seq = 0;
  auto event = [&](EvType type, uint64_t addr, uint64_t size, uint8_t device) {
    TraceEvent e;
    e.type = type;
    e.seq = ++seq;
    e.ts = seq;
    e.addr = addr;
    e.size = size;
    e.stack = 1;
    e.kind = static_cast<uint8_t>(memledger::format::Kind::kDevice);
    e.device = device;
    if (type == EvType::kStep) {
      e.kind = 0;
      e.addr = seq;
      e.size = 0;
    }
    trace.events.push_back(e);
  };
  event(EvType::kAlloc, 0x7f0000000000, 1 << 20, 0);
  event(EvType::kAlloc, 0x7f1000000000, 3 << 20, 1);
  event(EvType::kStep, 0, 0, 0);
  event(EvType::kFree, 0x7f0000000000, 0, 0);
  event(EvType::kStep, 0, 0, 0);
  const ProcessReport r = analyze(trace, ExitInfo{}, AnalysisOptions{});
  REQUIRE(r.steps.size() == 2);
  CHECK(r.steps[0].live_by_device == std::vector<int64_t>{1 << 20, 3 << 20});
  CHECK(r.steps[1].live_by_device == std::vector<int64_t>{0, 3 << 20});
  CHECK(r.steps[1].live[1] == 3 << 20);
  RunReport run;
  run.processes.push_back(r);
  const std::string html = render_html(run);
  CHECK(html.find("device 0 live") != std::string::npos);
  CHECK(html.find("device 1 live") != std::string::npos);
}
