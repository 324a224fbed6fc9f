#include <catch2/catch.hpp>

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
