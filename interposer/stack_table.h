// Interns call stacks: each distinct stack gets a small id, shared by every
// thread, without a lock on the lookup path. New stacks are appended to an
// mmap'ed arena and published by id for the writer, which writes each stack
// once per trace file.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace memledger::interposer {

class StackTable {
 public:
  static constexpr uint32_t kMaxStacks = 1u << 21;
  // Native frames (--stack-depth at most 128) plus as many Python frames.
  static constexpr uint32_t kMaxNativeDepth = 128;
  static constexpr uint32_t kMaxDepth = 256;

  // Maps the memory. Returns false if the kernel refused it.
  bool init();
  // Returns the id of this stack (1-based), adding it if new; 0 when the
  // table is full or not initialised.
  uint32_t intern(const uintptr_t* frames, uint32_t depth);
  // Number of ids handed out so far (ids are 1..count()).
  uint32_t count() const { return next_id_.load(std::memory_order_acquire) - 1; }
  // The frames of a published stack; false while `id` is still being written.
  bool get(uint32_t id, const uintptr_t** frames, uint32_t* depth) const;
  // Whether no thread is between claiming a slot and publishing its id
  // (fork() waits for this, so that the child has no slot left unpublished).
  bool quiet() const { return publishing_.load(std::memory_order_acquire) == 0; }
  // In a fork child: only the forking thread came along.
  void reset_after_fork() { publishing_.store(0, std::memory_order_relaxed); }

 private:
  struct Slot {
    std::atomic<uint64_t> hash;  // 0 = empty
    std::atomic<uint32_t> id;    // 0 until published
    uint32_t pad;
  };
  static constexpr uint32_t kSlots = kMaxStacks * 2;
  uint32_t publish(Slot& slot, const uintptr_t* frames, uint32_t depth);
  static constexpr size_t kArenaBytes = size_t{1} << 30;  // reserved, touched as used

  Slot* slots_ = nullptr;
  std::atomic<uint64_t>* offsets_ = nullptr;  // by id: arena offset + 1 (0 = unpublished)
  uint8_t* arena_ = nullptr;
  std::atomic<size_t> arena_used_{0};
  std::atomic<uint32_t> next_id_{1};
  std::atomic<int> publishing_{0};
};

}  // namespace memledger::interposer
