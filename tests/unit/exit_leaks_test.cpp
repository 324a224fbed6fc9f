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

ReplayOutput replay_sampled(const Trace& trace, const std::vector<TraceEvent>& events) {
  Replay r(trace, true);
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

TEST_CASE("leaks at exit: sampled estimates never add up to more than the exact host total at the end",
          "[exit_leaks]") {
  // A short process: three sampled blocks of 100 bytes, each weighing about
  // the interval, and one exact block of 200 KiB. The host held 200 KiB and
  // 1000 bytes at the end: the samples stand for 384 KiB, the total leaves
  // them 1000 bytes.
  const uint64_t interval = 131072;
  const uint64_t w = static_cast<uint64_t>(std::llround(100 / -std::expm1(-100.0 / interval)));
  constexpr uint8_t kSampled = memledger::format::kAllocSampled;
  EventBuilder b;
  for (uint64_t i = 0; i < 3; ++i) b.alloc(0x1000 + i * 0x100, w, 5 + i, 0, kSampled | kAllocByChance);
  b.alloc(0x100000, 200 << 10, 9, 0, kSampled);
  b.alloc(0x900000, 1 << 20, 10, static_cast<uint8_t>(memledger::format::Kind::kMapped));  // not host: as it is
  Trace trace;
  TraceSample end;
  end.ts = b.events.back().ts + 1000;  // the teardown's sample, after the last event
  end.host_live = (200 << 10) + 1000;
  trace.samples = {end};
  ReplayOutput out = replay_sampled(trace, b.events);
  CHECK(out.host_live_at_end == (200 << 10) + 1000);
  ExitLeaks leaks = find_exit_leaks(out, 20, interval);
  CHECK(leaks.scaled_from == 3 * static_cast<int64_t>(w));
  CHECK(leaks.scaled_to == 1000);
  CHECK(leaks.leak_bytes == Approx((200 << 10) + 1000 + (1 << 20)).margin(2));
  REQUIRE(leaks.leaks.size() == 5);
  for (const SiteTotal& t : leaks.leaks) {
    if (t.site.stack >= 5 && t.site.stack <= 7) {
      CHECK(t.bytes == Approx(333).margin(1));
      CHECK(t.count == 3);  // about 3.3 allocations each, as the bytes are scaled
    }
  }

  SECTION("an estimate below the exact total is left as it is") {
    trace.samples[0].host_live = (200 << 10) + 3 * w + 5000;
    ExitLeaks kept = find_exit_leaks(replay_sampled(trace, b.events), 20, interval);
    CHECK(kept.scaled_from == 0);
    CHECK(kept.leak_bytes == static_cast<int64_t>((200 << 10) + 3 * w + (1 << 20)));
  }
  SECTION("without a sample after the last event the end total is unknown") {
    trace.samples[0].ts = b.events.back().ts - 1;
    ReplayOutput early = replay_sampled(trace, b.events);
    CHECK(early.host_live_at_end == -1);
    CHECK(find_exit_leaks(early, 20, interval).scaled_from == 0);
  }
}

TEST_CASE("leaks at exit: sampled estimates sum the same whatever the order of the live map", "[exit_leaks]") {
  // The live map is a hash map: its order follows its capacity and a seed
  // taken anew in each process. Sums of the samples' fractional estimates
  // must not, or one trace reads differently from run to run.
  const uint64_t interval = 131072;
  EventBuilder b;
  b.step();
  uint64_t size = 64;
  for (uint64_t i = 0; i < 3000; ++i) {
    size = size * 7 % 1000003 + 64;  // from 64 bytes to about a megabyte, in no order
    b.alloc(0x10000000 + i * 0x100000, size, static_cast<uint32_t>(1 + i % 40), 0,
            memledger::format::kAllocSampled | kAllocByChance);
  }
  const ReplayOutput out = replay(b.events);
  ReplayOutput other = replay(b.events);
  std::vector<std::pair<uint64_t, LiveAlloc>> entries(out.live.begin(), out.live.end());
  other.live.clear();
  other.live.reserve(entries.size() * 7);  // another capacity: another order
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) other.live.insert(*it);
  const ExitLeaks first = find_exit_leaks(out, 20, interval);
  const ExitLeaks second = find_exit_leaks(other, 20, interval);
  CHECK(first.leak_bytes_error == second.leak_bytes_error);  // the same double, bit for bit
  REQUIRE(first.leaks.size() == second.leaks.size());
  for (size_t i = 0; i < first.leaks.size(); ++i) {
    CHECK(first.leaks[i].site.stack == second.leaks[i].site.stack);
    CHECK(first.leaks[i].bytes_error == second.leaks[i].bytes_error);
    CHECK(first.leaks[i].count == second.leaks[i].count);
  }
}
