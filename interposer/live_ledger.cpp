#include "live_ledger.h"

#include <sys/mman.h>

#include <cstring>

namespace memledger::interposer {
namespace {

LiveLedger g_ledger;

constexpr uint64_t kDeviceGranularity = 2ull << 20;

// What a block holds from the device, by the report's rule (report/analysis.cpp,
// held_for): plain allocations are rounded to the allocation granularity;
// pool blocks are held by their pool (its sampled reserve), graph allocations
// by the device's graph memory (sampled likewise); VMM physical
// allocations are granular already; registered and pinned host memory is
// the program's own pages.
uint64_t held_of(format::Kind kind, uint32_t flags, uint64_t size) {
  if (flags & (format::kAllocPool | format::kAllocRegistered | format::kAllocGraph)) return 0;
  if (flags & format::kAllocPhysical) return size;
  if (kind == format::Kind::kPinnedHost) return 0;
  return (size + kDeviceGranularity - 1) / kDeviceGranularity * kDeviceGranularity;
}

// Device-visible addresses and VMM physical handles are separate spaces.
uint64_t key_of(uint32_t flags, uint64_t addr) {
  return addr ^ ((flags & format::kAllocPhysical) ? 2ull << 60 : 1ull << 60);
}

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

LiveLedger& live_ledger() { return g_ledger; }

size_t LiveLedger::slot_of(uint64_t key) const {
  size_t i = mix(key) & (capacity_ - 1);
  while (table_[i].key != 0 && table_[i].key != key) i = (i + 1) & (capacity_ - 1);
  return i;
}

// Doubles the table (or makes the first one); false when memory is short,
// and the block is then left out of the figures.
bool LiveLedger::grow() {
  const size_t capacity = capacity_ ? capacity_ * 2 : 4096;
  void* mem = mmap(nullptr, capacity * sizeof(Block), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return false;
  Block* old = table_;
  const size_t old_capacity = capacity_;
  table_ = static_cast<Block*>(mem);
  capacity_ = capacity;
  for (size_t i = 0; i < old_capacity; ++i) {
    if (old[i].key != 0) table_[slot_of(old[i].key)] = old[i];
  }
  if (old) munmap(old, old_capacity * sizeof(Block));
  return true;
}

namespace {
// The totals' one writer at a time holds the ledger's lock: a plain add,
// stored whole for the readers that do not take it (read()).
inline void add_to(std::atomic<int64_t>& total, int64_t delta) {
  total.store(total.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
}
}  // namespace

void LiveLedger::add(uint8_t kind, uint8_t device, int64_t live, int64_t held) {
  add_to(live_[kind], live);
  add_to(held_[kind], held);
  if (kind == static_cast<uint8_t>(format::Kind::kDevice) && device < kMaxGpus) {
    add_to(device_live_[device], live);
    add_to(device_held_[device], held);
  }
}

void LiveLedger::on_alloc(format::Kind kind, uint32_t flags, int device, uint64_t addr, uint64_t size,
                          uint64_t seq) {
  if (kind == format::Kind::kHost || static_cast<int>(kind) >= format::kKindCount) return;
  const uint8_t dev = static_cast<uint8_t>(device < 0 ? 0 : device > 255 ? 255 : device);
  const Block block{key_of(flags, addr), size, held_of(kind, flags, size), seq, static_cast<uint8_t>(kind), dev};
  SpinGuard guard(lock_);
  if ((used_ + 1) * 2 > capacity_ && !grow()) return;
  Block& slot = table_[slot_of(block.key)];
  if (slot.key == block.key) {
    // Allocated again without a free we saw: the new block replaces it.
    add(slot.kind, slot.device, -static_cast<int64_t>(slot.size), -static_cast<int64_t>(slot.held));
  } else {
    ++used_;
  }
  slot = block;
  add(block.kind, block.device, static_cast<int64_t>(size), static_cast<int64_t>(block.held));
  if (block.kind == static_cast<uint8_t>(format::Kind::kDevice) && dev < kMaxGpus) {
    uint32_t seen = gpus_.load(std::memory_order_relaxed);
    if (dev + 1u > seen) gpus_.store(dev + 1u, std::memory_order_relaxed);
  }
}

void LiveLedger::on_free(format::Kind kind, uint32_t flags, uint64_t addr, uint64_t seq) {
  if (kind == format::Kind::kHost) return;
  const uint64_t key = key_of(flags, addr);
  SpinGuard guard(lock_);
  if (capacity_ == 0) return;
  size_t i = slot_of(key);
  if (table_[i].key != key) return;  // not seen allocated (before tracing, or left out)
  if (seq != 0 && table_[i].seq > seq) return;  // a newer block at a reused address
  add(table_[i].kind, table_[i].device, -static_cast<int64_t>(table_[i].size),
      -static_cast<int64_t>(table_[i].held));
  --used_;
  // Backward-shift deletion keeps every probe chain unbroken without tombstones.
  size_t hole = i;
  for (size_t j = (i + 1) & (capacity_ - 1); table_[j].key != 0; j = (j + 1) & (capacity_ - 1)) {
    const size_t home = mix(table_[j].key) & (capacity_ - 1);
    const bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      table_[hole] = table_[j];
      hole = j;
    }
  }
  table_[hole].key = 0;
}

bool LiveLedger::contains(uint32_t flags, uint64_t addr) {
  const uint64_t key = key_of(flags, addr);
  SpinGuard guard(lock_);
  return capacity_ != 0 && table_[slot_of(key)].key == key;
}

void LiveLedger::on_pool_sample(int device, uint64_t pool, uint64_t reserved) {
  for (Pool& p : pools_) {
    uint64_t handle = p.handle.load(std::memory_order_acquire);
    if (handle == 0) {
      SpinGuard guard(lock_);
      handle = p.handle.load(std::memory_order_relaxed);
      if (handle == 0) {
        p.device.store(device, std::memory_order_relaxed);
        p.reserved.store(reserved, std::memory_order_relaxed);
        p.handle.store(pool, std::memory_order_release);
        return;
      }
    }
    if (handle == pool) {
      p.reserved.store(reserved, std::memory_order_relaxed);
      return;
    }
  }
}

void LiveLedger::reset_after_fork() {
  lock_.reset();
  if (capacity_ != 0) memset(static_cast<void*>(table_), 0, capacity_ * sizeof(Block));
  used_ = 0;
  for (int k = 0; k < format::kKindCount; ++k) {
    live_[k].store(0, std::memory_order_relaxed);
    held_[k].store(0, std::memory_order_relaxed);
  }
  for (int d = 0; d < kMaxGpus; ++d) {
    device_live_[d].store(0, std::memory_order_relaxed);
    device_held_[d].store(0, std::memory_order_relaxed);
  }
  for (Pool& p : pools_) {
    p.handle.store(0, std::memory_order_relaxed);
    p.reserved.store(0, std::memory_order_relaxed);
  }
}

void LiveLedger::read(Totals& out) const {
  for (int k = 0; k < format::kKindCount; ++k) {
    out.live[k] = live_[k].load(std::memory_order_relaxed);
    const int64_t held = held_[k].load(std::memory_order_relaxed);
    out.held[k] = held > 0 ? static_cast<uint64_t>(held) : 0;
  }
  out.gpus = gpus_.load(std::memory_order_relaxed);
  for (int d = 0; d < kMaxGpus; ++d) {
    out.device_live[d] = device_live_[d].load(std::memory_order_relaxed);
    const int64_t held = device_held_[d].load(std::memory_order_relaxed);
    out.device_held[d] = held > 0 ? static_cast<uint64_t>(held) : 0;
  }
  for (const Pool& p : pools_) {
    if (p.handle.load(std::memory_order_acquire) == 0) break;
    const uint64_t reserved = p.reserved.load(std::memory_order_relaxed);
    const int device = p.device.load(std::memory_order_relaxed);
    out.held[static_cast<int>(format::Kind::kDevice)] += reserved;
    if (device >= 0 && device < kMaxGpus) {
      out.device_held[device] += reserved;
      if (static_cast<uint32_t>(device) + 1 > out.gpus) out.gpus = static_cast<uint32_t>(device) + 1;
    }
  }
}

}  // namespace memledger::interposer
