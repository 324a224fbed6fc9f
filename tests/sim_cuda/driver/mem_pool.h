// A stream-ordered memory pool: a device's default pool, or one made by
// cuMemPoolCreate. The pool reserves device memory in chunks (kPoolChunk, or
// the request rounded up to the granularity when larger) that count against
// the device's capacity; freed blocks go back to their chunk and the chunk
// stays reserved until cuMemPoolTrimTo, or until a synchronize finds the
// pool holding more than its release threshold (default 0: the real driver
// then returns all unused memory at every synchronize).
//
// Stream order is trivially satisfied: nothing ever runs on a stream, so a
// cuMemFreeAsync'd block is reusable at once.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "address_range.h"
#include "device.h"
#include "internal_heap.h"

namespace memledger::simcuda {

inline constexpr size_t kPoolChunk = 32 * kMiB;
// Pool blocks are carved at this alignment; used bytes count rounded to it.
inline constexpr size_t kPoolAlignment = 512;

class MemPool {
 public:
  MemPool(Device& device, bool is_default, const CUmemPoolProps& props);
  ~MemPool();  // gives every chunk back to the device
  MemPool(const MemPool&) = delete;
  MemPool& operator=(const MemPool&) = delete;

  // The caller holds the driver lock for all of these.
  // A block of `bytes` (counted as `*rounded` used bytes); OUT_OF_MEMORY when
  // neither a chunk nor the device has room, after trimming this pool.
  CUresult allocate(size_t bytes, uintptr_t* out, size_t* rounded);
  void release_block(uintptr_t addr, size_t rounded);
  // Gives unused chunks back while at least `keep` bytes stay reserved.
  void trim_to(size_t keep);
  // What a stream/context synchronize does to the pool.
  void trim_after_sync() { trim_to(release_threshold_); }

  CUresult get_attribute(CUmemPool_attribute attr, void* value) const;
  CUresult set_attribute(CUmemPool_attribute attr, const void* value);

  Device& device() const { return device_; }
  bool is_default() const { return is_default_; }
  const CUmemPoolProps& props() const { return props_; }
  size_t reserved() const { return reserved_; }
  size_t used() const { return used_; }
  size_t live_blocks() const { return live_blocks_; }

  // Set by cuMemPoolDestroy while blocks are still allocated: the pool then
  // goes away with its last block.
  bool destroyed = false;

 private:
  struct Chunk {
    uintptr_t base;
    size_t size;
    size_t used;
    AddressRange space;
  };

  Chunk* grow(size_t bytes);
  void release_chunk(size_t index);

  Device& device_;
  bool is_default_;
  CUmemPoolProps props_;
  InternalVector<Chunk*> chunks_;
  size_t reserved_ = 0;
  size_t used_ = 0;
  size_t reserved_high_ = 0;
  size_t used_high_ = 0;
  size_t live_blocks_ = 0;
  cuuint64_t release_threshold_ = 0;
  int reuse_follow_event_dependencies_ = 1;
  int reuse_allow_opportunistic_ = 1;
  int reuse_allow_internal_dependencies_ = 1;
};

}  // namespace memledger::simcuda
