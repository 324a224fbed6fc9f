// When the trace's samples read the host allocator's statistics again
// (trace_writer.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

namespace memledger::interposer {

// The allocator's held and in-use bytes, read for the samples. glibc's
// mallinfo2 locks each arena in turn and walks its free lists: tens of
// microseconds on a busy heap, milliseconds on PyTorch's, while the program's
// threads that allocate wait for their arena. A loop that ends a step every
// few milliseconds would spend a large share of its time waiting. So a step
// end does not read them again while both of these hold:
// - the last reading is under kMinGapNs old, or under kDutyFactor times as
//   old as it took (so slow readings take at most about 1/kDutyFactor of the
//   time);
// - the host's live bytes (exact in both modes) have moved by less than
//   kMinDrift or 1/64 of the held bytes read, whichever is larger.
// A leak or a growing peak of live bytes is so read at the step where it
// shows. A reading not taken again is the last one plus what live bytes grew
// since: what that growth can have added to held and in-use bytes at most,
// so held bytes never read below live for it. Held bytes that grow while live
// bytes do not (the arenas' free space fragmenting) show at the next reading,
// within kMinGapNs (or kDutyFactor times a slow reading's duration). The
// final sample and the periodic ones always read.
struct HeldReading {
  static constexpr uint64_t kMinGapNs = 20'000'000;
  static constexpr uint64_t kDutyFactor = 32;
  static constexpr int64_t kMinDrift = 256 << 10;

  // What the sample writes (0: the allocator offers no such figure).
  uint64_t held = 0;
  uint64_t in_use = 0;

  // `stats(&held, &in_use)` reads the allocator's statistics; `clock()` is
  // the monotonic clock, as `now` was read. True when it read them.
  template <typename Stats, typename Clock>
  bool read(bool force, uint64_t now, int64_t live_now, Stats&& stats, Clock&& clock) {
    if (!force && taken_) {
      const uint64_t age = now - at_ns_;
      const int64_t drift = std::max<int64_t>(kMinDrift, static_cast<int64_t>(read_held_ / 64));
      const int64_t moved = live_now > live_ ? live_now - live_ : live_ - live_now;
      if (age < std::max(kMinGapNs, kDutyFactor * took_ns_) && moved < drift) {
        const uint64_t grew = live_now > live_ ? static_cast<uint64_t>(live_now - live_) : 0;
        held = read_held_ == 0 ? 0 : read_held_ + grew;
        in_use = read_in_use_ == 0 ? 0 : read_in_use_ + grew;
        return false;
      }
    }
    read_held_ = 0;
    read_in_use_ = 0;
    stats(&read_held_, &read_in_use_);
    const uint64_t done = clock();
    took_ns_ = done > now ? done - now : 0;
    at_ns_ = now;
    live_ = live_now;
    taken_ = true;
    held = read_held_;
    in_use = read_in_use_;
    return true;
  }

 private:
  bool taken_ = false;
  uint64_t read_held_ = 0;
  uint64_t read_in_use_ = 0;
  uint64_t at_ns_ = 0;
  uint64_t took_ns_ = 0;
  int64_t live_ = 0;
};

}  // namespace memledger::interposer
