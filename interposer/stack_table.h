// Interns call stacks: each distinct stack gets a small id, shared by every
// thread, without a lock. Stacks are kept as a tree of frames (a calling
// context tree, as heaptrack keeps its traces): a stack is the path from
// the root to its node, and its id is that node's. Stacks that share their
// outer frames share those nodes, so a new stack costs the frames in which
// it differs from every stack seen before, 20 bytes each, where storing
// whole stacks cost their whole depth (a Python import made 700,000
// distinct stacks of 67 frames on average: 380 MB whole, under 80 MB as a
// tree). The writer writes each stack the first time an event refers to it.
//
// The path runs from the outermost Python frame to the innermost, then
// from the outermost native frame to the innermost: Python frames change
// less often between allocations than the native frames below them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace memledger::interposer {

class StackTable {
 public:
  // Native frames (--stack-depth at most 128) plus as many Python frames.
  static constexpr uint32_t kMaxNativeDepth = 128;
  static constexpr uint32_t kMaxDepth = 256;
  static constexpr uint32_t kMaxNodes = 1u << 24;  // 320 MiB reserved, touched as used

  // The path of a thread's previous stack: a new stack that shares its
  // start is found without looking those nodes up again. Owned by one
  // thread at a time.
  struct PathCache {
    uint32_t depth;
    // Set while intern() uses it: a signal handler that interns on the
    // same thread in the middle of that goes without.
    volatile uint32_t busy;
    uint32_t nodes[kMaxDepth];
    uintptr_t words[kMaxDepth];
  };

  // Maps the memory. Returns false if the kernel refused it.
  bool init();
  // Returns the id of the stack `frames` (`python` Python frame words,
  // innermost first, then native frames, innermost first), adding it if
  // new; 0 when the table is full or not initialised. `cache`: the calling
  // thread's, or nullptr.
  uint32_t intern(const uintptr_t* frames, uint32_t depth, uint32_t python = 0, PathCache* cache = nullptr);
  // Number of ids handed out so far: ids are below count() + 1. Not every
  // id below is a stack (a node may only lie on other stacks' paths).
  uint32_t count() const { return next_id_.load(std::memory_order_acquire) - 1; }
  // Copies the frames of stack `id` into `out` (room for kMaxDepth), in
  // intern()'s order; returns the depth, 0 for an unknown id.
  uint32_t get(uint32_t id, uintptr_t* out) const;
  // Whether no thread is between claiming a node and linking it (fork()
  // waits for this, so that the child has no half-made node).
  bool quiet() const { return publishing_.load(std::memory_order_acquire) == 0; }
  // In a fork child: only the forking thread came along.
  void reset_after_fork() { publishing_.store(0, std::memory_order_relaxed); }

 private:
  // One frame of the tree, in two arrays (20 bytes a node): the frame
  // word, and the links. `word` and `parent` are set before the node is
  // linked into its parent's child list and never change after.
  struct Links {
    uint32_t parent;
    std::atomic<uint32_t> first_child;  // 0 = none
    std::atomic<uint32_t> next_sibling;
  };
  static_assert(sizeof(Links) == 12);
  uint32_t child(uint32_t parent, uintptr_t word);

  uintptr_t* words_ = nullptr;  // by id; id 0 is the root (no frame)
  Links* links_ = nullptr;
  std::atomic<uint32_t> next_id_{1};
  std::atomic<int> publishing_{0};
};

}  // namespace memledger::interposer
