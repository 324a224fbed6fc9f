// Which VMM physical allocations are still alive, by handle reference
// counts and mappings, as the driver frees them: physical memory is freed
// when its last handle reference is released (cuMemCreate,
// cuMemRetainAllocationHandle and cuMemImportFromShareableHandle each take
// one, cuMemRelease drops one) *and* its last mapping is unmapped. NCCL's
// allocator (src/include/alloc.h) retains, releases, unmaps and releases
// again: counting cuMemRelease as the free would mark its live buffers freed.
//
// The hooks update the ledger after the real call succeeded; it answers
// whether that call freed the memory. Tables live in mmap'ed memory (never
// the hooked heap), linear probing with backward-shift deletion.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spin_lock.h"
#include "trace_format.h"

namespace memledger::interposer {

class VmmLedger {
 public:
  // A physical allocation memledger recorded (`counted`), or one tracked
  // only for its references (imported, multicast objects). False when the
  // table is full: the caller falls back to counting at cuMemRelease.
  bool created(uint64_t handle, format::Kind kind, bool counted);
  // A reference taken on a handle (cuMemRetainAllocationHandle); false
  // when the handle is unknown.
  bool retained(uint64_t handle);
  void mapped(uint64_t addr, uint64_t size, uint64_t handle);

  // What a release or an unmap did to one handle.
  struct Freed {
    uint64_t handle;
    format::Kind kind;
  };
  enum class Release : uint8_t {
    kUnknown,  // never seen: count it as the free, as before
    kKept,     // references or mappings remain, or it was never counted
    kFreed,    // the last reference of a counted, unmapped allocation
  };
  Release released(uint64_t handle, format::Kind* kind);
  // Removes the whole mappings in [addr, addr + size); calls `on_freed`
  // (under the ledger's lock) for each counted handle whose memory this
  // unmap freed.
  void unmapped(uint64_t addr, uint64_t size, void (*on_freed)(void* context, const Freed& freed), void* context);
  // For ForkHeldLocks: the tables are held still across fork(), so that
  // the child gets them whole and the lock free; taken before the
  // recorder's shared ring (on_freed may record under this lock).
  SpinLock* fork_lock() { return &lock_; }

 private:
  struct HandleEntry {
    uint64_t handle;  // 0 = empty
    int32_t refs;
    int32_t mappings;
    uint8_t kind;
    uint8_t counted;
  };
  struct MappingEntry {
    uint64_t addr;  // 0 = empty
    uint64_t size;
    uint64_t handle;
  };
  static constexpr size_t kHandleSlots = size_t{1} << 16;
  static constexpr size_t kMappingSlots = size_t{1} << 17;

  bool ensure_tables();
  HandleEntry* find_handle(uint64_t handle);
  MappingEntry* find_mapping(uint64_t addr);
  void erase_handle(HandleEntry* entry);
  void erase_mapping(MappingEntry* entry);

  SpinLock lock_;
  HandleEntry* handles_ = nullptr;
  MappingEntry* mappings_ = nullptr;
  size_t handle_count_ = 0;
  size_t mapping_count_ = 0;
  bool failed_ = false;
};

VmmLedger& vmm_ledger();

}  // namespace memledger::interposer
