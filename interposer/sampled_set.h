// Sampled host mode: the addresses of the sampled blocks still live, so
// that their frees are recorded, and what the counting filter in front of
// them keeps per slot (recorder.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace memledger::interposer {

// An open-addressing set of addresses with linear probes. An erased entry
// leaves no mark (the entries after it in its run move back), so probes stay
// short however many addresses came and went, and the table is sized by the
// live entries: twice as large where they would fill more than half of it,
// half as large (not below kMinCapacity) where they fill less than an
// eighth. Not thread-safe: the recorder holds a lock per set.
class AddressSet {
 public:
  static constexpr size_t kMinCapacity = 64;
  // False only when the table is full and cannot grow (no memory).
  bool insert(uintptr_t addr);
  bool erase(uintptr_t addr);
  bool contains(uintptr_t addr) const;
  size_t size() const { return used_; }
  size_t capacity() const { return capacity_; }

 private:
  size_t home(uintptr_t addr) const { return (addr >> 4) & (capacity_ - 1); }
  void resize(size_t capacity);

  uintptr_t* slots_ = nullptr;  // 0: empty
  size_t capacity_ = 0;
  size_t used_ = 0;
};

// The word behind a slot of the counting filter: how many sampled live
// blocks begin in the slot (a 4 KiB page), in the top 16 bits, and while
// there is exactly one, its address below. A free of another block of
// that page is then told apart without the locked sets. kMany stands
// for more than one, and for one left of several (which one is not known);
// a count of 0xffff stays for good.
namespace slot_word {
inline constexpr uint64_t kMany = 1;
inline constexpr int kCountShift = 48;
inline constexpr uint64_t kAddressMask = (uint64_t{1} << kCountShift) - 1;
inline constexpr uint64_t kSaturated = 0xffff;

inline uint64_t count(uint64_t w) { return w >> kCountShift; }
inline uint64_t after_insert(uint64_t w, uintptr_t addr) {
  const uint64_t n = count(w);
  if (n == kSaturated) return w;
  return (n + 1) << kCountShift | (n == 0 ? addr & kAddressMask : kMany);
}
inline uint64_t after_erase(uint64_t w) {
  const uint64_t n = count(w);
  if (n == 0 || n == kSaturated) return w;
  return n == 1 ? 0 : (n - 1) << kCountShift | kMany;
}
// True where `addr` cannot be a sampled live block of the slot. Sound
// because a free comes after its block's sampling: the word read then
// counts that block, and a count of one with a known address came from
// that address's insert with nothing after it.
inline bool rules_out(uint64_t w, uintptr_t addr) {
  const uint64_t n = count(w);
  if (n == 0) return true;
  const uint64_t known = w & kAddressMask;
  return n == 1 && known != kMany && known != (addr & kAddressMask);
}
}  // namespace slot_word

}  // namespace memledger::interposer
