// The writer's view of what one cycle drains: a run of events per ring,
// read where the producers wrote them and written out in the order of
// their numbers (Event::seq) across all runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "event_ring.h"

namespace memledger::interposer {

// A ring's events [pos, end), in sequence order (one producer numbers them
// as it writes them). The ring's tail stays at the first one not written
// yet: the producer does not write over them meanwhile.
struct RingRun {
  ThreadRing* ring;
  uint64_t pos;
  uint64_t end;
  bool retire;  // its thread exited and this run is its last: the ring is free once it is written
};

inline const Event& run_event(const RingRun& r) { return r.ring->events[r.pos & ThreadRing::kMask]; }

// Hands what was written of each run back to its ring's producer. A retired
// ring written to its end is free for a new thread.
inline void release_runs(RingRun* runs, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    RingRun& r = runs[i];
    r.ring->tail.store(r.pos, std::memory_order_release);
    if (r.retire && r.pos == r.end) {
      int expected = static_cast<int>(RingState::kRetired);
      r.ring->state.compare_exchange_strong(expected, static_cast<int>(RingState::kFree));
      r.retire = false;
    }
  }
}

// Calls `write` with every event of the runs in sequence order, and returns
// how many. The next event is the least of the runs' first ones; a run goes
// on while its events come before every other run's first, so one busy
// thread's run is written without a look at the others. Every
// `release_every` events the rings get back what was written (a producer
// whose ring fills waits for that), and all of it at the end.
template <typename Write>
size_t merge_runs(RingRun* runs, size_t count, Write&& write, size_t release_every = 4096) {
  size_t written = 0, released_at = 0;
  for (;;) {
    RingRun* best = nullptr;
    uint64_t best_seq = UINT64_MAX, next_seq = UINT64_MAX;
    for (size_t i = 0; i < count; ++i) {
      RingRun& r = runs[i];
      if (r.pos == r.end) continue;
      const uint64_t seq = run_event(r).seq;
      if (best == nullptr || seq < best_seq) {
        if (best != nullptr) next_seq = best_seq;
        best = &r;
        best_seq = seq;
      } else if (seq < next_seq) {
        next_seq = seq;
      }
    }
    if (best == nullptr) break;
    do {
      write(run_event(*best));
      ++best->pos;
      ++written;
    } while (best->pos != best->end && run_event(*best).seq < next_seq);
    if (written - released_at >= release_every) {
      release_runs(runs, count);
      released_at = written;
    }
  }
  release_runs(runs, count);
  return written;
}

}  // namespace memledger::interposer
