#include "stack_table.h"

#include <cstring>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>

namespace memledger::interposer {
namespace {

void* map_reserve(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

uint64_t hash_frames(const uintptr_t* frames, uint32_t depth) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ depth;
  for (uint32_t i = 0; i < depth; ++i) {
    h ^= frames[i];
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h | 1;  // never 0, the empty marker
}

}  // namespace

bool StackTable::init() {
  slots_ = static_cast<Slot*>(map_reserve(sizeof(Slot) * kSlots));
  offsets_ = static_cast<std::atomic<uint64_t>*>(
      map_reserve(sizeof(std::atomic<uint64_t>) * (kMaxStacks + 1)));
  arena_ = static_cast<uint8_t*>(map_reserve(kArenaBytes));
  return slots_ != nullptr && offsets_ != nullptr && arena_ != nullptr;
}

bool StackTable::get(uint32_t id, const uintptr_t** frames, uint32_t* depth) const {
  if (id == 0 || id > kMaxStacks) return false;
  uint64_t off = offsets_[id].load(std::memory_order_acquire);
  if (off == 0) return false;
  const uint8_t* p = arena_ + (off - 1);
  uint32_t d;
  memcpy(&d, p, sizeof d);
  *depth = d;
  *frames = reinterpret_cast<const uintptr_t*>(p + 8);
  return true;
}

uint32_t StackTable::publish(Slot& slot, const uintptr_t* frames, uint32_t depth) {
  uint32_t id = next_id_.fetch_add(1, std::memory_order_acq_rel);
  if (id > kMaxStacks) {
    slot.id.store(UINT32_MAX, std::memory_order_release);
    return 0;
  }
  size_t bytes = 8 + sizeof(uintptr_t) * depth;
  size_t off = arena_used_.fetch_add(bytes, std::memory_order_relaxed);
  if (off + bytes > kArenaBytes) {
    slot.id.store(UINT32_MAX, std::memory_order_release);
    return 0;
  }
  uint8_t* p = arena_ + off;
  uint64_t d = depth;
  memcpy(p, &d, sizeof d);
  memcpy(p + 8, frames, sizeof(uintptr_t) * depth);
  offsets_[id].store(off + 1, std::memory_order_release);
  slot.id.store(id, std::memory_order_release);
  return id;
}

uint32_t StackTable::intern(const uintptr_t* frames, uint32_t depth) {
  if (slots_ == nullptr) return 0;
  if (depth > kMaxDepth) depth = kMaxDepth;
  const uint64_t h = hash_frames(frames, depth);
  uint32_t index = static_cast<uint32_t>(h) & (kSlots - 1);
  for (uint32_t probe = 0; probe < kSlots; ++probe, index = (index + 1) & (kSlots - 1)) {
    Slot& slot = slots_[index];
    uint64_t seen = slot.hash.load(std::memory_order_acquire);
    if (seen == 0) {
      if (!slot.hash.compare_exchange_strong(seen, h, std::memory_order_acq_rel)) {
        if (seen != h) continue;  // another stack took the slot
      } else {
        // We own the slot: copy the frames, then publish the id.
        publishing_.fetch_add(1, std::memory_order_acq_rel);
        const uint32_t id = publish(slot, frames, depth);
        publishing_.fetch_sub(1, std::memory_order_acq_rel);
        return id;
      }
    }
    if (seen != h) continue;
    // Same hash: wait for the owner to publish, then compare frames. An
    // owner preempted on a loaded machine may take many time slices; one
    // that never publishes was a thread lost in fork() (the fork handler
    // waits for interns in flight, so only a thread that began after it):
    // after a second, mark its slot abandoned so no one waits on it again.
    uint32_t id = 0;
    for (int spin = 0; spin < 1000 + 20000; ++spin) {
      id = slot.id.load(std::memory_order_acquire);
      if (id != 0) break;
      if (spin < 1000) {
        sched_yield();
      } else {
        timespec pause = {0, 50000};
        nanosleep(&pause, nullptr);
      }
    }
    if (id == 0) slot.id.compare_exchange_strong(id, UINT32_MAX, std::memory_order_acq_rel);
    if (id == 0 || id == UINT32_MAX) continue;
    const uintptr_t* other;
    uint32_t other_depth;
    if (get(id, &other, &other_depth) && other_depth == depth &&
        memcmp(other, frames, sizeof(uintptr_t) * depth) == 0) {
      return id;
    }
  }
  return 0;
}

}  // namespace memledger::interposer
