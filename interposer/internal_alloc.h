// Memory for memledger's own use. It never goes through the hooked malloc:
// glibc's __libc_* entry points reach the real allocator directly, so the
// tracer's bookkeeping is never recorded as the program's memory and never
// recurses into the hooks.
#pragma once

#include <cstddef>
#include <new>

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* ptr, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void* __libc_valloc(size_t size);
void* __libc_pvalloc(size_t size);
void __libc_free(void* ptr);
}

namespace memledger::interposer {

// A standard allocator over the real malloc, for containers the writer keeps.
template <typename T>
struct InternalAllocator {
  using value_type = T;
  InternalAllocator() = default;
  template <typename U>
  InternalAllocator(const InternalAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = __libc_malloc(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { __libc_free(p); }
  template <typename U>
  bool operator==(const InternalAllocator<U>&) const { return true; }
};

}  // namespace memledger::interposer
