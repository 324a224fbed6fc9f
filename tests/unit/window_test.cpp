#include <catch2/catch.hpp>

#include "event_builder.h"
#include "window.h"

using namespace memledger::report;
using memledger::report::testing::EventBuilder;
namespace fmt = memledger::format;

namespace {

WindowReport window(const std::vector<TraceEvent>& events, uint64_t from, uint64_t to, size_t top = 5) {
  Trace trace;
  trace.events = events;
  return analyze_window(trace, from, to, top, SymbolizerOptions{});
}

constexpr uint8_t kHost = static_cast<uint8_t>(fmt::Kind::kHost);
constexpr uint8_t kDevice = static_cast<uint8_t>(fmt::Kind::kDevice);

}  // namespace

TEST_CASE("window: growth and sites count only what happened inside it", "[window]") {
  EventBuilder b;
  b.alloc(0x100, 5000, 1, kHost);  // before the window: not its growth
  const uint64_t from = b.next_seq();
  b.alloc(0x200, 300, 2, kHost);
  b.alloc(0x300, 300, 2, kHost);
  b.free(0x100, kHost);  // a block from before, freed inside: its site shrinks
  b.alloc(0x400, 1000, 3, kDevice);
  const uint64_t to = b.next_seq();
  b.alloc(0x500, 9999, 4, kHost);  // after the window
  const WindowReport w = window(b.events, from, to);
  const WindowKind& host = w.kinds[kHost];
  CHECK(host.growth == 600 - 5000);
  CHECK(host.allocations == 2);
  CHECK(host.frees == 1);
  REQUIRE(host.sites.size() == 1);  // site 1 only shrank: not listed
  CHECK(host.sites[0].site.stack == 2);
  CHECK(host.sites[0].growth == 600);
  CHECK(host.sites[0].allocations == 2);
  CHECK(w.kinds[kDevice].growth == 1000);
  CHECK(w.total.growth == 1600 - 5000);
  REQUIRE(w.total.sites.size() == 2);
  CHECK(w.total.sites[0].site.stack == 3);  // largest growth first, any kind
  CHECK(w.total.sites[0].site.kind == kDevice);
}

TEST_CASE("window: the peak is above the window's start, with what was live at it", "[window]") {
  EventBuilder b;
  b.alloc(0x100, 100000, 1, kHost);  // a high level before: the peak is relative
  const uint64_t from = b.next_seq();
  b.alloc(0x200, 4000, 2, kHost);  // a burst, freed again
  b.alloc(0x300, 4000, 2, kHost);
  b.alloc(0x400, 500, 3, kHost);   // kept
  b.free(0x200, kHost);
  b.free(0x300, kHost);
  b.alloc(0x500, 1000, 4, kHost);  // kept, after the peak
  const WindowReport w = window(b.events, from, 0);
  const WindowKind& host = w.kinds[kHost];
  CHECK(host.peak == 8500);
  CHECK(host.growth == 1500);
  REQUIRE(host.sites.size() == 3);
  // Sites that grew come first; the burst's site is listed by its bytes at the peak.
  CHECK(host.sites[0].site.stack == 4);
  CHECK(host.sites[0].at_peak == 0);
  CHECK(host.sites[1].site.stack == 3);
  CHECK(host.sites[1].at_peak == 500);
  CHECK(host.sites[2].site.stack == 2);
  CHECK(host.sites[2].growth == 0);
  CHECK(host.sites[2].at_peak == 8000);
}

TEST_CASE("window: host, device and physical handles are separate address spaces; failures count nothing",
          "[window]") {
  EventBuilder b;
  b.alloc(0x1000, 64, 1, kHost);
  b.alloc(0x1000, 2048, 2, kDevice);  // the same number in device memory
  b.free(0x1000, kHost);
  b.failed(1 << 30, 2, 3);
  const WindowReport w = window(b.events, 1, 0, 1);
  CHECK(w.kinds[kHost].growth == 0);
  CHECK(w.kinds[kDevice].growth == 2048);
  CHECK(w.kinds[kDevice].allocations == 1);
  REQUIRE(w.total.sites.size() == 1);  // top 1
  CHECK(w.total.sites[0].site.stack == 2);
}
