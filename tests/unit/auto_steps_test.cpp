#include <catch2/catch.hpp>

#include "auto_steps.h"
#include "event_builder.h"
#include "replay.h"

using namespace memledger::report;
using memledger::report::testing::EventBuilder;

namespace {

// `steps` iterations of a loop that allocates four buffers and frees them,
// after a few one-off allocations; no step markers.
EventBuilder unmarked_loop(int steps) {
  EventBuilder b;
  for (uint64_t i = 0; i < 5; ++i) b.alloc(0x100000 + i * 0x100, 64 + i, 100 + static_cast<uint32_t>(i));
  for (int s = 0; s < steps; ++s) {
    for (uint64_t i = 0; i < 4; ++i) b.alloc(0x200000 + i * 0x1000, 1000 + i, 10 + static_cast<uint32_t>(i));
    for (uint64_t i = 0; i < 4; ++i) b.free(0x200000 + i * 0x1000);
  }
  return b;
}

AllocationSequence sequence_of(const Trace& trace, const std::vector<TraceEvent>& events) {
  AllocationSequence sequence(trace);
  sequence.observe(events.data(), events.size());
  return sequence;
}

EventFeed feed_of(const std::vector<TraceEvent>& events) {
  return [&events](const EventBatchFn& on_events) { on_events(events.data(), events.size()); };
}

}  // namespace

TEST_CASE("automatic steps: a trace with markers needs no plan", "[auto_steps]") {
  const Trace trace;
  EventBuilder b = unmarked_loop(10);
  b.step();
  StepPlan plan = plan_steps(sequence_of(trace, b.events));
  CHECK(plan.ends.empty());
  CHECK(plan.description.empty());
  CHECK(plan.note.empty());
}

TEST_CASE("automatic steps: a loop gives a step per iteration, replayed with source auto", "[auto_steps]") {
  const Trace trace;
  const EventBuilder b = unmarked_loop(10);
  StepPlan plan = plan_steps(sequence_of(trace, b.events));
  REQUIRE(plan.ends.size() == 10);
  CHECK(plan.description.find("inferred period 4 allocations per step") == 0);
  CHECK(plan.note.empty());
  // The steps go in front of the replay.
  Replay replay(trace, false);
  const EventFeed feed = feed_of(b.events);
  with_steps(feed, plan.ends)([&](const TraceEvent* events, size_t count) { replay.observe(events, count); });
  ReplayOutput out = replay.finish();
  CHECK(out.step_source == "auto");
  REQUIRE(out.steps.size() == 10);
  CHECK(out.steps[1].allocations == 4);
  CHECK(out.steps[1].frees == 4);
  CHECK(out.steps[1].live[0] == 5 * 64 + 10);  // the one-offs only
  CHECK(out.events == b.events.size() + 10);
}

TEST_CASE("automatic steps: no loop, no steps, and a note that says why", "[auto_steps]") {
  const Trace trace;
  EventBuilder b;
  for (uint64_t i = 0; i < 20; ++i) b.alloc(0x1000 * (i + 1), 100 + i, static_cast<uint32_t>(i + 1));
  StepPlan plan = plan_steps(sequence_of(trace, b.events));
  CHECK(plan.ends.empty());
  CHECK(plan.note.rfind("automatic steps: ", 0) == 0);
}

TEST_CASE("automatic steps: mapped memory takes no part in the inference", "[auto_steps]") {
  constexpr uint8_t kMapped = static_cast<uint8_t>(memledger::format::Kind::kMapped);
  const Trace trace;
  // An allocator's arenas mapped and unmapped in a perfect rhythm, and no
  // heap loop at all: nothing to infer steps from.
  EventBuilder b;
  for (int s = 0; s < 12; ++s) {
    for (uint64_t i = 0; i < 4; ++i) b.alloc(0x7f0000000000 + i * 0x100000, 1 << 20, 20 + static_cast<uint32_t>(i), kMapped);
    for (uint64_t i = 0; i < 4; ++i) b.free(0x7f0000000000 + i * 0x100000, kMapped);
  }
  const AllocationSequence sequence = sequence_of(trace, b.events);
  CHECK(sequence.allocations() == 0);
  CHECK(plan_steps(sequence).ends.empty());
}
