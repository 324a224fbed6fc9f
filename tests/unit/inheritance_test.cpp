// Forks and loader steps on hand-made events: a parent keeps its live set
// at a child's fork, the child starts from it, and a trace whose loader steps
// meet markers keeps the markers alone.
#include <catch2/catch.hpp>

#include "auto_steps.h"
#include "event_builder.h"
#include "notes.h"
#include "replay.h"
#include "trace_format.h"

using namespace memledger::report;
using memledger::report::testing::EventBuilder;
namespace fmt = memledger::format;

namespace {

constexpr uint8_t kHost = static_cast<uint8_t>(fmt::Kind::kHost);
constexpr uint8_t kDevice = static_cast<uint8_t>(fmt::Kind::kDevice);

ReplayOutput replay_all(const Trace& trace, const std::vector<TraceEvent>& events,
                        const std::function<void(Replay&)>& before = {}) {
  Replay replay(trace, false);
  if (before) before(replay);
  replay.observe(events.data(), events.size());
  return replay.finish();
}

}  // namespace

TEST_CASE("inheritance: a parent keeps its host live set as it was before the fork", "[inheritance]") {
  const Trace trace;
  EventBuilder parent;
  parent.alloc(0x1000, 100, 1);
  parent.alloc(0x2000, 200, 2);
  parent.alloc(0x9000, 4096, 3, kDevice);  // device memory does not survive a fork
  parent.free(0x1000);
  const uint64_t fork_seq = parent.next_seq();
  parent.alloc(0x3000, 300, 4);  // after the fork: the parent's own
  std::vector<InheritedBlock> at_fork, at_end;
  replay_all(trace, parent.events, [&](Replay& r) {
    r.keep_live_set({fork_seq, &at_fork});
    r.keep_live_set({parent.next_seq() + 10, &at_end});  // past the last event: at the end
  });
  REQUIRE(at_fork.size() == 1);
  CHECK(at_fork[0].weight == 200);
  CHECK(at_fork[0].kind == kHost);
  CHECK(at_end.size() == 2);
}

TEST_CASE("inheritance: a child starts from the inherited blocks, and freeing them is no unknown free",
          "[inheritance]") {
  const Trace trace;
  const std::vector<InheritedBlock> inherited = {{live_key(kHost, 0, 0x2000), 200, kHost},
                                                 {live_key(kHost, 0, 0x4000), 400, kHost}};
  EventBuilder child;
  child.alloc(0x5000, 50, 7);
  child.step();
  child.free(0x2000);  // inherited
  child.free(0x6000);  // never seen anywhere
  child.step();
  child.alloc(0x4000, 64, 8);  // an inherited block's address, freed without a record
  child.step();
  const ReplayOutput out = replay_all(trace, child.events, [&](Replay& r) { r.inherit(inherited); });
  CHECK(out.inherited_blocks == 2);
  CHECK(out.inherited_bytes == 600);
  CHECK(out.inherited_freed_blocks == 1);
  CHECK(out.inherited_freed_bytes == 200);
  CHECK(out.unknown_frees == 1);
  REQUIRE(out.steps.size() == 3);
  CHECK(out.steps[0].live[0] == 600 + 50);
  CHECK(out.steps[1].live[0] == 400 + 50);
  CHECK(out.steps[2].live[0] == 50 + 64);
  // The peak counts what it holds of them, as its step ends do.
  CHECK(out.peak.bytes == 600 + 50);
  for (const StepStats& st : out.steps) CHECK(out.peak.bytes >= st.live[0]);
  // Inherited blocks belong to no site of the child, and are no exit leak.
  CHECK(out.live.size() == 2);
  for (const SiteAcc& site : out.sites) CHECK((site.stack == 7 || site.stack == 8));
}

// A pool worker in sampled mode: the exact host total it read includes what
// it inherited, and its sampled estimate of that is off by chance (here 2.6
// MiB for 2.3 MiB); its peak is the exact total, not that less the estimate.
TEST_CASE("inheritance: in sampled mode a child's peak is its exact host total", "[inheritance]") {
  Trace trace;
  TraceSample sample;
  sample.ts = 1000;
  sample.host_live = 2364400;
  trace.samples.push_back(sample);
  std::vector<InheritedBlock> inherited;
  for (uint64_t i = 0; i < 19; ++i) inherited.push_back({live_key(kHost, 0, 0x100000 + i * 0x1000), 137000, kHost});
  EventBuilder child;
  child.alloc(0x5000, 133131, 7);
  Replay replay(trace, true);
  replay.inherit(inherited);
  replay.observe(child.events.data(), child.events.size());
  const ReplayOutput out = replay.finish();
  CHECK(out.peak.bytes == 2364400);
}

TEST_CASE("inheritance: the note says what was inherited, or why it is unknown", "[inheritance]") {
  Inheritance known;
  known.parent = 800;
  known.blocks = 3912;
  known.bytes = 64 << 20;
  known.freed_blocks = 211;
  known.freed_bytes = 1 << 20;
  known.host_live_at_fork = 64 << 20;
  CHECK(inheritance_note(known, 800, false) ==
        "forked from pid 800: it inherited 64.0 MiB of the parent's heap (3912 blocks) and freed 1.0 MiB of it "
        "(211 blocks); its host live bytes start from the parent's 64.0 MiB at the fork, and its growth is "
        "measured from there");
  Inheritance unknown;
  CHECK(inheritance_note(unknown, 800, false).find("whose trace is not in this run") != std::string::npos);
  CHECK(inheritance_note(unknown, 0, false).empty());
}

TEST_CASE("loader steps: with markers as well, the markers alone are the steps", "[inheritance]") {
  const Trace trace;
  constexpr auto kLoader = static_cast<uint8_t>(fmt::StepSource::kLoader);
  EventBuilder b;
  b.alloc(0x1000, 10, 1);
  b.step(kLoader);  // the loader's second batch came before the program's first marker
  b.step();
  b.alloc(0x2000, 10, 1);
  b.step();
  AllocationSequence sequence(trace);
  sequence.observe(b.events.data(), b.events.size());
  CHECK(sequence.saw_steps());
  CHECK(sequence.mixed_loader_steps());
  const EventFeed feed = [&](const EventBatchFn& on_events) { on_events(b.events.data(), b.events.size()); };
  Replay replay(trace, false);
  without_step_source(feed, kLoader)([&](const TraceEvent* events, size_t count) { replay.observe(events, count); });
  const ReplayOutput out = replay.finish();
  CHECK(out.step_source == "marker");
  CHECK(out.steps.size() == 2);

  EventBuilder loader_only;
  loader_only.alloc(0x1000, 10, 1);
  loader_only.step(kLoader);
  loader_only.step(kLoader);
  AllocationSequence alone(trace);
  alone.observe(loader_only.events.data(), loader_only.events.size());
  CHECK_FALSE(alone.mixed_loader_steps());
  CHECK(replay_all(trace, loader_only.events).step_source == "loader");
}
