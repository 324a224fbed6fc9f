// Bookkeeping memory for the simulated driver, taken from mmap instead of
// malloc. A traced program's host heap must show only what the program
// itself allocates: if the driver's own maps grew through malloc, a planted
// device leak would also show up as a growing host site inside libcuda.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <new>
#include <set>
#include <utility>
#include <vector>

namespace memledger::simcuda {

void* internal_alloc(size_t bytes);
void internal_free(void* block, size_t bytes);

// std allocator over internal_alloc, for the driver's containers.
template <class T>
struct InternalAllocator {
  using value_type = T;
  InternalAllocator() = default;
  template <class U>
  InternalAllocator(const InternalAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(internal_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { internal_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const InternalAllocator<U>&) const { return true; }
};

template <class K, class V>
using InternalMap = std::map<K, V, std::less<K>, InternalAllocator<std::pair<const K, V>>>;
template <class K>
using InternalSet = std::set<K, std::less<K>, InternalAllocator<K>>;
template <class T>
using InternalVector = std::vector<T, InternalAllocator<T>>;

// new/delete for single driver objects (contexts, streams, pools).
template <class T, class... Args>
T* internal_new(Args&&... args) {
  return new (internal_alloc(sizeof(T))) T(std::forward<Args>(args)...);
}
template <class T>
void internal_delete(T* object) {
  object->~T();
  internal_free(object, sizeof(T));
}

}  // namespace memledger::simcuda
