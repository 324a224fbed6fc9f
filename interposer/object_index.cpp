#include "object_index.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace memledger::interposer {

namespace {

// Whether the object's text may have been written to by the loader
// (DT_TEXTREL): then a page of a read-only segment may be a private copy.
bool has_text_relocations(const dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
    const auto* dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    for (; dyn->d_tag != DT_NULL; ++dyn) {
      if (dyn->d_tag == DT_TEXTREL || (dyn->d_tag == DT_FLAGS && (dyn->d_un.d_val & DF_TEXTREL))) return true;
    }
  }
  return false;
}

// Whether `pc` lies in one of the object's loaded segments.
bool holds(const dl_phdr_info* info, uint64_t pc) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uint64_t begin = info->dlpi_addr + ph.p_vaddr;
    if (pc >= begin && pc < begin + ph.p_memsz) return true;
  }
  return false;
}

// What a look-up of an address the object holds finds (ObjectLookup).
void describe(const dl_phdr_info* info, ObjectLookup* out) {
  out->hdr = nullptr;
  out->segment_begin = out->segment_end = 0;
  out->relro_begin = out->relro_end = 0;
  const ElfW(Phdr)* eh = nullptr;
  const ElfW(Phdr)* relro = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME) eh = &info->dlpi_phdr[i];
    if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) relro = &info->dlpi_phdr[i];
  }
  if (eh == nullptr) return;
  out->hdr = reinterpret_cast<const uint8_t*>(info->dlpi_addr + eh->p_vaddr);
  if (info->dlpi_name != nullptr && strstr(info->dlpi_name, "linux-vdso") != nullptr) return;
  if (has_text_relocations(info)) return;
  const uintptr_t page = static_cast<uintptr_t>(getpagesize());
  if (relro != nullptr) {
    // The pages the loader protects: from the page holding the part's
    // start to the last whole page in it (glibc's _dl_protect_relro).
    out->relro_begin = (info->dlpi_addr + relro->p_vaddr) & ~(page - 1);
    out->relro_end = (info->dlpi_addr + relro->p_vaddr + relro->p_memsz) & ~(page - 1);
    if (out->relro_end <= out->relro_begin) out->relro_begin = out->relro_end = 0;
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || eh->p_vaddr < ph.p_vaddr || eh->p_vaddr >= ph.p_vaddr + ph.p_filesz) continue;
    if ((ph.p_flags & PF_W) == 0 && ph.p_memsz == ph.p_filesz) {
      out->segment_begin = (info->dlpi_addr + ph.p_vaddr) & ~(page - 1);
      out->segment_end = (info->dlpi_addr + ph.p_vaddr + ph.p_filesz + page - 1) & ~(page - 1);
    }
    break;
  }
}

int scan_one(dl_phdr_info* info, size_t, void* data) {
  auto* lookup = static_cast<ObjectLookup*>(data);
  if (!holds(info, lookup->pc)) return 0;
  describe(info, lookup);
  return 1;
}

}  // namespace

void find_object_by_scan(ObjectLookup* lookup) { dl_iterate_phdr(scan_one, lookup); }

struct ObjectIndex::Pass {
  ObjectIndex* index;
  ObjectLookup* lookup;
  bool first = true;
  bool answered = false;  // by the index
  bool building = false;  // this look-up builds the index
  bool found = false;
  uint64_t adds = 0;
  uint64_t subs = 0;
};

// Called under the loader's lock, for each object in turn: the loader's
// counts and the index are compared at the first one, where the index
// answers; else this pass builds the index (if no other does, and the
// objects fit at these counts) or scans.
int ObjectIndex::visit(dl_phdr_info* info, size_t size, void* data) {
  Pass& pass = *static_cast<Pass*>(data);
  ObjectIndex& index = *pass.index;
  if (pass.first) {
    pass.first = false;
    if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
      pass.adds = info->dlpi_adds;
      pass.subs = info->dlpi_subs;
      if (index.ready_.load(std::memory_order_acquire) && index.adds_ == pass.adds && index.subs_ == pass.subs) {
        index.search(pass.lookup);
        pass.answered = true;
        return 1;
      }
      const bool full = index.full_adds_.load(std::memory_order_relaxed) == pass.adds &&
                        index.full_subs_.load(std::memory_order_relaxed) == pass.subs;
      if (!full && !index.building_.exchange(true, std::memory_order_acquire)) {
        pass.building = true;
        index.ready_.store(false, std::memory_order_relaxed);
        index.objects_ = 0;
        index.ranges_ = 0;
        index.overflow_ = false;
      }
    }
  }
  if (pass.building) {
    // Every object, to the end of the list.
    index.add(info);
    if (!pass.found) pass.found = scan_one(info, size, pass.lookup) != 0;
    return 0;
  }
  return scan_one(info, size, pass.lookup);
}

void ObjectIndex::add(const dl_phdr_info* info) {
  if (overflow_) return;
  if (objects_ == kMaxObjects) {
    overflow_ = true;
    return;
  }
  ObjectLookup described{0};
  describe(info, &described);
  const uint32_t id = objects_++;
  object_[id] = {described.hdr, described.segment_begin, described.segment_end, described.relro_begin,
                 described.relro_end};
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || ph.p_memsz == 0) continue;
    if (ranges_ == kMaxRanges) {
      overflow_ = true;
      return;
    }
    const uint64_t begin = info->dlpi_addr + ph.p_vaddr;
    range_[ranges_++] = {begin, begin + ph.p_memsz, id};
  }
}

// The last range that begins at or below `pc` holds it, if any does (the
// loaded segments of objects do not overlap). The scan would find the
// first object in load order that holds `pc`: the same one.
void ObjectIndex::search(ObjectLookup* lookup) const {
  const Range* end = range_ + ranges_;
  const Range* after = std::upper_bound(range_, end, lookup->pc,
                                        [](uint64_t pc, const Range& r) { return pc < r.begin; });
  if (after == range_) return;
  const Range& r = after[-1];
  if (lookup->pc >= r.end) return;
  const Object& o = object_[r.object];
  lookup->hdr = o.hdr;
  lookup->segment_begin = o.segment_begin;
  lookup->segment_end = o.segment_end;
  lookup->relro_begin = o.relro_begin;
  lookup->relro_end = o.relro_end;
}

void ObjectIndex::find(ObjectLookup* lookup) {
  Pass pass{this, lookup};
  dl_iterate_phdr(visit, &pass);
  if (pass.building) {
    // Outside the loader's lock, but no look-up reads the index while it
    // is not ready, and no other builds it.
    if (!overflow_) {
      std::sort(range_, range_ + ranges_, [](const Range& a, const Range& b) { return a.begin < b.begin; });
      adds_ = pass.adds;
      subs_ = pass.subs;
      ready_.store(true, std::memory_order_release);
      built_.fetch_add(1, std::memory_order_relaxed);
    } else {
      full_adds_.store(pass.adds, std::memory_order_relaxed);
      full_subs_.store(pass.subs, std::memory_order_relaxed);
    }
    building_.store(false, std::memory_order_release);
  }
  (pass.answered ? from_index_ : scanned_).fetch_add(1, std::memory_order_relaxed);
}

ObjectIndex::Counts ObjectIndex::counts() const {
  return {from_index_.load(std::memory_order_relaxed), scanned_.load(std::memory_order_relaxed),
          built_.load(std::memory_order_relaxed)};
}

}  // namespace memledger::interposer
