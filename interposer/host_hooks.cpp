// Hooks for the host heap: the malloc family, the C++ allocation functions,
// and the extended entry points of jemalloc, tcmalloc and mimalloc. Each hook guards against recursion, calls the next
// definition of its own name (next_allocator.h: the allocator the program
// would have used, so a block always goes back to the heap that made it),
// and records the result. Free-type hooks record before calling the real
// free, so the address cannot be handed out again in between. A failed
// allocation is recorded too, with errno and the result left as they were.
//
// Every list entry is X(name, return type, parameters, arguments, SHAPE, ...):
//   ALLOC, size, fallback         returns a block of `size` bytes (nullptr: failed)
//   NEW, size, fallback           the same, but failure throws (C++ operator new)
//   NEW_VIA_MALLOC, ALLOC_VIA_MALLOC, FREE_VIA_FREE
//                                 the C++ forms libstdc++ serves with malloc and free:
//                                 called directly while g_cxx_direct holds
//   FREE, ptr, fallback           releases `ptr`
//   REALLOC, ptr, size, fallback  moves `ptr` to a block of `size` bytes
//   ALLOC_FAST, FREE_FAST         malloc and free: ALLOC and FREE behind the short
//                                 path (MEMLEDGER_FAST_ALLOC, MEMLEDGER_FAST_FREE)
//   SIZED, fallback               no record of its own (queries, or a hook reached again)
// `fallback` serves the call when the name has no definition after memledger
// (a C program has no operator new; a mallocx caller without jemalloc): the
// equivalent call through the malloc family's hooks, so the block's heap
// stays the malloc heap.

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <new>
#include <unistd.h>

#include "internal_alloc.h"
#include "libc_symbols.h"
#include "next_allocator.h"
#include "recorder.h"
#include "spin_lock.h"

namespace memledger::interposer {
// libstdc++'s operator new calls malloc, and its operator delete free,
// through the lookup order. When memledger's hooks come first for those and
// for every C++ allocation function, and the next operator new is
// libstdc++'s, the C++ hooks call the next malloc and free themselves: the
// same heap is reached, without libstdc++'s function and memledger's own
// hook nested in it. Set once at the look-up, or at the late look-up that
// finds a libstdc++ loaded after start-up (decide_cxx_direct).
std::atomic<bool> g_cxx_direct{false};
std::atomic<uint8_t> g_host_fast{0};
}  // namespace memledger::interposer

using memledger::interposer::HookGuard;
using memledger::interposer::recorder;
namespace ip = memledger::interposer;

namespace {

size_t mul_or_max(size_t a, size_t b) {
  size_t bytes;
  return __builtin_mul_overflow(a, b, &bytes) ? SIZE_MAX : bytes;
}
bool power_of_two(size_t n) { return n != 0 && (n & (n - 1)) == 0; }
size_t page_round(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return n == 0 ? page : (n + page - 1) & ~(page - 1);
}
void* aligned_via_posix_memalign(size_t alignment, size_t size) {
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  void* p = nullptr;
  const int rc = posix_memalign(&p, alignment, size);
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  return p;
}
// jemalloc's flags: the low 6 bits hold log2(alignment), bit 6 asks for zeroed memory.
size_t jemalloc_alignment(int flags) { return (flags & 0x3f) ? size_t{1} << (flags & 0x3f) : 0; }
void* jemalloc_fallback_alloc(size_t size, int flags) {
  const size_t alignment = jemalloc_alignment(flags);
  void* p = alignment ? aligned_via_posix_memalign(alignment, size) : malloc(size);
  if (p != nullptr && (flags & 0x40)) memset(p, 0, size);
  return p;
}
void* jemalloc_fallback_realloc(void* ptr, size_t size, int flags) {
  if (jemalloc_alignment(flags) == 0 && (flags & 0x40) == 0) return realloc(ptr, size);
  void* p = jemalloc_fallback_alloc(size, flags);
  if (p != nullptr && ptr != nullptr) {
    const size_t old = malloc_usable_size(ptr);
    memcpy(p, ptr, old < size ? old : size);
    free(ptr);
  }
  return p;
}
void* new_or_throw(void* p) {
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
char* duplicate(const char* s, size_t n) {
  const size_t len = strnlen(s, n);
  char* p = static_cast<char*>(malloc(len + 1));
  if (p != nullptr) {
    memcpy(p, s, len);
    p[len] = '\0';
  }
  return p;
}

}  // namespace

// The malloc family. Entries whose next definition is not in the object that
// defines the next malloc (glibc's reallocarray or pvalloc beside a jemalloc
// that has none) take their fallback: glibc's would use glibc's heap.
// The test `test_library_hygiene` checks that every name of every list is exported.
#define MEMLEDGER_HOST_HOOKS(X)                                                                            \
  X(malloc, void*, (size_t size), (size), ALLOC_FAST, size, nullptr)                                       \
  X(free, void, (void* ptr), (ptr), FREE_FAST, ptr, (void)0)                                               \
  X(calloc, void*, (size_t count, size_t size), (count, size), ALLOC, mul_or_max(count, size), nullptr)    \
  X(realloc, void*, (void* ptr, size_t size), (ptr, size), REALLOC, ptr, size, nullptr)                    \
  X(reallocarray, void*, (void* ptr, size_t count, size_t size), (ptr, count, size), REALLOC, ptr,         \
    mul_or_max(count, size), mul_or_max(count, size) == SIZE_MAX ? (errno = ENOMEM, nullptr) : realloc(ptr, count * size)) \
  X(posix_memalign, int, (void** out, size_t alignment, size_t size), (out, alignment, size), SIZED,      \
    posix_memalign_hook(out, alignment, size))                                                             \
  X(aligned_alloc, void*, (size_t alignment, size_t size), (alignment, size), ALLOC, size,                \
    power_of_two(alignment) ? aligned_via_posix_memalign(alignment, size) : (errno = EINVAL, nullptr))      \
  X(memalign, void*, (size_t alignment, size_t size), (alignment, size), ALLOC, size,                     \
    aligned_via_posix_memalign(power_of_two(alignment) ? alignment : 16, size))                            \
  X(valloc, void*, (size_t size), (size), ALLOC, size, aligned_via_posix_memalign(page_round(1), size))    \
  X(pvalloc, void*, (size_t size), (size), ALLOC, page_round(size),                                       \
    aligned_via_posix_memalign(page_round(1), page_round(size)))                                           \
  X(free_sized, void, (void* ptr, size_t size), (ptr, size), FREE, ptr, free(ptr))                         \
  X(free_aligned_sized, void, (void* ptr, size_t alignment, size_t size), (ptr, alignment, size), FREE, ptr, free(ptr))

// The C++ allocation functions, by their mangled names: jemalloc and
// tcmalloc define their own, which never call malloc.
#define MEMLEDGER_CXX_HOOKS(X)                                                                                      \
  X(_Znwm, void*, (size_t size), (size), NEW_VIA_MALLOC, size, new_or_throw(malloc(size)))                          \
  X(_Znam, void*, (size_t size), (size), NEW_VIA_MALLOC, size, new_or_throw(malloc(size)))                          \
  X(_ZnwmRKSt9nothrow_t, void*, (size_t size, const std::nothrow_t& t), (size, t), ALLOC_VIA_MALLOC, size,          \
    malloc(size))                                                                                                   \
  X(_ZnamRKSt9nothrow_t, void*, (size_t size, const std::nothrow_t& t), (size, t), ALLOC_VIA_MALLOC, size,          \
    malloc(size))                                                                                                   \
  X(_ZnwmSt11align_val_t, void*, (size_t size, std::align_val_t a), (size, a), NEW, size,                           \
    new_or_throw(aligned_via_posix_memalign(static_cast<size_t>(a), size)))                                         \
  X(_ZnamSt11align_val_t, void*, (size_t size, std::align_val_t a), (size, a), NEW, size,                           \
    new_or_throw(aligned_via_posix_memalign(static_cast<size_t>(a), size)))                                         \
  X(_ZnwmSt11align_val_tRKSt9nothrow_t, void*, (size_t size, std::align_val_t a, const std::nothrow_t& t),          \
    (size, a, t), ALLOC, size, aligned_via_posix_memalign(static_cast<size_t>(a), size))                            \
  X(_ZnamSt11align_val_tRKSt9nothrow_t, void*, (size_t size, std::align_val_t a, const std::nothrow_t& t),          \
    (size, a, t), ALLOC, size, aligned_via_posix_memalign(static_cast<size_t>(a), size))                            \
  X(_ZdlPv, void, (void* ptr), (ptr), FREE_VIA_FREE, ptr, free(ptr))                                                \
  X(_ZdaPv, void, (void* ptr), (ptr), FREE_VIA_FREE, ptr, free(ptr))                                                \
  X(_ZdlPvm, void, (void* ptr, size_t size), (ptr, size), FREE_VIA_FREE, ptr, free(ptr))                            \
  X(_ZdaPvm, void, (void* ptr, size_t size), (ptr, size), FREE_VIA_FREE, ptr, free(ptr))                            \
  X(_ZdlPvRKSt9nothrow_t, void, (void* ptr, const std::nothrow_t& t), (ptr, t), FREE_VIA_FREE, ptr, free(ptr))      \
  X(_ZdaPvRKSt9nothrow_t, void, (void* ptr, const std::nothrow_t& t), (ptr, t), FREE_VIA_FREE, ptr, free(ptr))      \
  X(_ZdlPvSt11align_val_t, void, (void* ptr, std::align_val_t a), (ptr, a), FREE_VIA_FREE, ptr, free(ptr))          \
  X(_ZdaPvSt11align_val_t, void, (void* ptr, std::align_val_t a), (ptr, a), FREE_VIA_FREE, ptr, free(ptr))          \
  X(_ZdlPvmSt11align_val_t, void, (void* ptr, size_t size, std::align_val_t a), (ptr, size, a), FREE_VIA_FREE, ptr, \
    free(ptr))                                                                                                      \
  X(_ZdaPvmSt11align_val_t, void, (void* ptr, size_t size, std::align_val_t a), (ptr, size, a), FREE_VIA_FREE, ptr, \
    free(ptr))                                                                                                      \
  X(_ZdlPvSt11align_val_tRKSt9nothrow_t, void, (void* ptr, std::align_val_t a, const std::nothrow_t& t),            \
    (ptr, a, t), FREE_VIA_FREE, ptr, free(ptr))                                                                     \
  X(_ZdaPvSt11align_val_tRKSt9nothrow_t, void, (void* ptr, std::align_val_t a, const std::nothrow_t& t),            \
    (ptr, a, t), FREE_VIA_FREE, ptr, free(ptr))

// jemalloc's non-standard API (sallocx gives the sizes).
#define MEMLEDGER_JEMALLOC_HOOKS(X)                                                                            \
  X(mallocx, void*, (size_t size, int flags), (size, flags), ALLOC, size, jemalloc_fallback_alloc(size, flags)) \
  X(rallocx, void*, (void* ptr, size_t size, int flags), (ptr, size, flags), REALLOC, ptr, size,              \
    jemalloc_fallback_realloc(ptr, size, flags))                                                               \
  X(xallocx, size_t, (void* ptr, size_t size, size_t extra, int flags), (ptr, size, extra, flags), SIZED,      \
    xallocx_hook(ptr, size, extra, flags))                                                                     \
  X(sdallocx, void, (void* ptr, size_t size, int flags), (ptr, size, flags), FREE, ptr, free(ptr))             \
  X(dallocx, void, (void* ptr, int flags), (ptr, flags), FREE, ptr, free(ptr))

// gperftools tcmalloc's tc_* entry points (tc_malloc_size gives the sizes).
#define MEMLEDGER_TCMALLOC_HOOKS(X)                                                                             \
  X(tc_malloc, void*, (size_t size), (size), ALLOC, size, malloc(size))                                         \
  X(tc_malloc_skip_new_handler, void*, (size_t size), (size), ALLOC, size, malloc(size))                        \
  X(tc_free, void, (void* ptr), (ptr), FREE, ptr, free(ptr))                                                    \
  X(tc_free_sized, void, (void* ptr, size_t size), (ptr, size), FREE, ptr, free(ptr))                           \
  X(tc_calloc, void*, (size_t count, size_t size), (count, size), ALLOC, mul_or_max(count, size),               \
    calloc(count, size))                                                                                        \
  X(tc_realloc, void*, (void* ptr, size_t size), (ptr, size), REALLOC, ptr, size, realloc(ptr, size))           \
  X(tc_memalign, void*, (size_t alignment, size_t size), (alignment, size), ALLOC, size,                       \
    memalign(alignment, size))                                                                                  \
  X(tc_posix_memalign, int, (void** out, size_t alignment, size_t size), (out, alignment, size), SIZED,        \
    posix_memalign(out, alignment, size))                                                                       \
  X(tc_valloc, void*, (size_t size), (size), ALLOC, size, valloc(size))                                         \
  X(tc_pvalloc, void*, (size_t size), (size), ALLOC, page_round(size), pvalloc(size))                           \
  X(tc_new, void*, (size_t size), (size), NEW, size, _Znwm(size))                                               \
  X(tc_newarray, void*, (size_t size), (size), NEW, size, _Znam(size))                                          \
  X(tc_new_nothrow, void*, (size_t size, const std::nothrow_t& t), (size, t), ALLOC, size, malloc(size))        \
  X(tc_newarray_nothrow, void*, (size_t size, const std::nothrow_t& t), (size, t), ALLOC, size, malloc(size))   \
  X(tc_delete, void, (void* ptr), (ptr), FREE, ptr, free(ptr))                                                  \
  X(tc_deletearray, void, (void* ptr), (ptr), FREE, ptr, free(ptr))                                             \
  X(tc_delete_sized, void, (void* ptr, size_t size), (ptr, size), FREE, ptr, free(ptr))                         \
  X(tc_deletearray_sized, void, (void* ptr, size_t size), (ptr, size), FREE, ptr, free(ptr))                    \
  X(tc_delete_nothrow, void, (void* ptr, const std::nothrow_t& t), (ptr, t), FREE, ptr, free(ptr))              \
  X(tc_deletearray_nothrow, void, (void* ptr, const std::nothrow_t& t), (ptr, t), FREE, ptr, free(ptr))

// mimalloc's mi_* entry points (mi_usable_size gives the sizes).
#define MEMLEDGER_MIMALLOC_HOOKS(X)                                                                            \
  X(mi_malloc, void*, (size_t size), (size), ALLOC, size, malloc(size))                                        \
  X(mi_zalloc, void*, (size_t size), (size), ALLOC, size, calloc(1, size))                                     \
  X(mi_calloc, void*, (size_t count, size_t size), (count, size), ALLOC, mul_or_max(count, size),              \
    calloc(count, size))                                                                                       \
  X(mi_mallocn, void*, (size_t count, size_t size), (count, size), ALLOC, mul_or_max(count, size),             \
    reallocarray(nullptr, count, size))                                                                        \
  X(mi_malloc_aligned, void*, (size_t size, size_t alignment), (size, alignment), ALLOC, size,                \
    aligned_via_posix_memalign(alignment, size))                                                               \
  X(mi_zalloc_aligned, void*, (size_t size, size_t alignment), (size, alignment), ALLOC, size,                \
    mi_zalloc_aligned_fallback(size, alignment))                                                               \
  X(mi_realloc, void*, (void* ptr, size_t size), (ptr, size), REALLOC, ptr, size, realloc(ptr, size))          \
  X(mi_reallocn, void*, (void* ptr, size_t count, size_t size), (ptr, count, size), REALLOC, ptr,             \
    mul_or_max(count, size), reallocarray(ptr, count, size))                                                   \
  X(mi_reallocf, void*, (void* ptr, size_t size), (ptr, size), REALLOC, ptr, size, mi_reallocf_fallback(ptr, size)) \
  X(mi_strdup, char*, (const char* s), (s), ALLOC, strlen(s) + 1, duplicate(s, SIZE_MAX))                     \
  X(mi_strndup, char*, (const char* s, size_t n), (s, n), ALLOC, strnlen(s, n) + 1, duplicate(s, n))          \
  X(mi_new, void*, (size_t size), (size), NEW, size, _Znwm(size))                                              \
  X(mi_new_nothrow, void*, (size_t size), (size), ALLOC, size, malloc(size))                                   \
  X(mi_new_aligned, void*, (size_t size, size_t alignment), (size, alignment), NEW, size,                     \
    new_or_throw(aligned_via_posix_memalign(alignment, size)))                                                 \
  X(mi_free, void, (void* ptr), (ptr), FREE, ptr, free(ptr))                                                   \
  X(mi_free_size, void, (void* ptr, size_t size), (ptr, size), FREE, ptr, free(ptr))                           \
  X(mi_free_aligned, void, (void* ptr, size_t alignment), (ptr, alignment), FREE, ptr, free(ptr))              \
  X(mi_free_size_aligned, void, (void* ptr, size_t size, size_t alignment), (ptr, size, alignment), FREE, ptr, \
    free(ptr))

// The next definition of every hooked name, filled once (resolve_next_slow).
#define MEMLEDGER_DECLARE_NEXT(name, ret, params, args, ...) ret(*next_##name) params = nullptr;
namespace {
MEMLEDGER_HOST_HOOKS(MEMLEDGER_DECLARE_NEXT)
MEMLEDGER_CXX_HOOKS(MEMLEDGER_DECLARE_NEXT)
MEMLEDGER_JEMALLOC_HOOKS(MEMLEDGER_DECLARE_NEXT)
MEMLEDGER_TCMALLOC_HOOKS(MEMLEDGER_DECLARE_NEXT)
MEMLEDGER_MIMALLOC_HOOKS(MEMLEDGER_DECLARE_NEXT)

// Size queries of each family, for the live totals.
size_t (*next_malloc_usable_size)(void*) = nullptr;
size_t (*next_sallocx)(const void*, int) = nullptr;
size_t (*next_tc_malloc_size)(void*) = nullptr;
size_t (*next_mi_usable_size)(const void*) = nullptr;
bool g_glibc_heap = true;  // the next malloc is glibc's: sizes are read from its chunk headers

// The usable size of a block from glibc's allocator, read from its chunk
// header as malloc_usable_size() does but without its checks: the hooks
// call this on every allocation and free, and the header is in cache then.
inline size_t glibc_usable_size(void* ptr) {
  const size_t header = static_cast<const size_t*>(ptr)[-1];
  const size_t chunk = header & ~size_t{7};
  constexpr size_t kIsMmapped = 2;
  return (header & kIsMmapped) ? chunk - 2 * sizeof(size_t) : chunk - sizeof(size_t);
}

inline size_t host_usable(void* ptr) {
  if (__builtin_expect(g_glibc_heap, 1)) return glibc_usable_size(ptr);
  return next_malloc_usable_size != nullptr ? next_malloc_usable_size(ptr) : 0;
}
inline size_t jemalloc_usable(void* ptr) { return next_sallocx ? next_sallocx(ptr, 0) : host_usable(ptr); }
inline size_t tcmalloc_usable(void* ptr) { return next_tc_malloc_size ? next_tc_malloc_size(ptr) : host_usable(ptr); }
inline size_t mimalloc_usable(void* ptr) { return next_mi_usable_size ? next_mi_usable_size(ptr) : host_usable(ptr); }

template <size_t (*Usable)(void*)>
inline void record_alloc(HookGuard& guard, void* ptr, size_t size) {
  if (!guard.entered() || !recorder().host_enabled()) return;
  if (ptr != nullptr) {
    recorder().on_host_alloc(guard.thread(), ptr, size, Usable(ptr));
  } else {
    const int saved = errno;
    recorder().on_host_failed(guard.thread(), size, saved ? saved : ENOMEM);
    errno = saved;
  }
}

template <size_t (*Usable)(void*)>
inline void record_free(HookGuard& guard, void* ptr) {
  if (ptr != nullptr && guard.entered() && recorder().host_enabled()) {
    recorder().on_host_free(guard.thread(), ptr, Usable(ptr));
  }
}

// The short path's recordings (MEMLEDGER_FAST_ALLOC, MEMLEDGER_FAST_FREE):
// what count_alloc_only or count_free_only left to the recorder. The caller
// found the recursion flag clear, so it is set and cleared here without a
// HookGuard's check (with one, full mode's program thread ran 0.8% more
// instructions on bench/storm).
__attribute__((noinline)) void* record_glibc_alloc(ip::ThreadState& t, void* block, size_t size, size_t usable) {
  t.in_hook = 1;
  recorder().on_host_alloc(t, block, size, usable);
  t.in_hook = 0;
  return block;
}
__attribute__((noinline)) void* record_glibc_failed(size_t size) {
  HookGuard guard;
  record_alloc<host_usable>(guard, nullptr, size);
  return nullptr;
}
__attribute__((noinline)) void record_glibc_free(ip::ThreadState& t, void* ptr, size_t usable) {
  t.in_hook = 1;
  recorder().on_host_free(t, ptr, usable);
  t.in_hook = 0;
  next_free(ptr);
}

// realloc and its kin: the old block is recorded as freed first (once the
// call returns another thread may be given its address), the new one after.
// A failed call leaves the old block live: it is recorded again.
template <size_t (*Usable)(void*), typename Call>
inline void* forward_realloc(void* ptr, size_t size, Call call) {
  HookGuard guard;
  const bool record = guard.entered() && recorder().host_enabled();
  if (!record) return call();
  const size_t old_usable = ptr != nullptr ? Usable(ptr) : 0;
  if (ptr != nullptr) recorder().on_host_free(guard.thread(), ptr, old_usable);
  void* result = call();
  if (result != nullptr) {
    recorder().on_host_alloc(guard.thread(), result, size, Usable(result));
  } else if (size != 0) {
    const int saved = errno;
    recorder().on_host_failed(guard.thread(), size, saved ? saved : ENOMEM);
    if (ptr != nullptr) recorder().on_host_alloc(guard.thread(), ptr, old_usable, old_usable);
    errno = saved;
  }
  return result;
}

void* mi_zalloc_aligned_fallback(size_t size, size_t alignment) {
  void* p = aligned_via_posix_memalign(alignment, size);
  if (p != nullptr) memset(p, 0, size);
  return p;
}
void* mi_reallocf_fallback(void* ptr, size_t size) {
  void* p = realloc(ptr, size);
  if (p == nullptr && size != 0) free(ptr);
  return p;
}

int posix_memalign_hook(void** out, size_t alignment, size_t size);
size_t xallocx_hook(void* ptr, size_t size, size_t extra, int flags);

// Whether `next` has a definition after a late look-up.
template <typename Fn>
bool resolved_late(Fn& next) {
  ip::resolve_late();
  return __atomic_load_n(&next, __ATOMIC_ACQUIRE) != nullptr;
}

}  // namespace

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

// Bootstrap: until the look-up is done, the resolving thread's own calls
// (dlsym allocating) are served by the static arena.
#define MEMLEDGER_BOOTSTRAP_ALLOC(ret, size) \
  if (!ip::next_resolved()) return static_cast<ret>(ip::arena_alloc(size));
#define MEMLEDGER_ARENA_FREE(ptr) \
  if (ptr != nullptr && ip::in_arena(ptr)) return;
#define MEMLEDGER_BOOTSTRAP_FREE(ptr) \
  MEMLEDGER_ARENA_FREE(ptr)           \
  if (!ip::next_resolved()) return;

// No definition of `name` after memledger: look again if the hook's family
// may arrive later (`late`), else serve the call by its fallback.
#define MEMLEDGER_NO_NEXT(late, name) (next_##name == nullptr && !(late && resolved_late(next_##name)))

// Each hook's body, and the hook: an exported function of the name.
#define MEMLEDGER_BODY_ALLOC(usable, late, name, ret, params, args, size, fallback) \
  MEMLEDGER_BOOTSTRAP_ALLOC(ret, size)                                             \
  if (MEMLEDGER_NO_NEXT(late, name)) return fallback;                              \
  HookGuard guard;                                                                 \
  ret p = next_##name args;                                                        \
  record_alloc<usable>(guard, p, size);                                            \
  return p;
#define MEMLEDGER_BODY_NEW(usable, late, name, ret, params, args, size, fallback) \
  if (!ip::next_resolved()) return new_or_throw(ip::arena_alloc(size));          \
  if (MEMLEDGER_NO_NEXT(late, name)) return fallback;                            \
  HookGuard guard;                                                               \
  ret p;                                                                         \
  try {                                                                          \
    p = next_##name args;                                                        \
  } catch (...) {                                                                \
    record_alloc<usable>(guard, nullptr, size);                                  \
    throw;                                                                       \
  }                                                                              \
  record_alloc<usable>(guard, p, size);                                          \
  return p;
#define MEMLEDGER_BODY_FREE(usable, late, name, ret, params, args, ptr, fallback) \
  MEMLEDGER_BOOTSTRAP_FREE(ptr)                                                  \
  if (MEMLEDGER_NO_NEXT(late, name)) return fallback;                            \
  HookGuard guard;                                                               \
  record_free<usable>(guard, ptr);                                               \
  next_##name args;
// The short path (kHostFastC, kHostFastCxx): the next malloc and free are
// glibc's and the host heap is recorded. A call reached again from inside
// memledger (the recursion flag set) takes the long path.
#define MEMLEDGER_FAST_ALLOC(bit, request, size)                                                  \
  if (__builtin_expect(ip::g_host_fast.load(std::memory_order_relaxed) & ip::kHostFast##bit, 1)) { \
    ip::ThreadState& t = ip::thread_state();                                                      \
    if (__builtin_expect(t.in_hook == 0, 1)) {                                                    \
      void* block = next_malloc(request);                                                         \
      if (__builtin_expect(block != nullptr, 1)) {                                                \
        const size_t usable = glibc_usable_size(block);                                           \
        if (__builtin_expect(recorder().count_alloc_only(t, size, usable), 1)) return block;      \
        return record_glibc_alloc(t, block, size, usable);                                        \
      }                                                                                           \
      MEMLEDGER_FAST_ALLOC_FAILED_##bit(size)                                                     \
    }                                                                                             \
  }
// A failed malloc is recorded and returned; a failed operator new goes the
// long way (libstdc++'s new-handler loop), which records it.
#define MEMLEDGER_FAST_ALLOC_FAILED_C(size) return record_glibc_failed(size);
#define MEMLEDGER_FAST_ALLOC_FAILED_Cxx(size)
#define MEMLEDGER_FAST_FREE(bit, ptr)                                                              \
  if (__builtin_expect(ip::g_host_fast.load(std::memory_order_relaxed) & ip::kHostFast##bit, 1) && \
      ptr != nullptr && !ip::in_arena(ptr)) {                                                      \
    ip::ThreadState& t = ip::thread_state();                                                       \
    if (__builtin_expect(t.in_hook == 0, 1)) {                                                     \
      const size_t usable = glibc_usable_size(ptr);                                                \
      if (__builtin_expect(recorder().count_free_only(t, reinterpret_cast<uintptr_t>(ptr), usable), 1)) { \
        return next_free(ptr);                                                                     \
      }                                                                                            \
      return record_glibc_free(t, ptr, usable);                                                    \
    }                                                                                              \
  }
#define MEMLEDGER_HOOK_ALLOC(usable, late, name, ret, params, ...) \
  MEMLEDGER_EXPORT ret name params { MEMLEDGER_BODY_ALLOC(usable, late, name, ret, params, __VA_ARGS__) }
// A hook with a short path in front: `short_path` returns from the hook
// where it serves the call; the rest goes on in name##_long, out of line, so
// that the short path saves no register.
#define MEMLEDGER_HOOK_SHORT_LONG(name, ret, params, args, short_path, ...) \
  namespace {                                                              \
  __attribute__((noinline)) ret name##_long params { __VA_ARGS__ }         \
  }                                                                        \
  MEMLEDGER_EXPORT ret name params {                                       \
    short_path                                                             \
    return name##_long args;                                               \
  }
#define MEMLEDGER_HOOK_ALLOC_FAST(usable, late, name, ret, params, args, size, fallback) \
  MEMLEDGER_HOOK_SHORT_LONG(name, ret, params, args, MEMLEDGER_FAST_ALLOC(C, size, size), \
                            MEMLEDGER_BODY_ALLOC(usable, late, name, ret, params, args, size, fallback))
#define MEMLEDGER_HOOK_FREE_FAST(usable, late, name, ret, params, args, ptr, fallback) \
  MEMLEDGER_HOOK_SHORT_LONG(name, ret, params, args, MEMLEDGER_FAST_FREE(C, ptr),       \
                            MEMLEDGER_BODY_FREE(usable, late, name, ret, params, args, ptr, fallback))
#define MEMLEDGER_HOOK_NEW(usable, late, name, ret, params, ...) \
  MEMLEDGER_EXPORT ret name params { MEMLEDGER_BODY_NEW(usable, late, name, ret, params, __VA_ARGS__) }
#define MEMLEDGER_HOOK_FREE(usable, late, name, ret, params, ...) \
  MEMLEDGER_EXPORT ret name params { MEMLEDGER_BODY_FREE(usable, late, name, ret, params, __VA_ARGS__) }

// The C++ functions that libstdc++ serves with malloc and free: while
// g_cxx_direct holds (decide_cxx_direct), the hook calls the next malloc or
// free itself. A failed allocation then goes the usual way, through
// libstdc++ (its new-handler loop, bad_alloc).
#define MEMLEDGER_HOOK_VIA_MALLOC(shape, usable, late, name, ret, params, args, size, fallback)    \
  MEMLEDGER_HOOK_SHORT_LONG(                                                                      \
      name, ret, params, args, MEMLEDGER_FAST_ALLOC(Cxx, (size != 0 ? size : 1), size),           \
      if (__builtin_expect(ip::g_cxx_direct.load(std::memory_order_relaxed), 1)) {                \
        HookGuard direct;                                                                         \
        void* block = next_malloc(size != 0 ? size : 1);                                          \
        if (__builtin_expect(block != nullptr, 1)) {                                              \
          record_alloc<usable>(direct, block, size);                                              \
          return block;                                                                           \
        }                                                                                         \
      } MEMLEDGER_BODY_##shape(usable, late, name, ret, params, args, size, fallback))
#define MEMLEDGER_HOOK_NEW_VIA_MALLOC(...) MEMLEDGER_HOOK_VIA_MALLOC(NEW, __VA_ARGS__)
#define MEMLEDGER_HOOK_ALLOC_VIA_MALLOC(...) MEMLEDGER_HOOK_VIA_MALLOC(ALLOC, __VA_ARGS__)
#define MEMLEDGER_HOOK_FREE_VIA_FREE(usable, late, name, ret, params, args, ptr, fallback)     \
  MEMLEDGER_HOOK_SHORT_LONG(                                                                  \
      name, ret, params, args, MEMLEDGER_FAST_FREE(Cxx, ptr),                                 \
      if (__builtin_expect(ip::g_cxx_direct.load(std::memory_order_relaxed), 1)) {            \
        MEMLEDGER_ARENA_FREE(ptr)                                                             \
        HookGuard direct;                                                                     \
        record_free<usable>(direct, ptr);                                                     \
        next_free(ptr);                                                                       \
        return;                                                                               \
      } MEMLEDGER_BODY_FREE(usable, late, name, ret, params, args, ptr, fallback))
#define MEMLEDGER_HOOK_REALLOC(usable, late, name, ret, params, args, ptr, size, fallback)      \
  MEMLEDGER_EXPORT ret name params {                                                            \
    if (ptr != nullptr && ip::in_arena(ptr)) return static_cast<ret>(realloc_out_of_arena(ptr, size)); \
    MEMLEDGER_BOOTSTRAP_ALLOC(ret, size)                                                   \
    if (MEMLEDGER_NO_NEXT(late, name)) return fallback;                                         \
    return static_cast<ret>(forward_realloc<usable>(ptr, size, [&] { return next_##name args; })); \
  }
#define MEMLEDGER_HOOK_SIZED(usable, late, name, ret, params, args, fallback)

// The malloc family's own entry points are never looked up late: they must
// come from the object of the next malloc, fixed at start-up. The C++
// functions and the replacement allocators' APIs may arrive with a dlopen.
#define MEMLEDGER_GLIBC_HOOK(name, ret, params, args, shape, ...) \
  MEMLEDGER_HOOK_##shape(host_usable, false, name, ret, params, args, __VA_ARGS__)
#define MEMLEDGER_CXX_HOOK(name, ret, params, args, shape, ...) \
  MEMLEDGER_HOOK_##shape(host_usable, true, name, ret, params, args, __VA_ARGS__)
#define MEMLEDGER_JEMALLOC_HOOK(name, ret, params, args, shape, ...) \
  MEMLEDGER_HOOK_##shape(jemalloc_usable, true, name, ret, params, args, __VA_ARGS__)
#define MEMLEDGER_TCMALLOC_HOOK(name, ret, params, args, shape, ...) \
  MEMLEDGER_HOOK_##shape(tcmalloc_usable, true, name, ret, params, args, __VA_ARGS__)
#define MEMLEDGER_MIMALLOC_HOOK(name, ret, params, args, shape, ...) \
  MEMLEDGER_HOOK_##shape(mimalloc_usable, true, name, ret, params, args, __VA_ARGS__)

namespace {
void* realloc_out_of_arena(void* ptr, size_t size) {
  void* p = malloc(size);
  if (p != nullptr) {
    const size_t old = ip::arena_size(ptr);
    memcpy(p, ptr, old < size ? old : size);
  }
  return p;
}
}  // namespace

MEMLEDGER_HOST_HOOKS(MEMLEDGER_GLIBC_HOOK)
MEMLEDGER_CXX_HOOKS(MEMLEDGER_CXX_HOOK)
MEMLEDGER_JEMALLOC_HOOKS(MEMLEDGER_JEMALLOC_HOOK)
MEMLEDGER_TCMALLOC_HOOKS(MEMLEDGER_TCMALLOC_HOOK)
MEMLEDGER_MIMALLOC_HOOKS(MEMLEDGER_MIMALLOC_HOOK)

// The hooks whose shape no macro covers.

namespace {

int posix_memalign_hook(void** out, size_t alignment, size_t size) {
  if (!power_of_two(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  if (!ip::next_resolved()) {
    *out = ip::arena_alloc(size, alignment);
    return *out ? 0 : ENOMEM;
  }
  HookGuard guard;
  const int saved = errno;
  void* p = nullptr;
  int rc;
  if (next_posix_memalign != nullptr) {
    rc = next_posix_memalign(&p, alignment, size);
  } else {
    // An allocator without posix_memalign: its memalign.
    p = next_memalign != nullptr ? next_memalign(alignment, size) : nullptr;
    rc = p != nullptr ? 0 : ENOMEM;
  }
  if (rc != 0) {
    errno = rc;
    record_alloc<host_usable>(guard, nullptr, size);
    errno = saved;
    return rc;
  }
  record_alloc<host_usable>(guard, p, size);
  *out = p;
  return 0;
}

size_t xallocx_hook(void* ptr, size_t size, size_t extra, int flags) {
  // Resizes in place or not at all: the block keeps its address, its
  // recorded size changes.
  if (next_xallocx == nullptr && !resolved_late(next_xallocx)) return malloc_usable_size(ptr);
  HookGuard guard;
  const bool record = guard.entered() && recorder().host_enabled();
  if (!record) return next_xallocx(ptr, size, extra, flags);
  recorder().on_host_free(guard.thread(), ptr, jemalloc_usable(ptr));
  const size_t result = next_xallocx(ptr, size, extra, flags);
  recorder().on_host_alloc(guard.thread(), ptr, result, jemalloc_usable(ptr));
  return result;
}

}  // namespace

MEMLEDGER_EXPORT int posix_memalign(void** out, size_t alignment, size_t size) {
  return posix_memalign_hook(out, alignment, size);
}

MEMLEDGER_EXPORT size_t xallocx(void* ptr, size_t size, size_t extra, int flags) {
  return xallocx_hook(ptr, size, extra, flags);
}

MEMLEDGER_EXPORT int tc_posix_memalign(void** out, size_t alignment, size_t size) {
  if (next_tc_posix_memalign == nullptr && !resolved_late(next_tc_posix_memalign)) {
    return posix_memalign(out, alignment, size);
  }
  if (!power_of_two(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  HookGuard guard;
  void* p = nullptr;
  const int rc = next_tc_posix_memalign(&p, alignment, size);
  record_alloc<tcmalloc_usable>(guard, rc == 0 ? p : nullptr, size);
  if (rc == 0) *out = p;
  return rc;
}

// The look-up, once per process (a forked child inherits it).
namespace memledger::interposer {

std::atomic<bool> g_next_resolved{false};

namespace {
SpinLock g_resolve_lock;
[[maybe_unused]] const bool g_resolve_lock_fork = fork_held_locks().add(&g_resolve_lock);
__thread bool tls_resolving __attribute__((tls_model("initial-exec")));

// The loaded object whose segments hold `addr`: its program headers (unique
// to it) and its path. dladdr would also look for the nearest symbol, a
// walk through the whole symbol table of a library such as libstdc++.
struct LoadedObject {
  const void* phdr = nullptr;
  const char* path = nullptr;
};
LoadedObject object_of(const void* addr) {
  struct Search {
    uintptr_t addr;
    LoadedObject found;
  } search{reinterpret_cast<uintptr_t>(addr), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* search = static_cast<Search*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          const uintptr_t start = info->dlpi_addr + segment.p_vaddr;
          if (segment.p_type == PT_LOAD && search->addr - start < segment.p_memsz) {
            search->found = {info->dlpi_phdr, info->dlpi_name};
            return 1;
          }
        }
        return 0;
      },
      &search);
  return search.found;
}

// Whether two functions live in the same loaded object.
bool same_object(void* a, void* b) {
  if (a == nullptr || b == nullptr) return false;
  const void* object = object_of(a).phdr;
  return object != nullptr && object == object_of(b).phdr;
}

template <typename Fn>
void resolve(Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(next_symbol(name));
}

// Objects loaded when the pointers were last looked up.
std::atomic<unsigned long long> g_loads_seen{0};

// An empty pointer filled by a late look-up, never changed once set.
template <typename Fn>
void fill_late(Fn& fn, const char* name) {
  if (__atomic_load_n(&fn, __ATOMIC_ACQUIRE) != nullptr) return;
  Fn found = reinterpret_cast<Fn>(next_symbol(name));
  Fn empty = nullptr;
  if (found != nullptr) {
    __atomic_compare_exchange_n(&fn, &empty, found, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  }
}

// Whether the first definition of `name` in load order (the executable,
// then the preloaded objects, then the rest), which is what a call from
// libstdc++ reaches, is in the object `ours` (memledger's program headers).
// Not dlsym(RTLD_DEFAULT): it may answer with the executable's PLT entry
// for the name.
bool first_definition_in(const void* ours, const char* name) {
  void* first = find_in_loaded_objects(name, 1);
  return first != nullptr && object_of(first).phdr == ours;
}

// Decided once the next operator new is known: it never changes after, and
// neither do the objects ahead of memledger in load order.
std::atomic<bool> g_cxx_decided{false};

void decide_cxx_direct() {
  if (next__Znwm == nullptr || g_cxx_decided.exchange(true, std::memory_order_relaxed)) return;
  const char* path = object_of(reinterpret_cast<void*>(next__Znwm)).path;
  if (path == nullptr || strstr(path, "/libstdc++.so") == nullptr) return;
  const void* ours = object_of(reinterpret_cast<void*>(&decide_cxx_direct)).phdr;
  if (!first_definition_in(ours, "malloc") || !first_definition_in(ours, "free")) return;
  const void* cxx = object_of(reinterpret_cast<void*>(next__Znwm)).phdr;
#define MEMLEDGER_CXX_FROM_LIBSTDCXX(name, ...)                                                    \
  if (next_##name == nullptr || object_of(reinterpret_cast<void*>(next_##name)).phdr != cxx ||     \
      !first_definition_in(ours, #name)) {                                                          \
    return;                                                                                         \
  }
  MEMLEDGER_CXX_HOOKS(MEMLEDGER_CXX_FROM_LIBSTDCXX)
#undef MEMLEDGER_CXX_FROM_LIBSTDCXX
  g_cxx_direct.store(true, std::memory_order_relaxed);
  update_host_fast();
}

}  // namespace

bool resolve_next_slow() {
  if (tls_resolving) return false;
  SpinGuard lock(g_resolve_lock);
  if (g_next_resolved.load(std::memory_order_acquire)) return true;
  tls_resolving = true;
  // The core first: once malloc and free are known, the rest may allocate.
  resolve(next_malloc, "malloc");
  resolve(next_free, "free");
  resolve(next_calloc, "calloc");
  resolve(next_realloc, "realloc");
  resolve(next_malloc_usable_size, "malloc_usable_size");
  if (next_malloc == nullptr || next_free == nullptr || next_calloc == nullptr || next_realloc == nullptr) {
    // No allocator after memledger (cannot happen with a C library loaded):
    // glibc's own entry points.
    next_malloc = __libc_malloc;
    next_free = __libc_free;
    next_calloc = __libc_calloc;
    next_realloc = __libc_realloc;
    next_malloc_usable_size = ::malloc_usable_size;
  }
  const char* heap_path = object_of(reinterpret_cast<void*>(next_malloc)).path;
  g_glibc_heap = heap_path != nullptr && strstr(heap_path, "/libc.so") != nullptr;
#define MEMLEDGER_RESOLVE(name, ...) \
  if (next_##name == nullptr) resolve(next_##name, #name);
  MEMLEDGER_HOST_HOOKS(MEMLEDGER_RESOLVE)
  MEMLEDGER_CXX_HOOKS(MEMLEDGER_RESOLVE)
  MEMLEDGER_JEMALLOC_HOOKS(MEMLEDGER_RESOLVE)
  MEMLEDGER_TCMALLOC_HOOKS(MEMLEDGER_RESOLVE)
  MEMLEDGER_MIMALLOC_HOOKS(MEMLEDGER_RESOLVE)
#undef MEMLEDGER_RESOLVE
  // The rest of the malloc family must come from the allocator that made
  // the block: glibc's pvalloc beside jemalloc's free would corrupt both.
  void* core = reinterpret_cast<void*>(next_malloc);
#define MEMLEDGER_SAME_HEAP(name, ...) \
  if (!same_object(reinterpret_cast<void*>(next_##name), core)) next_##name = nullptr;
  MEMLEDGER_HOST_HOOKS(MEMLEDGER_SAME_HEAP)
#undef MEMLEDGER_SAME_HEAP
  next_malloc = reinterpret_cast<decltype(next_malloc)>(core);
  resolve(next_sallocx, "sallocx");
  resolve(next_tc_malloc_size, "tc_malloc_size");
  resolve(next_mi_usable_size, "mi_usable_size");
  decide_cxx_direct();
  tls_resolving = false;
  g_loads_seen.store(objects_loaded(), std::memory_order_relaxed);
  g_next_resolved.store(true, std::memory_order_release);
  return true;
}

void update_host_fast() {
  uint8_t bits = 0;
  if (g_next_resolved.load(std::memory_order_acquire) && g_glibc_heap && recorder().host_enabled()) {
    bits = kHostFastC;
    if (g_cxx_direct.load(std::memory_order_relaxed)) bits |= kHostFastCxx;
  }
  g_host_fast.store(bits, std::memory_order_release);
}

void resolve_late() {
  if (!g_next_resolved.load(std::memory_order_acquire) || tls_resolving) return;
  const unsigned long long loads = objects_loaded();
  if (loads == g_loads_seen.load(std::memory_order_acquire)) return;
  // No lock: a thread inside dlopen (holding the loader's lock) may reach
  // here from a constructor while another waits in dlsym for that lock.
  // Threads that look up at once find the same definitions.
  tls_resolving = true;  // a late hook reached again from the look-up takes its fallback
  // The size queries first: a hook that finds its allocator's entry point
  // must also find the size of the blocks it makes.
  fill_late(next_sallocx, "sallocx");
  fill_late(next_tc_malloc_size, "tc_malloc_size");
  fill_late(next_mi_usable_size, "mi_usable_size");
#define MEMLEDGER_FILL_LATE(name, ...) fill_late(next_##name, #name);
  MEMLEDGER_CXX_HOOKS(MEMLEDGER_FILL_LATE)
  MEMLEDGER_JEMALLOC_HOOKS(MEMLEDGER_FILL_LATE)
  MEMLEDGER_TCMALLOC_HOOKS(MEMLEDGER_FILL_LATE)
  MEMLEDGER_MIMALLOC_HOOKS(MEMLEDGER_FILL_LATE)
#undef MEMLEDGER_FILL_LATE
  decide_cxx_direct();
  tls_resolving = false;
  g_loads_seen.store(loads, std::memory_order_release);
}

}  // namespace memledger::interposer

// The hook lists as data, for the test that checks every hook is exported.
#define MEMLEDGER_HOOK_NAME(name, ...) #name,
extern "C" __attribute__((visibility("default"))) const char* const memledger_host_hook_names[] = {
    MEMLEDGER_HOST_HOOKS(MEMLEDGER_HOOK_NAME) MEMLEDGER_CXX_HOOKS(MEMLEDGER_HOOK_NAME)
        MEMLEDGER_JEMALLOC_HOOKS(MEMLEDGER_HOOK_NAME) MEMLEDGER_TCMALLOC_HOOKS(MEMLEDGER_HOOK_NAME)
            MEMLEDGER_MIMALLOC_HOOKS(MEMLEDGER_HOOK_NAME) nullptr};
