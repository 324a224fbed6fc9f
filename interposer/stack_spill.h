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
  static constexpr uint32_t kWords = 1u << 17;  // 1 MiB, touched as used
  static constexpr uint64_t kMask = kWords - 1;
  // An event's stack field that names a spilled stack: this bit, and the
  // low 31 bits of its position. Stack ids are below 2^24.
  static constexpr uint32_t kMarker = 1u << 31;
  // The most words a stack takes here (StackTable::intern caps it later).
  static constexpr uint32_t kMaxDepth = 512;
  // A stack's header word: its depth (bits 0..9), its Python frames
  // (10..19), this tag (20..39: a stack starts here, a check on the
  // position) and, once the writer interned it, its id (40..63).
  static constexpr uint64_t kHeaderTag = uint64_t{0xa5c3f} << 20;
  static constexpr uint64_t kTagMask = uint64_t{0xfffff} << 20;

  alignas(64) std::atomic<uint64_t> head{0};  // the next position the producer fills
  alignas(64) std::atomic<uint64_t> tail{0};  // the first position the consumer has not read
  // Set by the producer from the moment it spills a stack until its event
  // is pushed: a signal handler that allocates on the same thread
  // meanwhile interns its stack itself, so that stacks lie here in the
  // order of their events.
  volatile uint32_t busy = 0;
  // The producer waited for room and the consumer made none
  // (Recorder::spill_when_room): it does not wait again until it finds room.
  uint32_t stalled = 0;
  // The producer's stacks spilled lately, by a hash of their words: where
  // each lies here, so that the next time the thread meets it, the id the
  // writer gave it is read back (known()) instead of spilling it again.
  struct Seen {
    uint64_t hash;
    uint64_t at;
  };
  static constexpr uint32_t kSeen = 256;
  Seen seen[kSeen];
  uint64_t words[kWords];

  static bool is_marker(uint32_t stack) { return (stack & kMarker) != 0; }
  // A header's bits below the id.
  static constexpr uint64_t header_of(uint32_t depth, uint32_t python) {
    return kHeaderTag | uint64_t{python} << 10 | depth;
  }
  static constexpr uint64_t kIdShift = 40;

  // Producer: copies `depth` words (`python` of them Python frames) and
  // returns the stack's marker, or 0 when there is no room; `at`: its position.
  uint32_t put(const uintptr_t* frames, uint32_t depth, uint32_t python, uint64_t* at_out = nullptr) {
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
    std::atomic_ref<uint64_t>(words[at & kMask]).store(header_of(depth, python), std::memory_order_relaxed);
    copy_in(at + 1, frames, depth);
    // The event that names it is published after this (the ring's head,
    // with release): the writer that reads the event reads these words.
    head.store(at + need, std::memory_order_release);
    if (at_out != nullptr) *at_out = at;
    return kMarker | static_cast<uint32_t>(at & (kMarker - 1));
  }

  // Words in use, as the producer sees them.
  uint64_t used() const { return head.load(std::memory_order_relaxed) - tail.load(std::memory_order_relaxed); }

  // Producer: the id the writer gave the stack put at `at`, when that stack
  // is still here (not written over since) and is `frames`; else 0, and
  // `waiting` says whether it is there, not interned yet.
  uint32_t known(uint64_t at, const uintptr_t* frames, uint32_t depth, uint32_t python, bool* waiting) const {
    *waiting = false;
    // Written over once the producer reached a lap past it.
    if (head.load(std::memory_order_relaxed) > at + kWords - (depth + 1)) return 0;
    const uint64_t header = std::atomic_ref<const uint64_t>(words[at & kMask]).load(std::memory_order_acquire);
    const uint64_t id_bits = ~uint64_t{0} << kIdShift;
    if ((header & ~id_bits) != header_of(depth, python) || !same_words(at + 1, frames, depth)) return 0;
    const auto id = static_cast<uint32_t>(header >> kIdShift);
    *waiting = id == 0 && at >= tail.load(std::memory_order_acquire);
    return id;
  }

  // Consumer: the stack `marker` names, into `out` (room for kMaxDepth);
  // returns its depth and sets `python` and its position `at`, or 0 when
  // the marker names no stack here. release() hands it back.
  uint32_t take(uint32_t marker, uintptr_t* out, uint32_t* python, uint64_t* at_out) const {
    const uint64_t from = tail.load(std::memory_order_relaxed);
    const uint64_t end = head.load(std::memory_order_acquire);
    const uint64_t at = from + ((uint64_t{marker} - from) & (kMarker - 1));
    if (at >= end) return 0;
    const uint64_t header = std::atomic_ref<const uint64_t>(words[at & kMask]).load(std::memory_order_relaxed);
    const auto depth = static_cast<uint32_t>(header & 0x3ff);
    const auto py = static_cast<uint32_t>(header >> 10 & 0x3ff);
    if ((header & kTagMask) != kHeaderTag || depth == 0 || depth > kMaxDepth || py > depth || at + 1 + depth > end) {
      return 0;
    }
    copy_out(at + 1, out, depth);
    *python = py;
    *at_out = at;
    return depth;
  }
  // Consumer: the stack at `at` (take()) was given `id` (0: none), and its
  // words, with every one before them, go back to the producer.
  void release(uint64_t at, uint32_t depth, uint32_t id) {
    std::atomic_ref<uint64_t> header(words[at & kMask]);
    header.store(header.load(std::memory_order_relaxed) | uint64_t{id & 0xffffff} << kIdShift,
                 std::memory_order_release);
    tail.store(at + 1 + depth, std::memory_order_release);
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
    memset(seen, 0, sizeof seen);
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
  bool same_words(uint64_t at, const uintptr_t* frames, uint32_t n) const {
    const uint64_t slot = at & kMask;
    const uint64_t first = n < kWords - slot ? n : kWords - slot;
    return memcmp(&words[slot], frames, first * sizeof(uint64_t)) == 0 &&
           memcmp(&words[0], frames + first, (n - first) * sizeof(uint64_t)) == 0;
  }
};

}  // namespace memledger::interposer
