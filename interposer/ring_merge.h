// The writer's view of what one cycle drains: a run of events per ring,
// read where the producers wrote them and written out in the order of
// their numbers (Event::seq) across all runs.
#pragma once

#include <algorithm>
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

inline const Event& run_event(const RingRun& r) { return r.ring->slot(r.pos); }

// Hands what was written of each run back to its ring's producer. A retired
// ring written to its end is free for a new thread, which starts at its
// first slot: a program that makes and ends threads all the time then keeps
// touching the first pages of the rings it reuses instead of all of them.
inline void release_runs(RingRun* runs, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    RingRun& r = runs[i];
    r.ring->tail.store(r.pos, std::memory_order_release);
    if (r.retire && r.pos == r.end) {
      // No producer: its thread has gone, and the next takes it only once free.
      r.ring->head.store(0, std::memory_order_relaxed);
      r.ring->tail.store(0, std::memory_order_relaxed);
      r.ring->spill.reset_to_start();
      int expected = static_cast<int>(RingState::kRetired);
      r.ring->state.compare_exchange_strong(expected, static_cast<int>(RingState::kFree));
      r.retire = false;
      r.pos = r.end = 0;  // a later release of this run hands back the same first slot
    }
  }
}

// A run not written to its end, by the number of its next event: merge_runs'
// heap of them.
struct MergeHead {
  uint64_t seq;
  uint32_t run;
};

// Calls `write(ring, first, n)` with every event of the runs in sequence
// order, n events lying one after another in `ring` at a time (in the
// order they lie there), and returns how many
// in all. The next event is the least of the runs' next ones (a heap of them
// in `heads`, room for `count`); a run goes on while its events come before
// every other run's next one, so one busy thread's run is written in long
// stretches without a look at the others. A stretch holds at most
// `longest` events, handed over while the lines the compares read are still
// in the nearest cache (a ring's whole run is larger than the second-level
// cache); the last run left goes on without compares. Every
// `release_every` events the rings get back what was written (a producer
// whose ring fills waits for that), and all of it at the end.
template <typename Write>
size_t merge_runs(RingRun* runs, size_t count, MergeHead* heads, Write&& write, size_t release_every = 4096,
                  size_t longest = 256) {
  auto later = [](const MergeHead& a, const MergeHead& b) { return a.seq > b.seq; };
  size_t live = 0;
  for (size_t i = 0; i < count; ++i) {
    if (runs[i].pos != runs[i].end) heads[live++] = {run_event(runs[i]).seq, static_cast<uint32_t>(i)};
  }
  std::make_heap(heads, heads + live, later);
  size_t written = 0, released_at = 0;
  while (live > 0) {
    std::pop_heap(heads, heads + live, later);
    MergeHead& head = heads[live - 1];
    RingRun& r = runs[head.run];
    const uint64_t next_seq = live > 1 ? heads[0].seq : UINT64_MAX;
    do {
      // The stretch from here that comes first, up to the ring's last slot.
      const uint64_t slot = r.pos & r.ring->mask;
      const uint64_t until =
          std::min<uint64_t>({r.end, r.pos + (r.ring->capacity() - slot), r.pos + longest});
      uint64_t stop = until;
      if (live > 1) {
        stop = r.pos + 1;
        while (stop != until && r.ring->slot(stop).seq < next_seq) ++stop;
      }
      write(r.ring, &r.ring->events[slot], static_cast<size_t>(stop - r.pos));
      written += stop - r.pos;
      r.pos = stop;
      if (written - released_at >= release_every) {
        release_runs(runs, count);
        released_at = written;
      }
    } while (r.pos != r.end && run_event(r).seq < next_seq);
    if (r.pos != r.end) {
      head.seq = run_event(r).seq;
      std::push_heap(heads, heads + live, later);
    } else {
      --live;
    }
  }
  release_runs(runs, count);
  return written;
}

}  // namespace memledger::interposer
