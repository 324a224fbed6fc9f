#include "device.h"

#include <sys/mman.h>

namespace memledger::simcuda {

bool Device::init(int ordinal, size_t capacity) {
  ordinal_ = ordinal;
  capacity_ = capacity;
  held_ = 0;
  // Four times the capacity: room for address-space fragmentation, so that
  // what fails first is the capacity, as on a real GPU.
  const size_t span = 4 * capacity;
  const uintptr_t base = reserve_address_space(span);
  if (base == 0) return false;
  linear_ = AddressRange(base, span);
  return true;
}

bool Device::hold(size_t bytes) {
  if (bytes > capacity_ - held_) return false;
  held_ += bytes;
  return true;
}

std::optional<uintptr_t> Device::map_linear(size_t bytes) {
  std::optional<uintptr_t> addr = linear_.allocate(bytes, kGranularity);
  if (!addr) return std::nullopt;
  if (!make_accessible(*addr, bytes)) {
    linear_.release(*addr, bytes);
    return std::nullopt;
  }
  return addr;
}

void Device::unmap_linear(uintptr_t addr, size_t bytes) {
  discard_pages(addr, bytes);
  linear_.release(addr, bytes);
}

bool make_accessible(uintptr_t addr, size_t bytes) {
  return mprotect(reinterpret_cast<void*>(addr), bytes, PROT_READ | PROT_WRITE) == 0;
}

void discard_pages(uintptr_t addr, size_t bytes) {
  void* p = reinterpret_cast<void*>(addr);
  madvise(p, bytes, MADV_DONTNEED);
  mprotect(p, bytes, PROT_NONE);
}

AddressRange reserve_low32(size_t span) {
  constexpr uintptr_t k4GiB = uintptr_t{1} << 32;
  auto below_4gib = [span](uintptr_t base) { return base != 0 && base + span <= k4GiB; };
  uintptr_t base = reserve_address_space(span, MAP_32BIT);
  for (uintptr_t hint = uintptr_t{1} << 30; !below_4gib(base) && hint + span <= k4GiB; hint += span) {
    if (base != 0) munmap(reinterpret_cast<void*>(base), span);
    void* p = mmap(reinterpret_cast<void*>(hint), span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base = p == MAP_FAILED ? 0 : reinterpret_cast<uintptr_t>(p);
  }
  if (!below_4gib(base)) {
    if (base != 0) munmap(reinterpret_cast<void*>(base), span);
    return AddressRange();
  }
  return AddressRange(base, span);
}

uintptr_t reserve_address_space(size_t bytes, int extra_flags) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
  return p == MAP_FAILED ? 0 : reinterpret_cast<uintptr_t>(p);
}

}  // namespace memledger::simcuda
