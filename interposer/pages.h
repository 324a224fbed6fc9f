// Anonymous memory of memledger's own handed back to the kernel while it
// stays mapped: its whole pages read as zeros again and stop counting in
// the process's resident memory.
#pragma once

#include <cstdint>

#include <sys/mman.h>
#include <unistd.h>

namespace memledger::interposer {

// What hand_back_whole_pages() handed back: [first, last), empty (first ==
// last == the range's begin) when the range holds no whole page or the
// kernel refused. The parts of the range outside it, [begin, first) and
// [last, end), are left as they were.
struct PageSpan {
  uintptr_t first;
  uintptr_t last;
};

// Hands back the whole pages inside [begin, end).
inline PageSpan hand_back_whole_pages(uintptr_t begin, uintptr_t end) {
  const auto page = static_cast<uintptr_t>(getpagesize());
  const uintptr_t first = (begin + page - 1) & ~(page - 1);
  const uintptr_t last = end & ~(page - 1);
  if (first >= last || madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) {
    return PageSpan{begin, begin};
  }
  return PageSpan{first, last};
}

}  // namespace memledger::interposer
