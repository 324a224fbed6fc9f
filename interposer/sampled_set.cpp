#include "sampled_set.h"

#include "internal_alloc.h"

namespace memledger::interposer {

void AddressSet::resize(size_t capacity) {
  // glibc's own heap: the hooks may be what calls this.
  auto* slots = static_cast<uintptr_t*>(__libc_calloc(capacity, sizeof(uintptr_t)));
  if (slots == nullptr) return;  // keeps the old table
  uintptr_t* old = slots_;
  const size_t old_capacity = capacity_;
  slots_ = slots;
  capacity_ = capacity;
  for (size_t k = 0; k < old_capacity; ++k) {
    if (old[k] == 0) continue;
    size_t i = home(old[k]);
    while (slots_[i] != 0) i = (i + 1) & (capacity_ - 1);
    slots_[i] = old[k];
  }
  __libc_free(old);
}

bool AddressSet::insert(uintptr_t addr) {
  if ((used_ + 1) * 2 > capacity_) {
    resize(capacity_ == 0 ? kMinCapacity : capacity_ * 2);
    if (used_ + 1 >= capacity_) return false;  // no room and no memory for more
  }
  const size_t mask = capacity_ - 1;
  size_t i = home(addr);
  while (slots_[i] != 0) {
    if (slots_[i] == addr) return true;
    i = (i + 1) & mask;
  }
  slots_[i] = addr;
  ++used_;
  return true;
}

bool AddressSet::contains(uintptr_t addr) const {
  if (used_ == 0) return false;
  for (size_t i = home(addr); slots_[i] != 0; i = (i + 1) & (capacity_ - 1)) {
    if (slots_[i] == addr) return true;
  }
  return false;
}

bool AddressSet::erase(uintptr_t addr) {
  if (used_ == 0) return false;
  const size_t mask = capacity_ - 1;
  size_t i = home(addr);
  while (slots_[i] != addr) {
    if (slots_[i] == 0) return false;
    i = (i + 1) & mask;
  }
  // Backward shift: each later entry of the run whose home does not lie
  // after the hole (cyclically, up to the entry) moves into the hole.
  for (size_t j = (i + 1) & mask; slots_[j] != 0; j = (j + 1) & mask) {
    if (((j - home(slots_[j])) & mask) >= ((j - i) & mask)) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = 0;
  --used_;
  if (capacity_ > kMinCapacity && used_ * 8 < capacity_) resize(capacity_ / 2);
  return true;
}

}  // namespace memledger::interposer
