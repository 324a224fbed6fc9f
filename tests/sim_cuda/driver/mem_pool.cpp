#include "mem_pool.h"

#include <algorithm>

namespace memledger::simcuda {

MemPool::MemPool(Device& device, bool is_default, const CUmemPoolProps& props)
    : device_(device), is_default_(is_default), props_(props) {}

MemPool::~MemPool() {
  while (!chunks_.empty()) release_chunk(chunks_.size() - 1);
}

CUresult MemPool::allocate(size_t bytes, uintptr_t* out, size_t* rounded) {
  const size_t size = round_up(bytes, kPoolAlignment);
  Chunk* home = nullptr;
  std::optional<uintptr_t> addr;
  for (Chunk* chunk : chunks_) {
    addr = chunk->space.allocate(size, kPoolAlignment);
    if (addr) {
      home = chunk;
      break;
    }
  }
  if (!addr) {
    home = grow(size);
    if (home == nullptr) {
      // Like the real allocator, give back what this pool holds unused
      // before reporting out of memory.
      trim_to(0);
      home = grow(size);
    }
    if (home == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    addr = home->space.allocate(size, kPoolAlignment);
  }
  home->used += size;
  used_ += size;
  used_high_ = std::max(used_high_, used_);
  ++live_blocks_;
  *out = *addr;
  *rounded = size;
  return CUDA_SUCCESS;
}

void MemPool::release_block(uintptr_t addr, size_t rounded) {
  for (Chunk* chunk : chunks_) {
    if (addr >= chunk->base && addr - chunk->base < chunk->size) {
      chunk->space.release(addr, rounded);
      chunk->used -= rounded;
      used_ -= rounded;
      --live_blocks_;
      return;
    }
  }
}

void MemPool::trim_to(size_t keep) {
  // Newest chunks first: the oldest are the ones a steady workload reuses.
  for (size_t i = chunks_.size(); i-- > 0;) {
    const Chunk* chunk = chunks_[i];
    if (chunk->used == 0 && reserved_ - chunk->size >= keep) release_chunk(i);
  }
}

MemPool::Chunk* MemPool::grow(size_t bytes) {
  const size_t size = std::max(kPoolChunk, round_up(bytes, kGranularity));
  if (props_.maxSize != 0 && reserved_ + size > props_.maxSize) return nullptr;
  if (!device_.hold(size)) return nullptr;
  std::optional<uintptr_t> base = device_.map_linear(size);
  if (!base) {
    device_.unhold(size);
    return nullptr;
  }
  Chunk* chunk = internal_new<Chunk>(Chunk{*base, size, 0, AddressRange(*base, size)});
  chunks_.push_back(chunk);
  reserved_ += size;
  reserved_high_ = std::max(reserved_high_, reserved_);
  return chunk;
}

void MemPool::release_chunk(size_t index) {
  Chunk* chunk = chunks_[index];
  device_.unmap_linear(chunk->base, chunk->size);
  device_.unhold(chunk->size);
  reserved_ -= chunk->size;
  chunks_.erase(chunks_.begin() + static_cast<std::ptrdiff_t>(index));
  internal_delete(chunk);
}

CUresult MemPool::get_attribute(CUmemPool_attribute attr, void* value) const {
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      *static_cast<int*>(value) = reuse_follow_event_dependencies_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      *static_cast<int*>(value) = reuse_allow_opportunistic_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = reuse_allow_internal_dependencies_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *static_cast<cuuint64_t*>(value) = release_threshold_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = reserved_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = reserved_high_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = used_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = used_high_;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult MemPool::set_attribute(CUmemPool_attribute attr, const void* value) {
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      reuse_follow_event_dependencies_ = *static_cast<const int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      reuse_allow_opportunistic_ = *static_cast<const int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      reuse_allow_internal_dependencies_ = *static_cast<const int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      release_threshold_ = *static_cast<const cuuint64_t*>(value);
      return CUDA_SUCCESS;
    // The high watermarks can only be reset, to the current value, by
    // writing zero; the current amounts are read-only.
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (*static_cast<const cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      reserved_high_ = reserved_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (*static_cast<const cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      used_high_ = used_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace memledger::simcuda
