// Stage "automatic steps", in front of replay (DESIGN.md, "Step", source
// `auto`).
//
// In:  the allocation sequence of the events (AllocationSequence, which
//      watches them on their way to the replay).
// Out: a StepPlan: nothing to do when the trace has step events of its own;
//      else the event positions where inferred steps end, what inference
//      found, or why it found no loop. The replay then runs with the plan's
//      step events inserted (with_steps); the stages after it never know
//      where the steps came from but by their source ("auto").
//
// The first replay runs while the sequence is being collected, so a trace
// with markers, or one without a loop, is read once; only a trace whose
// loop was found is replayed a second time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "step_inference.h"
#include "trace_reader.h"

namespace memledger::report {

// Hands the trace's events to a consumer in sequence order, a batch at a time.
using EventFeed = std::function<void(const EventBatchFn&)>;

struct StepPlan {
  std::vector<uint64_t> ends;  // step events go before these event positions; empty: none to add
  std::string description;     // the loop found ("inferred period N allocations ..."); empty when none
  std::string note;            // "automatic steps: " and why no loop was found; empty when not needed
  // Time windows: `ends` are timestamps (ns), each window this long.
  bool by_time = false;
  double window_seconds = 0;
};

StepPlan plan_steps(const AllocationSequence& sequence);

// A process with no steps of any kind (no marker, and no loop found: a
// DataLoader or pool worker, a server) is judged over equal time windows
// instead (source "time"): kTimeWindows of them from its first event to the
// end of its work. Its work ends before teardown: at the highest live host
// total read in the last quarter of its life (an interpreter that frees
// its objects at exit is not shrinking), or at its last event. Too short a
// life, or too few allocations, leave the plan empty, with `plan`'s note.
inline constexpr size_t kTimeWindows = 20;
inline constexpr double kMinTimeWindowSpanSeconds = 1.0;
inline constexpr size_t kMinTimeWindowAllocations = 64;
StepPlan plan_time_windows(const AllocationSequence& sequence, const std::vector<TraceSample>& samples, StepPlan plan);

// `feed` with the plan's step events inserted; the events must come in the
// order the sequence saw them.
EventFeed with_steps(const EventFeed& feed, const std::vector<uint64_t>& ends, bool by_time = false);

// `feed` without the step events of one source.
EventFeed without_step_source(const EventFeed& feed, uint8_t source);

}  // namespace memledger::report
