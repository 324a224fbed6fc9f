#include "next_allocator.h"

#include <dlfcn.h>
#include <link.h>
#include <malloc.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "libc_symbols.h"

namespace memledger::interposer {

// dlsym's own allocations (its error string, the first call's TLS) while
// the look-up runs. A few KiB in practice; the blocks are never freed.
alignas(64) unsigned char g_arena[kArenaBytes];

namespace {

std::atomic<size_t> g_arena_used{0};

uintptr_t self_base() {
  Dl_info info;
  static const int anchor = 0;
  if (dladdr(&anchor, &info) == 0) return 0;
  return reinterpret_cast<uintptr_t>(info.dli_fbase);
}

AllocatorInfo g_info;

using MallctlFn = int (*)(const char*, void*, size_t*, void*, size_t);
using TcPropertyFn = int (*)(const char*, size_t*);
using MiProcessInfoFn = void (*)(size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*);
MallctlFn g_mallctl = nullptr;
TcPropertyFn g_tc_property = nullptr;
MiProcessInfoFn g_mi_process_info = nullptr;

// The symbol `name` defined by the object at `base`, through libc's dlsym
// on a handle of that object (RTLD_NOLOAD: it is loaded already).
void* symbol_of_object(const char* path, const char* name) {
  using DlsymFn = void* (*)(void*, const char*);
  auto libc_dlsym = reinterpret_cast<DlsymFn>(libc_dlsym_address());
  if (libc_dlsym == nullptr) return nullptr;
  void* handle = dlopen(path[0] ? path : nullptr, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* p = libc_dlsym(handle, name);
  dlclose(handle);
  return p;
}

bool path_has(const char* path, const char* word) { return strstr(path, word) != nullptr; }

void name_allocator(AllocatorInfo& info, const char* path) {
  const char* name = "other";
  info.id = AllocatorId::kOther;
  if (path_has(path, "/libc.so")) {
    info.id = AllocatorId::kGlibc;
    name = "glibc";
  } else if (path_has(path, "jemalloc") || symbol_of_object(path, "mallctl") != nullptr) {
    info.id = AllocatorId::kJemalloc;
    name = "jemalloc";
  } else if (path_has(path, "tcmalloc") || symbol_of_object(path, "MallocExtension_GetNumericProperty") != nullptr) {
    info.id = AllocatorId::kTcmalloc;
    name = "tcmalloc";
  } else if (path_has(path, "mimalloc") || symbol_of_object(path, "mi_process_info") != nullptr) {
    info.id = AllocatorId::kMimalloc;
    name = "mimalloc";
  }
  snprintf(info.name, sizeof info.name, "%s", name);
  snprintf(info.path, sizeof info.path, "%s", path);
}

bool in_preload_list(const char* path) {
  const char* list = getenv("LD_PRELOAD");
  if (list == nullptr || path[0] == '\0') return false;
  const char* base = strrchr(path, '/');
  base = base ? base + 1 : path;
  return strstr(list, base) != nullptr;
}

void find_statistics(AllocatorInfo& info) {
  switch (info.id) {
    case AllocatorId::kGlibc:
      snprintf(info.held_source, sizeof info.held_source, "mallinfo2");
      break;
    case AllocatorId::kJemalloc:
      g_mallctl = reinterpret_cast<MallctlFn>(next_symbol("mallctl"));
      if (g_mallctl != nullptr) snprintf(info.held_source, sizeof info.held_source, "mallctl stats.resident");
      break;
    case AllocatorId::kTcmalloc:
      g_tc_property = reinterpret_cast<TcPropertyFn>(next_symbol("MallocExtension_GetNumericProperty"));
      if (g_tc_property != nullptr) {
        snprintf(info.held_source, sizeof info.held_source, "generic.heap_size less unmapped and free");
      }
      break;
    case AllocatorId::kMimalloc:
      g_mi_process_info = reinterpret_cast<MiProcessInfoFn>(next_symbol("mi_process_info"));
      if (g_mi_process_info != nullptr) snprintf(info.held_source, sizeof info.held_source, "mi_process_info");
      break;
    case AllocatorId::kOther:
      break;
  }
}

}  // namespace

void* next_symbol(const char* name) {
  // A failing dlsym allocates its error message, through whichever malloc
  // comes first (perhaps an allocator that is calling this hook right now):
  // ask dlsym only for names some loaded object defines.
  void* anywhere = find_in_loaded_objects(name, self_base());
  if (anywhere == nullptr) return nullptr;
  using DlsymFn = void* (*)(void*, const char*);
  auto libc_dlsym = reinterpret_cast<DlsymFn>(libc_dlsym_address());
  // Called from this object, so RTLD_NEXT means "after memledger".
  void* p = libc_dlsym != nullptr ? libc_dlsym(RTLD_NEXT, name) : nullptr;
  return p != nullptr ? p : anywhere;
}

unsigned long long objects_loaded() {
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* out) {
        if (size >= offsetof(dl_phdr_info, dlpi_subs)) *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        return 1;  // the first object carries the count
      },
      &adds);
  return adds;
}

void* arena_alloc(size_t size, size_t alignment) {
  if (alignment < 16) alignment = 16;
  // Each block is preceded by its size (for realloc out of the arena).
  size_t used = g_arena_used.load(std::memory_order_relaxed);
  for (;;) {
    size_t start = (used + sizeof(size_t) + alignment - 1) & ~(alignment - 1);
    size_t end = start + size;
    if (end > kArenaBytes || end < start) {
      errno = ENOMEM;
      return nullptr;
    }
    if (g_arena_used.compare_exchange_weak(used, end, std::memory_order_relaxed)) {
      reinterpret_cast<size_t*>(g_arena + start)[-1] = size;
      return g_arena + start;
    }
  }
}

size_t arena_size(const void* ptr) { return static_cast<const size_t*>(ptr)[-1]; }

void identify_allocator(AllocatorInfo& info) {
  // What the program's own calls reach: the first definition of malloc in
  // load order (the global scope at start-up). Not dlsym(RTLD_DEFAULT): it
  // answers with the executable's PLT entry when the program takes malloc's
  // address. When the first is not memledger's, the heap bypasses the hooks.
  void* first = find_in_loaded_objects("malloc", 1);
  void* next = next_symbol("malloc");
  Dl_info first_info{}, next_info{};
  const bool first_known = first != nullptr && dladdr(first, &first_info) != 0;
  const bool ours = first_known && reinterpret_cast<uintptr_t>(first_info.dli_fbase) == self_base();
  if (first_known && !ours) {
    name_allocator(info, first_info.dli_fname ? first_info.dli_fname : "");
    info.untraced = true;
    snprintf(info.reached, sizeof info.reached,
             "comes before memledger in the lookup order (LD_PRELOAD or linked into the program), so the "
             "host heap bypasses memledger");
  } else if (next != nullptr && dladdr(next, &next_info) != 0) {
    const char* path = next_info.dli_fname ? next_info.dli_fname : "";
    name_allocator(info, path);
    if (info.id == AllocatorId::kGlibc) {
      snprintf(info.reached, sizeof info.reached, "the C library's own");
    } else if (in_preload_list(path)) {
      snprintf(info.reached, sizeof info.reached, "preloaded after memledger (LD_PRELOAD)");
    } else {
      snprintf(info.reached, sizeof info.reached, "linked into the program (a library it needs)");
    }
  } else {
    info.untraced = true;
    snprintf(info.reached, sizeof info.reached, "no allocator found after memledger");
  }
  find_statistics(info);
  g_info = info;
}

const AllocatorInfo& allocator_info() { return g_info; }

bool allocator_heap_stats(uint64_t* held, uint64_t* in_use) {
  *held = 0;
  *in_use = 0;
  switch (g_info.id) {
    case AllocatorId::kGlibc: {
      struct mallinfo2 mi = mallinfo2();
      *held = mi.arena + mi.hblkhd;
      *in_use = mi.uordblks + mi.hblkhd;
      return true;
    }
    case AllocatorId::kJemalloc: {
      if (g_mallctl == nullptr) return false;
      // Statistics are cached until the epoch advances.
      uint64_t epoch = 1;
      size_t len = sizeof epoch;
      g_mallctl("epoch", &epoch, &len, &epoch, len);
      size_t resident = 0, allocated = 0;
      len = sizeof resident;
      if (g_mallctl("stats.resident", &resident, &len, nullptr, 0) != 0) return false;
      len = sizeof allocated;
      if (g_mallctl("stats.allocated", &allocated, &len, nullptr, 0) != 0) allocated = 0;
      *held = resident;
      *in_use = allocated;
      return true;
    }
    case AllocatorId::kTcmalloc: {
      if (g_tc_property == nullptr) return false;
      size_t heap = 0, unmapped = 0, free_bytes = 0, allocated = 0;
      if (!g_tc_property("generic.heap_size", &heap)) return false;
      g_tc_property("tcmalloc.pageheap_unmapped_bytes", &unmapped);
      g_tc_property("tcmalloc.pageheap_free_bytes", &free_bytes);
      g_tc_property("generic.current_allocated_bytes", &allocated);
      *held = heap > unmapped + free_bytes ? heap - unmapped - free_bytes : 0;
      *in_use = allocated;
      return true;
    }
    case AllocatorId::kMimalloc: {
      if (g_mi_process_info == nullptr) return false;
      size_t elapsed, user, sys, rss, peak_rss, commit = 0, peak_commit, faults;
      g_mi_process_info(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
      *held = commit;
      return commit != 0;
    }
    case AllocatorId::kOther:
      return false;
  }
  return false;
}

}  // namespace memledger::interposer
