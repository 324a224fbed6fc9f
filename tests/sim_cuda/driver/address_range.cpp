#include "address_range.h"

#include <iterator>

namespace memledger::simcuda {

AddressRange::AddressRange(uintptr_t base, size_t size) : base_(base), size_(size) {
  if (size > 0) free_.emplace(base, size);
}

std::optional<uintptr_t> AddressRange::allocate(size_t size, size_t alignment) {
  if (size == 0) return std::nullopt;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uintptr_t start = it->first;
    const size_t length = it->second;
    const uintptr_t aligned = (start + alignment - 1) & ~static_cast<uintptr_t>(alignment - 1);
    if (aligned < start || aligned - start > length || length - (aligned - start) < size) continue;
    // Split the free range into [start, aligned) and [aligned + size, end).
    const uintptr_t end = start + length;
    free_.erase(it);
    if (aligned > start) free_.emplace(start, aligned - start);
    if (aligned + size < end) free_.emplace(aligned + size, end - (aligned + size));
    return aligned;
  }
  return std::nullopt;
}

bool AddressRange::allocate_at(uintptr_t addr, size_t size) {
  if (size == 0 || !contains(addr)) return false;
  auto it = free_.upper_bound(addr);
  if (it == free_.begin()) return false;
  --it;
  const uintptr_t start = it->first;
  const uintptr_t end = start + it->second;
  if (addr + size > end || addr + size < addr) return false;
  free_.erase(it);
  if (addr > start) free_.emplace(start, addr - start);
  if (addr + size < end) free_.emplace(addr + size, end - (addr + size));
  return true;
}

void AddressRange::release(uintptr_t addr, size_t size) {
  if (size == 0) return;
  uintptr_t start = addr;
  size_t length = size;
  auto next = free_.lower_bound(addr);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == addr + size) {
    length += next->second;
    free_.erase(next);
  }
  free_.emplace(start, length);
}

}  // namespace memledger::simcuda
