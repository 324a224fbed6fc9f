#include "auto_steps.h"

#include <cstdio>

namespace memledger::report {

StepPlan plan_steps(const AllocationSequence& sequence) {
  StepPlan plan;
  if (sequence.saw_steps()) return plan;  // markers decide
  const InferredSteps inferred = infer_steps(sequence.symbols(), sequence.freed_at(), {}, sequence.places());
  if (inferred.ends.empty()) {
    plan.note = "automatic steps: " + inferred.description +
                " (for steps, call memledger.step() at the end of each, or run with --step-interval SECONDS)";
    return plan;
  }
  plan.ends = sequence.step_end_events(inferred);
  plan.description = inferred.description;
  if (sequence.truncated()) {
    plan.description += " (in the first " + std::to_string(sequence.symbols().size()) + " allocations)";
  }
  return plan;
}

StepPlan plan_time_windows(const AllocationSequence& sequence, const std::vector<TraceSample>& samples, StepPlan plan) {
  if (sequence.saw_steps() || !plan.ends.empty()) return plan;
  const uint64_t first = sequence.first_ts();
  uint64_t end = sequence.last_ts();
  const double life = static_cast<double>(end - first) / 1e9;
  if (first == 0 || life < kMinTimeWindowSpanSeconds || sequence.allocations() < kMinTimeWindowAllocations) {
    return plan;
  }
  const uint64_t last_quarter = end - (end - first) / 4;
  int64_t highest = -1;
  uint64_t at = 0;
  for (const TraceSample& s : samples) {
    if (s.ts < last_quarter || s.ts > end) continue;
    if (s.host_live >= highest) {
      highest = s.host_live;
      at = s.ts;
    }
  }
  if (highest >= 0) end = at;
  const uint64_t span = end - first;
  for (size_t k = 1; k <= kTimeWindows; ++k) plan.ends.push_back(first + span * k / kTimeWindows);
  plan.by_time = true;
  plan.window_seconds = static_cast<double>(span) / 1e9 / kTimeWindows;
  char text[160];
  std::snprintf(text, sizeof text, "%zu equal time windows of %.3g s over the %.3g s of its work", kTimeWindows,
                plan.window_seconds, static_cast<double>(span) / 1e9);
  plan.description = text;
  plan.note += (plan.note.empty() ? "" : "; ") + std::string("growth is judged over time windows instead of steps");
  return plan;
}

EventFeed with_steps(const EventFeed& feed, const std::vector<uint64_t>& ends, bool by_time) {
  return [&feed, &ends, by_time](const EventBatchFn& on_events) {
    StepInserter insert(ends, on_events, by_time);
    feed(std::ref(insert));
    insert.finish();
  };
}

EventFeed without_step_source(const EventFeed& feed, uint8_t source) {
  return [&feed, source](const EventBatchFn& on_events) {
    std::vector<TraceEvent> kept;
    feed([&](const TraceEvent* events, size_t count) {
      kept.clear();
      for (size_t i = 0; i < count; ++i) {
        if (events[i].type != EvType::kStep || events[i].flags != source) kept.push_back(events[i]);
      }
      if (!kept.empty()) on_events(kept.data(), kept.size());
    });
  };
}

}  // namespace memledger::report
