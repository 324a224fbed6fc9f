// A first-fit allocator over [base, base + size): device address space, pool
// chunks and physical-memory offsets are all carved with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "internal_heap.h"

namespace memledger::simcuda {

class AddressRange {
 public:
  AddressRange() = default;
  AddressRange(uintptr_t base, size_t size);

  // The lowest free address aligned to `alignment` (a power of two) with
  // `size` bytes free after it, now taken; nullopt when none.
  std::optional<uintptr_t> allocate(size_t size, size_t alignment);
  // Takes exactly [addr, addr + size) if all of it is free.
  bool allocate_at(uintptr_t addr, size_t size);
  // Gives back a range taken before (merged with free neighbours).
  void release(uintptr_t addr, size_t size);

  uintptr_t base() const { return base_; }
  size_t size() const { return size_; }
  bool contains(uintptr_t addr) const { return addr >= base_ && addr - base_ < size_; }
  bool empty() const { return size_ == 0; }

 private:
  uintptr_t base_ = 0;
  size_t size_ = 0;
  InternalMap<uintptr_t, size_t> free_;  // start -> length, never adjacent
};

inline size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace memledger::simcuda
