// Activity buffers for CUPTI, from one mmap'ed region reserved at start.
//
// CUPTI asks for buffers from its own threads and at any moment, including
// inside the program's malloc (a CUDA call made from a hook's caller): the
// buffers never come from the heap, so the request callback cannot recurse
// into the hooked malloc or be recorded as the program's memory. A request
// that finds the pool empty gets no buffer; CUPTI then counts the records it
// could not store, and the tracer reports them as dropped.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace memledger::cupti {

class BufferPool {
 public:
  static constexpr size_t kBufferSize = 1u << 20;  // 1 MiB: ~8000 memory records
  static constexpr size_t kBufferCount = 32;       // pages are touched only when used

  bool init();
  // A free buffer, or nullptr when all are in CUPTI's hands or being read.
  uint8_t* take();
  void give_back(uint8_t* buffer);
  bool owns(const uint8_t* buffer) const;
  // Requests that found no free buffer.
  uint64_t exhausted() const { return exhausted_.load(std::memory_order_relaxed); }

 private:
  uint8_t* base_ = nullptr;
  std::atomic<uint64_t> in_use_{0};  // bit per buffer
  std::atomic<uint64_t> exhausted_{0};
};

}  // namespace memledger::cupti
