// Automatic steps: when a trace has no step markers, finds the training loop
// in the sequence of allocations and places a step boundary between its
// iterations (DESIGN.md, "Step", source `auto`).
//
// A training loop allocates the same things in the same order every
// iteration. Each allocation is reduced to a symbol (its site and size); the
// symbols that occur exactly N times and interleave with one another, the
// i-th occurrence of each falling between the i-th and (i+1)-th occurrence of
// the earliest of them, are the loop's anchors, and N is the number of
// steps. Allocations that occur a varying number of times per step (caches,
// growing containers, sampled allocations, other threads) are noise that the
// anchors ignore; one-off allocations (imports, compilation, warm-up) occur
// once and are never anchors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "trace_reader.h"

namespace memledger::report {

struct StepInferenceOptions {
  size_t min_steps = 3;         // fewer repetitions are not a loop
  size_t min_anchors = 3;       // symbols that must recur once per step...
  size_t min_anchors_long = 2;  // ...or this many, in a loop of at least long_loop steps
  size_t long_loop = 8;         // (two symbols interleaving 8 times is no coincidence)
};

// What inference found, in allocation indices (positions in the sequence).
struct InferredSteps {
  // Step k (0-based) covers allocations [begin_k, ends[k]), where begin_0 = 0
  // and begin_k = ends[k-1]. Empty when no loop was found.
  std::vector<size_t> ends;
  // The last anchor of each step. The allocations that follow the last one
  // (teardown) do not tell where the last step ends; the events do
  // (events_between_steps).
  std::vector<size_t> last_anchors;
  size_t period = 0;   // median allocations per step (between consecutive anchor heads)
  size_t anchors = 0;  // symbols that occur exactly once in every step
  std::string description;  // "inferred period N allocations per step ..." or why nothing was found
};

// Finds the loop in a sequence of allocation symbols (one per allocation, in
// order; equal symbols = same site and size). A symbol with kNeverAnchor set
// takes its place in the sequence but is never an anchor: an allocation that
// sampling recorded by chance recurs a random number of times.
//
// `freed_at`, when given, holds for each allocation how many allocations had
// been made when it was freed (kNeverFreed: never). A training step frees
// most of what it allocates within a step or two (activations, gradients,
// batches, the previous parameters of a functional update); a loop that
// builds something (the layers of a model, tables at import) keeps it. A
// loop is then the step only if at least one of its anchors is freed again
// within two iterations, in most of them.
//
// A symbol with kUnderPython set was allocated under Python code (its stack
// has Python frames). In a Python program the training loop is Python code:
// when some loop has an anchor allocated under Python, loops without one (a
// compiler's passes or a thread pool's tasks on threads of their own) are
// not the step. A symbol with kUnderImport set was allocated while a module
// was being imported (importlib's frames are on its stack): a loop all of
// whose anchors are such (a package registering its operators, one module
// after another) is not the step either, when another loop qualifies.
inline constexpr uint64_t kNeverAnchor = uint64_t{1} << 63;
inline constexpr uint64_t kUnderPython = uint64_t{1} << 62;
inline constexpr uint64_t kUnderImport = uint64_t{1} << 61;
inline constexpr uint32_t kNeverFreed = UINT32_MAX;
//
// `places` (optional, one per symbol): where Python was when the symbol was
// allocated, as a hash of its innermost Python frame with its instruction
// (0: no Python frame). A training loop steps through lines of Python; a
// loop inside one native call (a framework registering its devices,
// filling a table) allocates all its anchors under one Python instruction.
// Among loops under Python, those whose anchors were allocated at two
// places or more win.
InferredSteps infer_steps(const std::vector<uint64_t>& symbols, const std::vector<uint32_t>& freed_at = {},
                          const StepInferenceOptions& options = {}, const std::vector<uint32_t>& places = {});

// An inferred step event has this source (in `flags`); it is never written
// to a trace.
inline constexpr uint8_t kInferredStepSource = 0xff;
// A step that is one of equal time windows over a process that has no steps
// of any other kind (source "time"); never written to a trace either.
inline constexpr uint8_t kTimeWindowStepSource = 0xfe;

// Collects the allocation symbols (site, kind and size) of a trace as its
// events stream by, with each allocation's position among all events, the
// frees of those allocations, and whether any step event was among them. At
// most `limit` allocations are kept (about 40 bytes each with their frees);
// inference then sees only the beginning of the run.
class AllocationSequence {
 public:
  // `trace` gives the stacks of the events (to tell Python frames).
  explicit AllocationSequence(const Trace& trace, size_t limit = size_t{1} << 24) : trace_(trace), limit_(limit) {}
  void observe(const TraceEvent* events, size_t count);
  bool saw_steps() const { return saw_steps_; }
  // The trace's own steps came from a data loader (source "loader") and from
  // another source too (a marker the program began to call later): the
  // loader's steps are then dropped (without_step_source).
  bool mixed_loader_steps() const;
  // Timestamps of the first and last event seen (0 when none).
  uint64_t first_ts() const { return first_ts_; }
  uint64_t last_ts() const { return last_ts_; }
  size_t allocations() const { return allocations_; }
  bool truncated() const { return truncated_; }
  const std::vector<uint64_t>& symbols() const { return symbols_; }
  const std::vector<uint32_t>& freed_at() const { return freed_at_; }
  const std::vector<uint32_t>& places() const { return places_; }
  // Step ends as event positions: a step event goes before the event at
  // each position (a position past the last event: after it). Steps end
  // before the allocation that begins the next one. The last step ends
  // where the events that ended the step before it (the allocations and
  // frees between its last anchor and the next step) have happened again,
  // and no more events after its last anchor than the other steps had (the
  // median): what follows is teardown.
  std::vector<uint64_t> step_end_events(const InferredSteps& steps) const;

 private:
  struct StackInfo {
    uint64_t traits;    // kUnderPython, kUnderImport
    uint64_t identity;  // the stack id, or for an attributed stack its native frames
    uint32_t place;     // its innermost Python frame, hashed (infer_steps' `places`); 0: none
    bool memledger;     // under memledger's own Python helpers (the retention walk)
  };
  const StackInfo& stack_info(uint32_t stack);

  const Trace& trace_;
  size_t limit_;
  absl::flat_hash_map<uint32_t, StackInfo> stack_info_;
  std::vector<uint64_t> symbols_;
  std::vector<uint32_t> places_;
  std::vector<uint64_t> event_index_;  // of each allocation
  std::vector<uint32_t> freed_at_;     // of each allocation: symbols_.size() at its free
  struct Free {
    uint64_t event;
    uint64_t symbol;  // of the allocation it frees, marked as a free
  };
  std::vector<Free> frees_;
  // Allocations and frees with event positions in [from, to), in order.
  std::vector<Free> symbol_events(uint64_t from, uint64_t to) const;
  absl::flat_hash_map<uint64_t, uint32_t> live_;  // address -> allocation index
  uint64_t events_ = 0;
  uint64_t first_ts_ = 0, last_ts_ = 0;
  size_t allocations_ = 0;
  bool saw_steps_ = false;
  uint32_t step_sources_ = 0;  // bit (1 << source) of each step source seen (sources below 32)
  bool truncated_ = false;
};

// Passes events on to `next` with an inferred step event inserted at each
// position of AllocationSequence::step_end_events; `finish` delivers the
// steps that end after the last event. The events must come in the order
// AllocationSequence saw them.
class StepInserter {
 public:
  StepInserter(std::vector<uint64_t> ends, EventBatchFn next) : ends_(std::move(ends)), next_(std::move(next)) {}
  // Ends given as timestamps (ns): a window's step event goes before the
  // first event at or after its end.
  StepInserter(std::vector<uint64_t> ends, EventBatchFn next, bool by_time)
      : ends_(std::move(ends)), next_(std::move(next)), by_time_(by_time) {}
  void operator()(const TraceEvent* events, size_t count);
  void finish();

 private:
  TraceEvent step_event(uint64_t seq, uint64_t ts);

  std::vector<uint64_t> ends_;
  EventBatchFn next_;
  bool by_time_ = false;
  uint64_t events_ = 0;   // events seen so far
  size_t next_end_ = 0;   // index into ends_
  uint64_t last_seq_ = 0;
  uint64_t last_ts_ = 0;
  std::vector<TraceEvent> buffer_;
};

}  // namespace memledger::report
