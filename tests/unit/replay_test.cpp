#include <catch2/catch.hpp>

#include "event_builder.h"
#include "replay.h"
#include "step_inference.h"

using namespace memledger::report;
using memledger::report::testing::EventBuilder;
namespace fmt = memledger::format;

namespace {

constexpr uint8_t kDevice = static_cast<uint8_t>(fmt::Kind::kDevice);

ReplayOutput replay(const Trace& trace, const std::vector<TraceEvent>& events, bool sampled = false) {
  Replay r(trace, sampled);
  r.observe(events.data(), events.size());
  return r.finish();
}

const SiteAcc& site(const ReplayOutput& out, uint32_t stack, uint8_t kind = 0) {
  for (const SiteAcc& acc : out.sites) {
    if (acc.stack == stack && acc.kind == kind) return acc;
  }
  FAIL("no site with stack " << stack);
  return out.sites.front();
}

}  // namespace

TEST_CASE("replay: live bytes per kind and per step, counts of each step", "[replay]") {
  Trace trace;
  EventBuilder b;
  b.alloc(0x1000, 100, 1);
  b.alloc(0x2000, 300, 2);
  b.alloc(0xd000, 5000, 3, kDevice, 0, 1);
  b.step();
  b.free(0x1000);
  b.step();
  ReplayOutput out = replay(trace, b.events);
  REQUIRE(out.steps.size() == 2);
  CHECK(out.step_source == "marker");
  CHECK(out.steps[0].index == 1);
  CHECK(out.steps[0].source == "marker");
  CHECK(out.steps[0].live[0] == 400);
  CHECK(out.steps[0].live[kDevice] == 5000);
  CHECK(out.steps[0].live_by_device == std::vector<int64_t>{0, 5000});
  CHECK(out.steps[0].allocations == 3);
  CHECK(out.steps[0].frees == 0);
  CHECK(out.steps[1].live[0] == 300);
  CHECK(out.steps[1].allocations == 0);
  CHECK(out.steps[1].frees == 1);
  CHECK(out.live.size() == 2);
  CHECK(out.events == b.events.size());
}

TEST_CASE("replay: a site's series holds the step ends where it changed", "[replay]") {
  Trace trace;
  EventBuilder b;
  b.alloc(0x1000, 10, 7);
  b.step();
  b.step();  // site 7 unchanged
  b.alloc(0x1100, 20, 7);
  b.step();
  ReplayOutput out = replay(trace, b.events);
  const SiteAcc& acc = site(out, 7);
  REQUIRE(acc.changes.size() == 2);
  CHECK(acc.changes[0].step == 1);
  CHECK(acc.changes[0].live == 10);
  CHECK(acc.changes[0].allocs == 1);
  CHECK(acc.changes[1].step == 3);
  CHECK(acc.changes[1].live == 30);
  CHECK(acc.changes[1].allocs == 2);
  CHECK(acc.live == 30);
  CHECK(acc.count == 2);
}

TEST_CASE("replay: the peak is the highest running total, with its step and kind", "[replay]") {
  Trace trace;
  EventBuilder b;
  b.alloc(0x1000, 100, 1);
  b.step();
  b.alloc(0x2000, 500, 2);
  b.free(0x2000);
  b.step();
  b.alloc(0x3000, 50, 3);
  b.step();
  ReplayOutput out = replay(trace, b.events);
  CHECK(out.peak.bytes == 600);
  CHECK(out.peak.step == 2);
  CHECK(out.peak.ts_ns == 3000);
  CHECK(out.peak.kind == 0);
  // The peak's live set: each site's bytes when the total was highest.
  const SiteAcc& big = site(out, 2);
  CHECK(big.live == 0);
  CHECK(big.peak_epoch == out.peak_epoch);
  CHECK(big.peak_live == 500);
}

TEST_CASE("replay: no steps means no peak step and source none", "[replay]") {
  Trace trace;
  EventBuilder b;
  b.alloc(0x1000, 100, 1);
  ReplayOutput out = replay(trace, b.events);
  CHECK(out.step_source == "none");
  CHECK(out.peak.bytes == 100);
  CHECK(out.peak.step == 0);
}

TEST_CASE("replay: unknown frees and reused addresses are counted and never fatal", "[replay]") {
  Trace trace;
  EventBuilder b;
  b.free(0x5000);  // never allocated
  b.alloc(0x1000, 100, 1);
  b.alloc(0x1000, 40, 2);  // the free of the first was lost
  b.alloc(0x40, 8, 0);     // no stack
  ReplayOutput out = replay(trace, b.events);
  CHECK(out.unknown_frees == 1);
  CHECK(out.double_allocations == 1);
  CHECK(out.stackless == 1);
  CHECK(site(out, 1).live == 0);
  CHECK(site(out, 1).count == 0);
  CHECK(site(out, 2).live == 40);
  CHECK(out.live.size() == 2);
}

TEST_CASE("replay: host and device addresses are separate spaces", "[replay]") {
  Trace trace;
  EventBuilder b;
  b.alloc(0x1000, 100, 1);
  b.alloc(0x1000, 200, 2, kDevice);
  b.free(0x1000, kDevice);
  ReplayOutput out = replay(trace, b.events);
  CHECK(out.double_allocations == 0);
  CHECK(site(out, 1).live == 100);
  CHECK(site(out, 2, kDevice).live == 0);
}

TEST_CASE("replay: an out-of-memory failure keeps the device picture of its moment", "[replay]") {
  Trace trace;
  TracePoolSample pool;
  pool.seq = 2;
  pool.pool = 0xabc;
  pool.reserved = 8 << 20;
  pool.used = 6 << 20;
  trace.pool_samples.push_back(pool);
  TraceDeviceSample dev;
  dev.seq = 2;
  dev.free = 1 << 20;
  dev.total = 16 << 20;
  trace.device_samples.push_back(dev);
  EventBuilder b;
  b.alloc(0xd000, 3000, 5, kDevice);
  b.alloc(0xe000, 1000, 6, kDevice);
  b.alloc(0x1000, 99999, 7);  // host: not in the device picture
  b.failed(1 << 30, 2, 9);
  b.failed(64, 1, 9);  // not an out-of-memory error: counted only
  ReplayOutput out = replay(trace, b.events);
  CHECK(out.failed_allocations == 2);
  REQUIRE(out.ooms.size() == 1);
  const OomEvent& oom = out.ooms[0];
  CHECK(oom.requested == 1 << 30);
  CHECK(oom.error == 2);
  CHECK(oom.step == 1);
  CHECK(oom.device_live == 4000);
  CHECK(oom.device_free == 1 << 20);
  CHECK(oom.device_total == 16 << 20);
  CHECK(oom.held_unused == 2 << 20);
  REQUIRE(oom.live_by_site.size() == 2);
  CHECK(oom.live_by_site[0].site.stack == 5);
  CHECK(oom.live_by_site[0].bytes == 3000);
  CHECK(oom.live_by_site[1].site.stack == 6);
  REQUIRE(out.oom_sites.size() == 1);
  CHECK(out.oom_sites[0].stack == 9);
  for (const SiteAcc& acc : out.sites) CHECK(acc.stack != 9);  // failures are no allocations
}

TEST_CASE("replay: step labels, inferred steps and mixed sources", "[replay]") {
  Trace trace;
  trace.strings[4] = "epoch 1";
  EventBuilder b;
  b.step(static_cast<uint8_t>(fmt::StepSource::kMarker), 4);
  b.step(kInferredStepSource);
  b.step(static_cast<uint8_t>(fmt::StepSource::kInterval));
  ReplayOutput out = replay(trace, b.events);
  REQUIRE(out.steps.size() == 3);
  CHECK(out.steps[0].label == "epoch 1");
  CHECK(out.steps[1].source == "auto");
  CHECK(out.step_source == "marker+auto+interval");
}

TEST_CASE("replay: samples give held host bytes and RSS at step ends", "[replay]") {
  Trace trace;
  TraceSample s1;
  s1.ts = 1500;
  s1.rss = 111;
  s1.heap_held = 11;
  s1.host_live = 5;
  TraceSample s2 = s1;
  s2.ts = 3500;
  s2.rss = 222;
  s2.heap_held = 22;
  s2.host_live = 900;
  trace.samples = {s1, s2};
  EventBuilder b;
  b.alloc(0x1000, 100, 1);  // ts 1000
  b.step();                 // ts 2000: the next sample is s2
  b.step();                 // ts 3000
  ReplayOutput full = replay(trace, b.events);
  CHECK(full.steps[0].rss == 222);
  CHECK(full.steps[0].held_host == 22);
  CHECK(full.steps[0].live[0] == 100);
  CHECK(full.peak.bytes == 100);
  ReplayOutput sampled = replay(trace, b.events, true);
  // Sampled mode: the samples' exact totals correct the estimate, by their
  // offsets interpolated in time (-95 at 1500, +800 at 3500).
  CHECK(sampled.steps[0].live[0] == 229);
  CHECK(sampled.steps[1].live[0] == 676);
  CHECK(sampled.peak.bytes == 900);
  CHECK(sampled.peak.ts_ns == 3500);
  CHECK(sampled.peak.step == 3);
}

namespace {

// The Python helper's record of the program's end (memledger.program_end):
// at `ts`, after the event numbered `seq`.
void mark_program_end(Trace& trace, const char* seq, uint64_t ts) {
  trace.strings[1] = kProgramEndKey;
  trace.strings[2] = seq;
  trace.info.push_back(TraceInfo{ts, 1, 2});
}

}  // namespace

TEST_CASE("replay: no allocation after a Python program's end makes the peak", "[replay]") {
  Trace trace;
  mark_program_end(trace, "2", 2500);
  EventBuilder b;
  b.alloc(0x1000, 1000, 1);  // seq 1
  b.step();                  // seq 2: the program ends here
  b.alloc(0x2000, 200, 2);   // seq 3: the walk's module, kept
  ReplayOutput out = replay(trace, b.events);
  CHECK(out.peak.bytes == 1000);
  CHECK(out.peak.step == 1);
  CHECK(out.live.size() == 2);  // still live at the end, as it is
  SECTION("without the mark, it does") {
    trace.info.clear();
    ReplayOutput unmarked = replay(trace, b.events);
    CHECK(unmarked.peak.bytes == 1200);
  }
}

TEST_CASE("replay: in sampled mode no sample after a Python program's end makes the peak", "[replay]") {
  // The program ends at 4000 (memledger.program_end); a sample after it
  // holds what memledger's walk left (its module) on top of the program's.
  Trace trace;
  mark_program_end(trace, "3", 4000);
  TraceSample during;
  during.ts = 2500;
  during.host_live = 1000;
  TraceSample after = during;
  after.ts = 5000;
  after.host_live = 1200;
  trace.samples = {during, after};
  EventBuilder b;
  b.alloc(0x1000, 1000, 1, 0, static_cast<uint8_t>(fmt::kAllocSampled));  // ts 1000
  b.step();                                                               // ts 2000
  b.step();                                                               // ts 3000
  ReplayOutput out = replay(trace, b.events, true);
  CHECK(out.peak.bytes == 1000);
  CHECK(out.peak.ts_ns == 2500);
  CHECK(out.peak.step == 2);
  SECTION("without the mark, the last sample is the peak") {
    trace.info.clear();
    ReplayOutput unmarked = replay(trace, b.events, true);
    CHECK(unmarked.peak.bytes == 1200);
    CHECK(unmarked.peak.ts_ns == 5000);
  }
}

TEST_CASE("replay: in sampled mode a step end and the writer's sample just after it are one peak, the step's",
          "[replay]") {
  // The writer samples at each marked step end, just after the marker: the
  // same exact total, a moment later, in the next phase.
  Trace trace;
  EventBuilder b;
  b.alloc(0x1000, 1000, 1, 0, static_cast<uint8_t>(fmt::kAllocSampled));  // seq 1, ts 1000
  b.step();                                                               // seq 2, ts 2000
  trace.host_totals.push_back(TraceHostTotals{2, 1500, 1, 0});
  TraceSample at_end;
  at_end.ts = 2001;
  at_end.host_live = 1500;
  trace.samples = {at_end};
  ReplayOutput out = replay(trace, b.events, true);
  REQUIRE(out.steps.size() == 1);
  CHECK(out.steps[0].live[0] == 1500);
  CHECK(out.peak.bytes == 1500);
  CHECK(out.peak.ts_ns == 2000);
  CHECK(out.peak.step == 1);
}

TEST_CASE("replay: sampled host live at each step end, between samples and before the teardown", "[replay]") {
  // Ten steps, each keeping 1000 bytes, with two samples among them (the
  // writer samples every 100 ms, inferred steps come far more often), then
  // a teardown that frees everything before the last sample.
  Trace trace;
  EventBuilder b;
  for (uint64_t k = 0; k < 10; ++k) {
    b.alloc(0x1000 + k * 0x100, 1000, 1, 0, static_cast<uint8_t>(fmt::kAllocSampled));  // ts (2k+1)*1000
    b.step();                                                                         // ts (2k+2)*1000
  }
  for (uint64_t k = 0; k < 10; ++k) b.free(0x1000 + k * 0x100);
  TraceSample a;
  a.ts = 2500;
  a.host_live = 1007;  // exact: 7 bytes the sampling missed
  TraceSample c = a;
  c.ts = 20500;
  c.host_live = 11007;  // 1007 missed by then
  TraceSample teardown = a;
  teardown.ts = 40000;
  teardown.host_live = 7;
  trace.samples = {a, c, teardown};
  ReplayOutput out = replay(trace, b.events, true);
  REQUIRE(out.steps.size() == 10);
  // Step 1 ends before the first sample: its offset (7). Step 10 ends at
  // 20000, 17500/18000 of the way to the second sample: 10000 + 7 + 972.
  CHECK(out.steps[0].live[0] == 1007);
  CHECK(out.steps[9].live[0] == 10979);
  for (size_t k = 1; k < 10; ++k) {
    INFO("step " << k + 1);
    CHECK(out.steps[k].live[0] > out.steps[k - 1].live[0] + 1000);
  }
}

TEST_CASE("replay: mapped memory is its own kind and address space, held by no device", "[replay]") {
  constexpr uint8_t kMapped = static_cast<uint8_t>(fmt::Kind::kMapped);
  Trace trace;
  EventBuilder b;
  b.alloc(0x10000, 4096, 1);                  // a heap block
  b.alloc(0x10000, 65536, 2, kMapped);        // a mapping at the same address: no clash
  b.alloc(0x40000, 4096, 3, kDevice, 0, 1);
  b.step();
  b.free(0x10000, kMapped);
  b.alloc(0x10000, 16384, 2, kMapped);        // what a partial unmap leaves
  b.step();
  ReplayOutput out = replay(trace, b.events);
  REQUIRE(out.steps.size() == 2);
  CHECK(out.double_allocations == 0);
  CHECK(out.unknown_frees == 0);
  CHECK(out.steps[0].live[0] == 4096);
  CHECK(out.steps[0].live[kMapped] == 65536);
  CHECK(out.steps[1].live[0] == 4096);
  CHECK(out.steps[1].live[kMapped] == 16384);
  // Only the device allocation is held by the device (rounded to 2 MiB).
  CHECK(out.steps[1].held_device == 2 << 20);
  CHECK(site(out, 2, kMapped).live == 16384);
}

TEST_CASE("replay: memledger's own work counts in the totals but never makes the peak", "[replay]") {
  Trace trace;
  trace.strings[1] = kOwnWorkKey;
  auto mark = [&](uint32_t id, const char* value, uint64_t ts) {
    trace.strings[id] = value;
    trace.info.push_back(TraceInfo{ts, 1, id});
  };
  EventBuilder b;
  b.alloc(0x1000, 100, 1);  // seq 1
  b.step();                 // seq 2
  mark(10, "begin 3", 2500);
  mark(11, "begin 4", 2600);  // one at a time: a begin inside the open one is part of it
  b.alloc(0x2000, 1000, 2);   // seq 3: the walk's list
  b.alloc(0x3000, 700, 2);    // seq 4
  b.free(0x2000);             // seq 5
  b.free(0x3000);             // seq 6
  mark(12, "end 7", 6500);
  mark(13, "end x", 6600);    // not a sequence number: no work of its own
  b.alloc(0x4000, 300, 3);    // seq 7: the program's again
  b.step();
  ReplayOutput out = replay(trace, b.events);
  CHECK(out.peak.bytes == 400);
  CHECK(out.peak.step == 2);
  CHECK(out.own_work_bytes == 1700);
  CHECK(out.steps.back().live[0] == 400);

  SECTION("a work that never ends keeps every later allocation out of the peak") {
    Trace open;
    open.strings[1] = kOwnWorkKey;
    open.strings[10] = "begin 2";
    open.info.push_back(TraceInfo{1500, 1, 10});
    EventBuilder c;
    c.alloc(0x1000, 100, 1);
    c.alloc(0x2000, 5000, 2);
    ReplayOutput o = replay(open, c.events);
    CHECK(o.peak.bytes == 100);
    CHECK(o.own_work_bytes == 5000);
  }
}
