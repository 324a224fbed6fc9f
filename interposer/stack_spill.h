// Stacks a thread hands to the writer thread to intern.
//
// In full mode almost every allocation of a Python program has a stack
// with Python frames, and while a program imports (`import torch`: 1.5
// million allocations, 1.09 million distinct stacks of some 70 frames)
// most are new: interning one adds a few nodes to the stack table, with
// the cache misses that go with them, and took about 40% of what tracing
// added to the thread. A thread copies such a stack's words here instead,
// and the allocation's event names the stack by its place here (kMarker).
// The writer thread, on another core, interns the stack when it writes
// the event, and puts the id in the event's place.
//
// One producer (the ring's thread) and one consumer (the writer). A stack
// is a header word and its words, at increasing positions (taken modulo
// the buffer's size). The writer reads them in the order of its ring's
// events, which is the order they were put here: a stack whose event was
// never pushed (dropped when its ring stayed full) is passed over.
// When there is no room, the thread waits while the writer makes some
// (Recorder::spill_when_room), and interns the stack itself when it makes
// none.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

namespace memledger::interposer {

struct StackSpill {
  static constexpr uint32_t kWords = 1u << 17;  // 512 KiB, touched as used
  static constexpr uint64_t kMask = kWords - 1;
  // An event's stack field that names a spilled stack: this bit, and the
  // low 31 bits of its position. Stack ids are below 2^24.
  static constexpr uint32_t kMarker = 1u << 31;
  // The most words a stack takes here (StackTable::intern caps it later).
  static constexpr uint32_t kMaxDepth = 512;
  // The header's top half: a stack starts here (a check on the position).
  static constexpr uint64_t kHeaderTag = uint64_t{0x5350494c} << 32;

  alignas(64) std::atomic<uint64_t> head{0};  // the next position the producer fills
  alignas(64) std::atomic<uint64_t> tail{0};  // the first position the consumer has not read
  // Set by the producer from the moment it spills a stack until its event
  // is pushed: a signal handler that allocates on the same thread
  // meanwhile interns its stack itself (OwnedUse), so that stacks lie here
  // in the order of their events.
  volatile uint32_t busy = 0;
  // The producer waited for room and the consumer made none
  // (Recorder::spill_when_room): it does not wait again until it finds room.
  uint32_t stalled = 0;
  uint64_t words[kWords];

  static bool is_marker(uint32_t stack) { return (stack & kMarker) != 0; }

  // Producer: copies `depth` words (`python` of them Python frames) and
  // returns the stack's marker, or 0 when there is no room.
  uint32_t put(const uintptr_t* frames, uint32_t depth, uint32_t python) {
    if (depth == 0 || depth > kMaxDepth || python > depth) return 0;
    uint64_t at = head.load(std::memory_order_relaxed);
    const uint64_t read = tail.load(std::memory_order_acquire);
    // Read to the end while past its first eighth: the next stack goes to
    // the buffer's first word, so that a thread the writer keeps up with
    // touches the first pages only (positions go on rising: this is the
    // next lap's start).
    if (at == read && (at & kMask) > kWords / 8) at = (at | kMask) + 1;
    const uint64_t need = uint64_t{depth} + 1;
    if (at + need - read > kWords) return 0;
    stalled = 0;
    words[at & kMask] = kHeaderTag | uint64_t{python} << 16 | depth;
    copy_in(at + 1, frames, depth);
    // The event that names it is published after this (the ring's head,
    // with release): the writer that reads the event reads these words.
    head.store(at + need, std::memory_order_release);
    return kMarker | static_cast<uint32_t>(at & (kMarker - 1));
  }

  // Words in use, as the producer sees them.
  uint64_t used() const { return head.load(std::memory_order_relaxed) - tail.load(std::memory_order_relaxed); }

  // Consumer: the stack `marker` names, into `out` (room for kMaxDepth);
  // returns its depth and sets `python`, or 0 when the marker names no
  // stack here. Hands back its words and every one before them.
  uint32_t take(uint32_t marker, uintptr_t* out, uint32_t* python) {
    const uint64_t from = tail.load(std::memory_order_relaxed);
    const uint64_t end = head.load(std::memory_order_acquire);
    const uint64_t at = from + ((uint64_t{marker} - from) & (kMarker - 1));
    if (at >= end) return 0;
    const uint64_t header = words[at & kMask];
    const auto depth = static_cast<uint32_t>(header & 0xffff);
    const auto py = static_cast<uint32_t>(header >> 16 & 0xffff);
    if ((header & ~uint64_t{0xffffffff}) != kHeaderTag || depth == 0 || depth > kMaxDepth || py > depth ||
        at + 1 + depth > end) {
      return 0;
    }
    copy_out(at + 1, out, depth);
    tail.store(at + 1 + depth, std::memory_order_release);
    *python = py;
    return depth;
  }

  // A fork child's own thread: what is here belongs to the parent's
  // trace. Positions go on, so a marker from before names nothing.
  void drop_pending() { tail.store(head.load(std::memory_order_relaxed), std::memory_order_relaxed); }

  // No producer (its thread has gone, or did not come along a fork): what
  // is here is dropped, and a new producer starts at the first word.
  void reset_to_start() {
    head.store(0, std::memory_order_relaxed);
    tail.store(0, std::memory_order_relaxed);
    busy = 0;
    stalled = 0;
  }

 private:
  void copy_in(uint64_t at, const uintptr_t* from, uint32_t n) {
    const uint64_t slot = at & kMask;
    const uint64_t first = n < kWords - slot ? n : kWords - slot;
    memcpy(&words[slot], from, first * sizeof(uint64_t));
    memcpy(&words[0], from + first, (n - first) * sizeof(uint64_t));
  }
  void copy_out(uint64_t at, uintptr_t* to, uint32_t n) const {
    const uint64_t slot = at & kMask;
    const uint64_t first = n < kWords - slot ? n : kWords - slot;
    memcpy(to, &words[slot], first * sizeof(uint64_t));
    memcpy(to + first, &words[0], (n - first) * sizeof(uint64_t));
  }
};

}  // namespace memledger::interposer
