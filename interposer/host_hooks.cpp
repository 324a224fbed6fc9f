// Hooks for the host heap: the whole malloc family. Each hook guards against
// recursion, calls the real allocator (glibc's __libc_* entry points, so no
// dlsym is needed and calls made before the library is initialised, such as
// dlsym's own calloc, are served directly), and records the result.
// Free-type hooks record before calling the real free, so the address cannot
// be handed out again in between.

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <malloc.h>

#include "internal_alloc.h"
#include "recorder.h"

// Every hooked host symbol, once: X(name, return type, parameters).
// The test `hooks_test` checks that each is exported by libmemledger.so.
#define MEMLEDGER_HOST_HOOKS(X)                                        \
  X(malloc, void*, (size_t size))                                      \
  X(free, void, (void* ptr))                                           \
  X(calloc, void*, (size_t count, size_t size))                        \
  X(realloc, void*, (void* ptr, size_t size))                          \
  X(reallocarray, void*, (void* ptr, size_t count, size_t size))       \
  X(posix_memalign, int, (void** out, size_t alignment, size_t size))  \
  X(aligned_alloc, void*, (size_t alignment, size_t size))             \
  X(memalign, void*, (size_t alignment, size_t size))                  \
  X(valloc, void*, (size_t size))                                      \
  X(pvalloc, void*, (size_t size))                                     \
  X(free_sized, void, (void* ptr, size_t size))                        \
  X(free_aligned_sized, void, (void* ptr, size_t alignment, size_t size))

using memledger::interposer::HookGuard;
using memledger::interposer::recorder;

namespace {

inline void* record_alloc(HookGuard& guard, void* ptr, size_t size) {
  if (ptr != nullptr && guard.entered() && recorder().host_enabled()) {
    recorder().on_host_alloc(guard.thread(), ptr, size);
  }
  return ptr;
}

inline void record_free(HookGuard& guard, void* ptr) {
  if (ptr != nullptr && guard.entered() && recorder().host_enabled()) {
    recorder().on_host_free(guard.thread(), ptr);
  }
}

bool power_of_two(size_t n) { return n != 0 && (n & (n - 1)) == 0; }

}  // namespace

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

MEMLEDGER_EXPORT void* malloc(size_t size) {
  HookGuard guard;
  return record_alloc(guard, __libc_malloc(size), size);
}

MEMLEDGER_EXPORT void free(void* ptr) {
  HookGuard guard;
  record_free(guard, ptr);
  __libc_free(ptr);
}

MEMLEDGER_EXPORT void* calloc(size_t count, size_t size) {
  HookGuard guard;
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) bytes = SIZE_MAX;
  return record_alloc(guard, __libc_calloc(count, size), bytes);
}

MEMLEDGER_EXPORT void* realloc(void* ptr, size_t size) {
  HookGuard guard;
  if (ptr == nullptr) return record_alloc(guard, __libc_malloc(size), size);
  if (size == 0) {
    // glibc frees and returns NULL.
    record_free(guard, ptr);
    return __libc_realloc(ptr, 0);
  }
  if (!guard.entered() || !recorder().host_enabled()) return __libc_realloc(ptr, size);
  // Record the free first: once realloc returns, another thread may be given
  // the old address.
  record_free(guard, ptr);
  void* result = __libc_realloc(ptr, size);
  if (result == nullptr) {
    // The old block is still live: record it again (its size is not known
    // here; its usable size is what stays allocated).
    return record_alloc(guard, ptr, malloc_usable_size(ptr)), nullptr;
  }
  return record_alloc(guard, result, size);
}

MEMLEDGER_EXPORT void* reallocarray(void* ptr, size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(ptr, bytes);
}

MEMLEDGER_EXPORT int posix_memalign(void** out, size_t alignment, size_t size) {
  if (!power_of_two(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  HookGuard guard;
  const int saved = errno;
  void* p = __libc_memalign(alignment, size);
  if (p == nullptr) {
    errno = saved;
    return ENOMEM;
  }
  *out = record_alloc(guard, p, size);
  return 0;
}

MEMLEDGER_EXPORT void* aligned_alloc(size_t alignment, size_t size) {
  if (!power_of_two(alignment)) {
    errno = EINVAL;
    return nullptr;
  }
  HookGuard guard;
  return record_alloc(guard, __libc_memalign(alignment, size), size);
}

MEMLEDGER_EXPORT void* memalign(size_t alignment, size_t size) {
  HookGuard guard;
  return record_alloc(guard, __libc_memalign(alignment, size), size);
}

MEMLEDGER_EXPORT void* valloc(size_t size) {
  HookGuard guard;
  return record_alloc(guard, __libc_valloc(size), size);
}

MEMLEDGER_EXPORT void* pvalloc(size_t size) {
  HookGuard guard;
  return record_alloc(guard, __libc_pvalloc(size), size);
}

MEMLEDGER_EXPORT void free_sized(void* ptr, size_t) { free(ptr); }

MEMLEDGER_EXPORT void free_aligned_sized(void* ptr, size_t, size_t) { free(ptr); }

// The hook list as data, for the test that checks every hook is exported.
#define MEMLEDGER_HOOK_NAME(name, ret, params) #name,
extern "C" __attribute__((visibility("default"))) const char* const memledger_host_hook_names[] = {
    MEMLEDGER_HOST_HOOKS(MEMLEDGER_HOOK_NAME) nullptr};
