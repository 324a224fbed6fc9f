#include <catch2/catch.hpp>

#include <csignal>

#include "analysis.h"
#include "trace_format.h"

using namespace memledger::report;
namespace fmt = memledger::format;

namespace {

// Builds a synthetic trace event by event, as the writer would record it.
class TraceBuilder {
 public:
  TraceBuilder() {
    trace.path = "synthetic";
    trace.header["pid"] = "100";
    trace.header["host_mode"] = "full";
  }
  void alloc(uint64_t addr, uint64_t size, uint32_t stack) {
    TraceEvent e;
    e.type = EvType::kAlloc;
    e.seq = ++seq;
    e.ts = seq;
    e.addr = addr;
    e.size = size;
    e.stack = stack;
    trace.events.push_back(e);
  }
  void free(uint64_t addr) {
    TraceEvent e;
    e.type = EvType::kFree;
    e.seq = ++seq;
    e.ts = seq;
    e.addr = addr;
    trace.events.push_back(e);
  }
  void step() {
    TraceEvent e;
    e.type = EvType::kStep;
    e.seq = ++seq;
    e.ts = seq;
    e.addr = ++steps;
    trace.events.push_back(e);
  }
  Trace trace;
  uint64_t seq = 0;
  uint64_t steps = 0;
};

constexpr uint32_t kLeakSite = 1;
constexpr uint32_t kTempSite = 2;
constexpr uint32_t kCacheSite = 3;
constexpr uint32_t kStartupSite = 4;

TraceBuilder training_run(int steps, uint64_t leak_per_step) {
  TraceBuilder b;
  b.alloc(0x900000, 5000, kStartupSite);  // a one-off global
  uint64_t addr = 0x10000000;
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < 10; ++i) b.alloc(0x200000 + i * 0x1000, 2048, kTempSite);
    if (s < 4) b.alloc(0x300000 + s * 0x1000, 10000, kCacheSite);  // warms up, then stays
    if (leak_per_step) b.alloc(addr += 0x10000, leak_per_step, kLeakSite);
    for (int i = 0; i < 10; ++i) b.free(0x200000 + i * 0x1000);
    b.step();
  }
  return b;
}

}  // namespace

TEST_CASE("least squares gives the exact slope of a linear series", "[analysis]") {
  LinearFit fit = fit_line({10, 14106, 28202, 42298});
  CHECK(fit.slope == Approx(14096));
  CHECK(fit.r_squared == Approx(1.0));
  CHECK(fit_line({5, 5, 5}).slope == 0);
}

TEST_CASE("a steady leak is a suspect with its exact bytes per step", "[analysis]") {
  TraceBuilder b = training_run(30, 4096);
  ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
  REQUIRE(r.steps.size() == 30);
  CHECK(r.step_source == "marker");
  REQUIRE(r.leak_suspects.size() == 1);
  const LeakSuspect& s = r.leak_suspects[0];
  CHECK(s.site.stack == kLeakSite);
  CHECK(s.bytes_per_step == Approx(4096));
  CHECK(s.allocations_per_step == Approx(1.0));
  CHECK(s.first_step == 1);
  CHECK(s.monotonicity == Approx(1.0));
  // Live bytes per step: start-up + cache (4 x 10000 after step 4) + leak.
  CHECK(r.steps[0].live[0] == 5000 + 10000 + 4096);
  CHECK(r.steps[29].live[0] == 5000 + 40000 + 30 * 4096);
  CHECK(r.peak.bytes == 5000 + 40000 + 30 * 4096 + 10 * 2048);
  CHECK(r.peak.step == 30);
}

TEST_CASE("a cache that plateaus and temporaries are not suspects", "[analysis]") {
  TraceBuilder b = training_run(30, 0);
  ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
  CHECK(r.leak_suspects.empty());
}

TEST_CASE("growth that stops before the end is not a suspect", "[analysis]") {
  TraceBuilder b;
  uint64_t addr = 0x10000000;
  for (int s = 0; s < 30; ++s) {
    if (s < 15) b.alloc(addr += 0x10000, 8192, kLeakSite);
    b.step();
  }
  ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
  CHECK(r.leak_suspects.empty());
}

TEST_CASE("exit leaks are separated from start-up allocations", "[analysis]") {
  TraceBuilder b = training_run(10, 1000);
  ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
  // Allocated in step 1 (before the first marker): start-up, even the first leak.
  CHECK(r.startup_bytes == 5000 + 10000 + 1000);
  CHECK(r.exit_leak_bytes == 3 * 10000 + 9 * 1000);
  REQUIRE_FALSE(r.exit_leaks.empty());
  CHECK(r.exit_leaks[0].site.stack == kCacheSite);
}

TEST_CASE("unknown frees and reused addresses are counted, never fatal", "[analysis]") {
  TraceBuilder b;
  b.free(0xdead);
  b.alloc(0x1000, 10, 1);
  b.alloc(0x1000, 20, 2);  // the free in between was lost
  b.step();
  ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
  CHECK(r.unknown_frees == 1);
  CHECK(r.double_allocations == 1);
  CHECK(r.steps[0].live[0] == 20);
}

TEST_CASE("the stop verdict follows waitpid, then the trace", "[analysis]") {
  TraceBuilder b = training_run(5, 0);
  SECTION("clean exit from the trace") {
    b.trace.has_exit = true;
    b.trace.exit_status = 0;
    ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
    CHECK(r.verdict.kind == "exit");
    CHECK(r.verdict.exit_code == 0);
  }
  SECTION("a crash signal recorded by the tracer") {
    TraceSignal s;
    s.signo = SIGSEGV;
    s.fault_addr = 0x10;
    b.trace.signals.push_back(s);
    ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
    CHECK(r.verdict.kind == "crash");
    CHECK(r.verdict.signal_name == "SIGSEGV");
  }
  SECTION("SIGKILL near the cgroup limit is a host OOM kill") {
    TraceSample sample;
    sample.rss = 950;
    sample.cgroup_limit = 1000;
    sample.cgroup_usage = 990;
    b.trace.samples.push_back(sample);
    ExitInfo info;
    info.known = info.signaled = true;
    info.signo = SIGKILL;
    ProcessReport r = analyze(b.trace, info, AnalysisOptions{});
    CHECK(r.verdict.kind == "host_oom_kill");
  }
  SECTION("SIGKILL far from any limit") {
    ExitInfo info;
    info.known = info.signaled = true;
    info.signo = SIGKILL;
    ProcessReport r = analyze(b.trace, info, AnalysisOptions{});
    CHECK(r.verdict.kind == "killed");
  }
  SECTION("no end record at all: stopped without warning") {
    ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
    CHECK(r.verdict.kind == "killed");
  }
}

TEST_CASE("no steps: the report says so and judges no growth", "[analysis]") {
  TraceBuilder b;
  b.alloc(0x1000, 100, 1);
  ProcessReport r = analyze(b.trace, ExitInfo{}, AnalysisOptions{});
  CHECK(r.step_source == "none");
  CHECK(r.leak_suspects.empty());
  CHECK(r.exit_leak_bytes == 100);
  CHECK_FALSE(r.notes.empty());
}
