// Which anonymous mappings memledger recorded (kind `mapped`), as address
// ranges, so that an munmap or mremap of any part of them keeps the live
// bytes exact: the program may unmap the middle of a mapping, several
// mappings at once, or memory it never mapped through a hook we saw. A
// range that loses a part is recorded as freed, and what remains of it as
// new allocations with the range's original stack.
//
// The ranges are kept sorted in a table of their own mmap'ed memory (never
// the hooked heap); mappings are rare and large, so a binary search and a
// memmove per change cost nothing next to the system call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spin_lock.h"

namespace memledger::interposer {

class MappedLedger {
 public:
  // What a change did, in the order it must be recorded.
  struct Sink {
    virtual void freed(uint64_t begin) = 0;
    virtual void allocated(uint64_t begin, uint64_t size, uint32_t stack) = 0;

   protected:
    ~Sink() = default;
  };

  // [begin, end) was mapped with `stack`. Ranges it overlaps (a MAP_FIXED
  // mapping over memory already mapped) lose that part first. False when
  // the table is full or cannot be mapped: nothing is recorded then.
  bool add(uint64_t begin, uint64_t end, uint32_t stack, Sink& sink);
  // [begin, end) was unmapped: every recorded range it overlaps is freed,
  // and its parts outside [begin, end) recorded again.
  void remove(uint64_t begin, uint64_t end, Sink& sink);
  // The stack of the recorded range holding `addr`; false when none does.
  bool find(uint64_t addr, uint32_t* stack);
  // Recorded bytes now (for tests).
  uint64_t bytes();

  // Held across a change and the system call that makes it, so that the
  // records of two threads mapping the same addresses come in the order
  // the kernel served them.
  SpinLock& lock() { return lock_; }
  // A forked child's trace knows none of its parent's mappings (as with the
  // inherited heap), and the lock may have been held by another thread at
  // the fork.
  void reset_after_fork() {
    lock_.reset();
    count_ = 0;
  }

 private:
  struct Range {
    uint64_t begin;
    uint64_t end;
    uint32_t stack;
  };
  static constexpr size_t kSlots = size_t{1} << 16;

  bool ensure_table();
  size_t lower_bound(uint64_t addr) const;  // first range whose end is past addr
  bool insert_at(size_t i, const Range& range);
  void erase_at(size_t i);

  SpinLock lock_;
  Range* ranges_ = nullptr;
  size_t count_ = 0;
  bool failed_ = false;
};

MappedLedger& mapped_ledger();

}  // namespace memledger::interposer
