#include "buffer_pool.h"

#include <sys/mman.h>

namespace memledger::cupti {

static_assert(BufferPool::kBufferCount <= 64, "one bit per buffer in a 64-bit word");

bool BufferPool::init() {
  void* p = mmap(nullptr, kBufferSize * kBufferCount, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return false;
  base_ = static_cast<uint8_t*>(p);
  return true;
}

uint8_t* BufferPool::take() {
  if (base_ == nullptr) return nullptr;
  uint64_t used = in_use_.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t all = kBufferCount == 64 ? ~uint64_t{0} : (uint64_t{1} << kBufferCount) - 1;
    const uint64_t free_bits = ~used & all;
    if (free_bits == 0) {
      exhausted_.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    const int index = __builtin_ctzll(free_bits);
    if (in_use_.compare_exchange_weak(used, used | uint64_t{1} << index, std::memory_order_acq_rel)) {
      return base_ + static_cast<size_t>(index) * kBufferSize;
    }
  }
}

void BufferPool::give_back(uint8_t* buffer) {
  if (!owns(buffer)) return;
  const size_t index = static_cast<size_t>(buffer - base_) / kBufferSize;
  // The pages go back to the system; the range stays reserved for reuse.
  madvise(buffer, kBufferSize, MADV_DONTNEED);
  in_use_.fetch_and(~(uint64_t{1} << index), std::memory_order_acq_rel);
}

bool BufferPool::owns(const uint8_t* buffer) const {
  return base_ != nullptr && buffer >= base_ && buffer < base_ + kBufferSize * kBufferCount &&
         (static_cast<size_t>(buffer - base_) % kBufferSize) == 0;
}

}  // namespace memledger::cupti
