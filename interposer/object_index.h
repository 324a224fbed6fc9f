// Which loaded object holds an address, for the unwinder's rules
// (unwinder.cpp): its .eh_frame_hdr, and the pages of the read-only segment
// that holds it.
//
// dl_iterate_phdr() hands each loaded object to a callback, in load order,
// under the loader's lock; a scan that stops at the object holding the
// address visits half of them on average. A process that has imported
// torch has some 300 objects loaded, and a rule worked out for a new return
// address spent three quarters of its instructions in that scan (callgrind,
// `import torch` in full mode). The index keeps every object's loaded
// segments sorted, built by one full scan, and is used while the loader's
// counts of objects added and removed (dl_phdr_info's dlpi_adds and
// dlpi_subs, as libgcc's unwinder checks them) are those it was built at.
// Each look-up still enters dl_iterate_phdr, for those counts under the
// loader's lock, and leaves at its first object.
#pragma once

#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace memledger::interposer {

// What a look-up of `pc` finds: the object's .eh_frame_hdr (nullptr: no
// object holds `pc`, or the one that does has none), and the page-aligned
// read-only segment holding it, when its pages may be handed back to the
// kernel (both 0 when not: the vDSO, a writable segment, text relocations).
// Then the pages of the object's RELRO part (PT_GNU_RELRO: written by the
// loader as it relocates, then made read-only), where some linkers put
// .eh_frame (NVIDIA's libnvrtc): those the loader did not write to may be
// handed back one by one (0 when not: the vDSO, text relocations).
struct ObjectLookup {
  uint64_t pc;
  const uint8_t* hdr = nullptr;
  uintptr_t segment_begin = 0;
  uintptr_t segment_end = 0;
  uintptr_t relro_begin = 0;
  uintptr_t relro_end = 0;
};

// The reference: a scan of the loaded objects, up to the one holding
// `lookup->pc`.
void find_object_by_scan(ObjectLookup* lookup);

class ObjectIndex {
 public:
  // Fills `lookup` as find_object_by_scan() does.
  void find(ObjectLookup* lookup);

  struct Counts {
    uint64_t from_index;  // look-ups answered by the index
    uint64_t scanned;     // by a scan (index out of date, being built, or full)
    uint64_t built;       // times the index was built
  };
  Counts counts() const;

  // Capacity: processes with more loaded segments than this are served by
  // scans.
  static constexpr uint32_t kMaxObjects = 4096;
  static constexpr uint32_t kMaxRanges = 8192;

 private:
  struct Object {
    const uint8_t* hdr;
    uintptr_t segment_begin;
    uintptr_t segment_end;
    uintptr_t relro_begin;
    uintptr_t relro_end;
  };
  struct Range {
    uint64_t begin;
    uint64_t end;
    uint32_t object;
  };
  struct Pass;
  static int visit(dl_phdr_info* info, size_t size, void* data);
  void add(const dl_phdr_info* info);
  void search(ObjectLookup* lookup) const;

  // Set while the index describes the objects at the counts `adds_` and
  // `subs_` (read under the loader's lock, in a look-up's first visit).
  std::atomic<bool> ready_{false};
  // Claimed by the one look-up that builds the index.
  std::atomic<bool> building_{false};
  uint64_t adds_ = 0;
  uint64_t subs_ = 0;
  // The counts at which the objects did not fit: not built again until
  // they change.
  std::atomic<uint64_t> full_adds_{~uint64_t{0}};
  std::atomic<uint64_t> full_subs_{~uint64_t{0}};
  bool overflow_ = false;
  uint32_t objects_ = 0;
  uint32_t ranges_ = 0;
  std::atomic<uint64_t> from_index_{0};
  std::atomic<uint64_t> scanned_{0};
  std::atomic<uint64_t> built_{0};
  Object object_[kMaxObjects];
  Range range_[kMaxRanges];
};

}  // namespace memledger::interposer
