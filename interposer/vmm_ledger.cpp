#include "vmm_ledger.h"

#include <sys/mman.h>

namespace memledger::interposer {
namespace {

size_t slot_of(uint64_t key, size_t slots) {
  // Handles and addresses are aligned or sequential: mix the bits first.
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return static_cast<size_t>(key) & (slots - 1);
}

template <typename Entry, typename Key>
Entry* probe(Entry* table, size_t slots, uint64_t key, Key key_of) {
  for (size_t i = slot_of(key, slots), n = 0; n < slots; i = (i + 1) & (slots - 1), ++n) {
    if (key_of(table[i]) == key || key_of(table[i]) == 0) return &table[i];
  }
  return nullptr;
}

// Backward-shift deletion: later entries of the probe run move up, so that
// look-ups never need tombstones.
template <typename Entry, typename Key>
void erase_at(Entry* table, size_t slots, Entry* entry, Key key_of) {
  size_t hole = static_cast<size_t>(entry - table);
  for (size_t i = (hole + 1) & (slots - 1);; i = (i + 1) & (slots - 1)) {
    const uint64_t key = key_of(table[i]);
    if (key == 0) break;
    const size_t home = slot_of(key, slots);
    // Movable when its home is not inside (hole, i] cyclically.
    const bool between = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
    if (between) continue;
    table[hole] = table[i];
    hole = i;
  }
  table[hole] = Entry{};
}

const auto handle_key = [](const auto& e) { return e.handle; };
const auto mapping_key = [](const auto& e) { return e.addr; };

}  // namespace

bool VmmLedger::ensure_tables() {
  if (handles_ != nullptr) return true;
  if (failed_) return false;
  void* h = mmap(nullptr, kHandleSlots * sizeof(HandleEntry), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* m = mmap(nullptr, kMappingSlots * sizeof(MappingEntry), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (h == MAP_FAILED || m == MAP_FAILED) {
    if (h != MAP_FAILED) munmap(h, kHandleSlots * sizeof(HandleEntry));
    if (m != MAP_FAILED) munmap(m, kMappingSlots * sizeof(MappingEntry));
    failed_ = true;
    return false;
  }
  handles_ = static_cast<HandleEntry*>(h);
  mappings_ = static_cast<MappingEntry*>(m);
  return true;
}

VmmLedger::HandleEntry* VmmLedger::find_handle(uint64_t handle) {
  if (handles_ == nullptr || handle == 0) return nullptr;
  HandleEntry* e = probe(handles_, kHandleSlots, handle, handle_key);
  return e != nullptr && e->handle == handle ? e : nullptr;
}

VmmLedger::MappingEntry* VmmLedger::find_mapping(uint64_t addr) {
  if (mappings_ == nullptr || addr == 0) return nullptr;
  MappingEntry* e = probe(mappings_, kMappingSlots, addr, mapping_key);
  return e != nullptr && e->addr == addr ? e : nullptr;
}

void VmmLedger::erase_handle(HandleEntry* entry) {
  erase_at(handles_, kHandleSlots, entry, handle_key);
  --handle_count_;
}

void VmmLedger::erase_mapping(MappingEntry* entry) {
  erase_at(mappings_, kMappingSlots, entry, mapping_key);
  --mapping_count_;
}

bool VmmLedger::created(uint64_t handle, format::Kind kind, bool counted) {
  SpinGuard guard(lock_);
  // Three quarters full at most, so that probe runs stay short.
  if (handle == 0 || !ensure_tables() || handle_count_ >= kHandleSlots / 4 * 3) return false;
  HandleEntry* e = probe(handles_, kHandleSlots, handle, handle_key);
  if (e->handle == 0) ++handle_count_;
  // A handle value the driver hands out again is a new allocation.
  *e = HandleEntry{handle, 1, 0, static_cast<uint8_t>(kind), static_cast<uint8_t>(counted ? 1 : 0)};
  return true;
}

bool VmmLedger::retained(uint64_t handle) {
  SpinGuard guard(lock_);
  HandleEntry* e = find_handle(handle);
  if (e != nullptr) ++e->refs;
  return e != nullptr;
}

void VmmLedger::mapped(uint64_t addr, uint64_t size, uint64_t handle) {
  SpinGuard guard(lock_);
  HandleEntry* h = find_handle(handle);
  if (h == nullptr || mapping_count_ >= kMappingSlots / 4 * 3) return;
  MappingEntry* m = probe(mappings_, kMappingSlots, addr, mapping_key);
  if (m->addr == 0) {
    ++mapping_count_;
  } else if (HandleEntry* old = find_handle(m->handle)) {
    --old->mappings;  // not unmapped through a hook we saw
  }
  *m = MappingEntry{addr, size, handle};
  ++h->mappings;
}

VmmLedger::Release VmmLedger::released(uint64_t handle, format::Kind* kind) {
  SpinGuard guard(lock_);
  HandleEntry* e = find_handle(handle);
  if (e == nullptr) return Release::kUnknown;
  if (--e->refs > 0 || e->mappings > 0) return Release::kKept;
  const bool counted = e->counted != 0;
  *kind = static_cast<format::Kind>(e->kind);
  erase_handle(e);
  return counted ? Release::kFreed : Release::kKept;
}

void VmmLedger::unmapped(uint64_t addr, uint64_t size, void (*on_freed)(void*, const Freed&), void* context) {
  SpinGuard guard(lock_);
  // Whole adjacent mappings (the driver refuses anything else).
  for (uint64_t cursor = addr; cursor < addr + size;) {
    MappingEntry* m = find_mapping(cursor);
    if (m == nullptr || m->size == 0) break;
    const uint64_t handle = m->handle;
    cursor += m->size;
    erase_mapping(m);
    HandleEntry* h = find_handle(handle);
    if (h == nullptr || --h->mappings > 0 || h->refs > 0) continue;
    if (h->counted != 0) on_freed(context, Freed{handle, static_cast<format::Kind>(h->kind)});
    erase_handle(h);
  }
}

namespace {
constinit VmmLedger g_vmm_ledger;
[[maybe_unused]] const bool g_vmm_ledger_fork = fork_held_locks().add(g_vmm_ledger.fork_lock());
}  // namespace

VmmLedger& vmm_ledger() { return g_vmm_ledger; }

}  // namespace memledger::interposer
