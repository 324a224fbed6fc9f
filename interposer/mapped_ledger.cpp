#include "mapped_ledger.h"

#include <sys/mman.h>

#include <cstring>

namespace memledger::interposer {

bool MappedLedger::ensure_table() {
  if (ranges_ != nullptr) return true;
  if (failed_) return false;
  void* p = mmap(nullptr, kSlots * sizeof(Range), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    failed_ = true;
    return false;
  }
  ranges_ = static_cast<Range*>(p);
  return true;
}

size_t MappedLedger::lower_bound(uint64_t addr) const {
  size_t lo = 0, hi = count_;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (ranges_[mid].end <= addr) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

bool MappedLedger::insert_at(size_t i, const Range& range) {
  if (count_ >= kSlots) return false;
  memmove(&ranges_[i + 1], &ranges_[i], (count_ - i) * sizeof(Range));
  ranges_[i] = range;
  ++count_;
  return true;
}

void MappedLedger::erase_at(size_t i) {
  memmove(&ranges_[i], &ranges_[i + 1], (count_ - i - 1) * sizeof(Range));
  --count_;
}

void MappedLedger::remove(uint64_t begin, uint64_t end, Sink& sink) {
  if (ranges_ == nullptr || begin >= end) return;
  size_t i = lower_bound(begin);
  while (i < count_ && ranges_[i].begin < end) {
    const Range old = ranges_[i];
    sink.freed(old.begin);
    erase_at(i);
    // What is left on either side stays mapped: recorded again, with the
    // stack that mapped it. The left part sorts before anything still to visit.
    if (old.begin < begin && insert_at(i, Range{old.begin, begin, old.stack})) {
      sink.allocated(old.begin, begin - old.begin, old.stack);
      ++i;
    }
    if (end < old.end && insert_at(i, Range{end, old.end, old.stack})) {
      sink.allocated(end, old.end - end, old.stack);
      ++i;
    }
  }
}

bool MappedLedger::add(uint64_t begin, uint64_t end, uint32_t stack, Sink& sink) {
  if (begin >= end || !ensure_table()) return false;
  remove(begin, end, sink);
  if (!insert_at(lower_bound(begin), Range{begin, end, stack})) return false;
  sink.allocated(begin, end - begin, stack);
  return true;
}

bool MappedLedger::find(uint64_t addr, uint32_t* stack) {
  if (ranges_ == nullptr) return false;
  const size_t i = lower_bound(addr);
  if (i >= count_ || ranges_[i].begin > addr) return false;
  *stack = ranges_[i].stack;
  return true;
}

uint64_t MappedLedger::bytes() {
  uint64_t total = 0;
  for (size_t i = 0; i < count_; ++i) total += ranges_[i].end - ranges_[i].begin;
  return total;
}

namespace {
constinit MappedLedger g_mapped_ledger;
}  // namespace

MappedLedger& mapped_ledger() { return g_mapped_ledger; }

}  // namespace memledger::interposer
