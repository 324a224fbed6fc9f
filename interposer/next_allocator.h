// The allocator the program would have used without memledger: the next
// definition of `malloc` (and of every other hooked entry point) in lookup
// order, found once with dlsym(RTLD_NEXT) as heaptrack does. That is glibc,
// or a jemalloc, tcmalloc or mimalloc linked in or preloaded after
// memledger; every hook forwards to it, so a block is always freed by the
// heap that made it (a jemalloc block handed to glibc's free aborts the
// program). dlsym may allocate while the look-up runs: those calls are served
// from a static bump arena, and its blocks are never handed to the allocator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace memledger::interposer {

enum class AllocatorId : uint8_t { kGlibc = 0, kJemalloc = 1, kTcmalloc = 2, kMimalloc = 3, kOther = 4 };

// Resolves `name` to its next definition after memledger (dlsym RTLD_NEXT),
// or failing that (a library dlopen'ed later with RTLD_LOCAL) its first
// definition in any loaded object but memledger. No heap allocation when
// the symbol exists.
void* next_symbol(const char* name);

// Fills every pointer of the hook lists (host_hooks.cpp) once. Returns false
// only on the thread that is resolving them right now (its nested calls are
// served by the bootstrap arena).
bool resolve_next_slow();
extern std::atomic<bool> g_next_resolved;
inline bool next_resolved() {
  return __builtin_expect(g_next_resolved.load(std::memory_order_acquire), 1) || resolve_next_slow();
}

// A late look-up for the entry points that had no definition at start-up:
// an allocator dlopen'ed later (a plugin, a Python extension that loads
// jemalloc or tcmalloc) defines them, and a block it made must go back to
// it. Only empty pointers are filled, so a block made before keeps its heap.
// Cheap unless an object was loaded since the last call (dl_iterate_phdr's
// count of loads); called on the hooks' fallback paths only.
void resolve_late();
unsigned long long objects_loaded();

// The bootstrap arena: blocks handed out while the look-up runs.
void* arena_alloc(size_t size, size_t alignment = 16);
inline constexpr size_t kArenaBytes = 256 * 1024;
extern unsigned char g_arena[kArenaBytes];
// Asked by every free: inline, one compare.
inline bool in_arena(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) - reinterpret_cast<uintptr_t>(g_arena) < kArenaBytes;
}
size_t arena_size(const void* ptr);

// What the process's allocator is and how memledger reaches it, found at
// start-up (after the look-up) for the trace header and the held-bytes
// samples.
struct AllocatorInfo {
  AllocatorId id = AllocatorId::kGlibc;
  // The heap the program's malloc reaches does not pass through memledger
  // (an allocator ahead of memledger in the lookup order, or linked
  // statically without exported symbols): the host heap is not traced.
  bool untraced = false;
  char name[16] = "glibc";
  char path[512] = {};     // object that defines the allocator's malloc
  char reached[160] = {};  // one phrase: how the program reaches it
  char held_source[64] = {};  // which statistic held bytes come from; empty: none can be read
};

// The hooks' short path (host_hooks.cpp). kHostFastC holds while the
// recorder records the host heap and the next malloc is glibc's: malloc and
// free then skip the look-up's checks, read the block's size from its chunk
// header, and set the recursion flag only around the recording (glibc's
// malloc and free call no hooked function). kHostFastCxx holds while
// moreover the C++ functions go straight to that malloc and free
// (g_cxx_direct). update_host_fast() recomputes both where what they rest on
// changes: the recorder's start, finish and disable, and the C++ decision.
inline constexpr uint8_t kHostFastC = 1;
inline constexpr uint8_t kHostFastCxx = 2;
extern std::atomic<uint8_t> g_host_fast;
void update_host_fast();

// Identifies the allocator; call once after the look-up.
void identify_allocator(AllocatorInfo& info);
const AllocatorInfo& allocator_info();

// Held and in-use bytes from the allocator's own statistics; false when the
// allocator offers none (then neither is known, not 0). `in_use` is 0 when
// only held bytes are offered.
bool allocator_heap_stats(uint64_t* held, uint64_t* in_use);

}  // namespace memledger::interposer
