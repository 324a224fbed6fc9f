#include "auto_steps.h"

namespace memledger::report {

StepPlan plan_steps(const AllocationSequence& sequence) {
  StepPlan plan;
  if (sequence.saw_steps()) return plan;  // markers decide
  const InferredSteps inferred = infer_steps(sequence.symbols(), sequence.freed_at());
  if (inferred.ends.empty()) {
    plan.note = "automatic steps: " + inferred.description;
    return plan;
  }
  plan.ends = sequence.step_end_events(inferred);
  plan.description = inferred.description;
  if (sequence.truncated()) {
    plan.description += " (in the first " + std::to_string(sequence.symbols().size()) + " allocations)";
  }
  return plan;
}

EventFeed with_steps(const EventFeed& feed, const std::vector<uint64_t>& ends) {
  return [&feed, &ends](const EventBatchFn& on_events) {
    StepInserter insert(ends, on_events);
    feed(std::ref(insert));
    insert.finish();
  };
}

}  // namespace memledger::report
