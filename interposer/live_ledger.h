// Exact live and held bytes of the device-side kinds (device per GPU,
// managed, pinned host) as the CUDA hooks see them, so that a program can
// read its own figures now (memledger_live) instead of from the trace. A
// free names only an address, so the ledger keeps each live block's size,
// kind and device; device events are rare and large, so one spin lock and
// an open-addressing table in the ledger's own mmap'ed memory suffice.
// Host live bytes need no table: the rings count them (event_ring.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "spin_lock.h"
#include "trace_format.h"

namespace memledger::interposer {

class LiveLedger {
 public:
  static constexpr int kMaxGpus = 16;

  // `seq`: the event's sequence number. A free numbered before its real call
  // (recorder.h, on_device_free) can arrive after another thread got the
  // same address again: a block allocated after the free is not the one it
  // frees. 0: numbered at the free (frees whatever is there).
  void on_alloc(format::Kind kind, uint32_t flags, int device, uint64_t addr, uint64_t size, uint64_t seq);
  void on_free(format::Kind kind, uint32_t flags, uint64_t addr, uint64_t seq);
  // Whether a block at `addr` is live (device-side kinds; `flags` tells a
  // VMM handle from an address).
  bool contains(uint32_t flags, uint64_t addr);
  // A pool's reserved bytes at its latest sample (step ends): part of held.
  void on_pool_sample(int device, uint64_t pool, uint64_t reserved);
  // A forked child owns none of its parent's device memory.
  void reset_after_fork();

  struct Totals {
    int64_t live[format::kKindCount];
    uint64_t held[format::kKindCount];
    uint32_t gpus;  // highest device ordinal seen + 1 (at most kMaxGpus)
    int64_t device_live[kMaxGpus];
    uint64_t device_held[kMaxGpus];
  };
  void read(Totals& out) const;

 private:
  struct Block {
    uint64_t key;  // 0: empty slot
    uint64_t size;
    uint64_t held;
    uint64_t seq;
    uint8_t kind;
    uint8_t device;
  };
  struct Pool {
    std::atomic<uint64_t> handle{0};
    std::atomic<uint64_t> reserved{0};
    std::atomic<int> device{0};
  };
  static constexpr int kMaxPools = 64;

  // Called with lock_ held.
  void add(uint8_t kind, uint8_t device, int64_t live, int64_t held);
  bool grow();
  size_t slot_of(uint64_t key) const;

  SpinLock lock_;
  Block* table_ = nullptr;
  size_t capacity_ = 0;  // a power of two
  size_t used_ = 0;
  std::atomic<int64_t> live_[format::kKindCount] = {};
  std::atomic<int64_t> held_[format::kKindCount] = {};
  std::atomic<int64_t> device_live_[kMaxGpus] = {};
  std::atomic<int64_t> device_held_[kMaxGpus] = {};
  std::atomic<uint32_t> gpus_{0};
  Pool pools_[kMaxPools];
};

LiveLedger& live_ledger();

}  // namespace memledger::interposer
