#include <catch2/catch.hpp>

#include <cmath>

#include "event_builder.h"
#include "exit_leaks.h"

using namespace memledger::report;
using memledger::report::testing::EventBuilder;

namespace {

ReplayOutput replay(const std::vector<TraceEvent>& events) {
  static const Trace trace;
  Replay r(trace, false);
  r.observe(events.data(), events.size());
  return r.finish();
}

}  // namespace

TEST_CASE("leaks at exit: what the first step made is start-up, the rest leaks", "[exit_leaks]") {
  EventBuilder b;
  b.alloc(0x100, 5000, 1);  // a global made at start-up
  b.alloc(0x200, 10, 2);    // freed: neither
  b.step();
  b.free(0x200);
  b.alloc(0x300, 700, 3);
  b.alloc(0x400, 300, 3);
  b.alloc(0x500, 900, 4);
  b.step();
  ExitLeaks leaks = find_exit_leaks(replay(b.events), 20);
  REQUIRE(leaks.startup.size() == 1);
  CHECK(leaks.startup[0].site.stack == 1);
  CHECK(leaks.startup_bytes == 5000);
  CHECK(leaks.startup_count == 1);
  REQUIRE(leaks.leaks.size() == 2);
  CHECK(leaks.leaks[0].site.stack == 3);  // largest first
  CHECK(leaks.leaks[0].bytes == 1000);
  CHECK(leaks.leaks[0].count == 2);
  CHECK(leaks.leaks[1].site.stack == 4);
  CHECK(leaks.leak_bytes == 1900);
  CHECK(leaks.leak_count == 3);
}

TEST_CASE("leaks at exit: without steps everything live is an exit leak", "[exit_leaks]") {
  EventBuilder b;
  b.alloc(0x100, 5000, 1);
  ExitLeaks leaks = find_exit_leaks(replay(b.events), 20);
  CHECK(leaks.startup.empty());
  CHECK(leaks.leak_bytes == 5000);
}

TEST_CASE("leaks at exit: past max_sites the totals still count every site", "[exit_leaks]") {
  EventBuilder b;
  b.step();
  for (uint32_t s = 1; s <= 5; ++s) b.alloc(0x1000 * s, 100 * s, s);
  ExitLeaks leaks = find_exit_leaks(replay(b.events), 2);
  REQUIRE(leaks.leaks.size() == 2);
  CHECK(leaks.leaks[0].site.stack == 5);
  CHECK(leaks.leaks[1].site.stack == 4);
  CHECK(leaks.leak_bytes == 1500);
  CHECK(leaks.leak_count == 5);
}

TEST_CASE("live sets: by site at the peak and at the end", "[exit_leaks]") {
  EventBuilder b;
  b.alloc(0x100, 100, 1);
  b.alloc(0x200, 400, 2);  // the peak: 500
  b.free(0x200);
  b.alloc(0x300, 50, 3);
  b.alloc(0x400, 60, 3);
  LiveSets live = live_sets(replay(b.events), 10);
  REQUIRE(live.at_peak.size() == 2);
  CHECK(live.at_peak[0].site.stack == 2);
  CHECK(live.at_peak[0].bytes == 400);
  CHECK(live.at_peak[1].site.stack == 1);
  REQUIRE(live.at_end.size() == 2);
  CHECK(live.at_end[0].site.stack == 3);
  CHECK(live.at_end[0].bytes == 110);
  CHECK(live.at_end[0].count == 2);
  CHECK(live.at_end[1].site.stack == 1);
  CHECK(live.sites_dropped == 0);
  LiveSets one = live_sets(replay(b.events), 1);
  CHECK(one.at_peak.size() == 1);
  CHECK(one.at_end.size() == 1);
  CHECK(one.sites_dropped == 1);
}

TEST_CASE("leaks at exit: in sampled mode a count estimates allocations, not samples", "[exit_leaks]") {
  // The recorder's weight for an allocation of `size` bytes smaller than the
  // mean interval: size / (1 - exp(-size / interval)).
  const uint64_t interval = 131072;
  auto weight = [&](double size) {
    return static_cast<uint64_t>(std::llround(size / -std::expm1(-size / static_cast<double>(interval))));
  };
  CHECK(allocations_per_sample(weight(4096), interval) == Approx(weight(4096) / 4096.0).epsilon(0.001));
  CHECK(allocations_per_sample(weight(64), interval) == Approx(weight(64) / 64.0).epsilon(0.02));
  CHECK(allocations_per_sample(1 << 20, interval) == Approx(1.0).epsilon(0.001));  // as large as a whole one

  // 8000 leaked blocks of 4 KiB sampled by bytes: about 236 samples, each
  // weighing about 33 blocks.
  EventBuilder b;
  b.step();
  const uint64_t w = weight(4096);
  for (uint64_t i = 0; i < 236; ++i) b.alloc(0x10000 + i * 0x1000, w, 7, 0, memledger::format::kAllocSampled | kAllocByChance);
  b.alloc(0x900000, 1 << 20, 8, 0, memledger::format::kAllocSampled);  // at least the interval: one allocation
  ExitLeaks leaks = find_exit_leaks(replay(b.events), 20, interval);
  CHECK(leaks.counts_estimated);
  REQUIRE(leaks.leaks.size() == 2);
  const SiteTotal& small = leaks.leaks[0].site.stack == 7 ? leaks.leaks[0] : leaks.leaks[1];
  CHECK(small.count == Approx(236.0 * w / 4096.0).epsilon(0.01));
  CHECK(small.count > 7000);
  CHECK(leaks.leak_count == small.count + 1);
  // Without the interval (full mode) every record is one allocation.
  CHECK(find_exit_leaks(replay(b.events), 20).leak_count == 237);
}
