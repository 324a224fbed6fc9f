// Exported entry points: the stream-ordered allocator and memory pools.

#include "driver_state.h"

using namespace memledger::simcuda;

namespace {

CUresult pool_alloc(Call& call, MemPool* pool, size_t bytes, CUdeviceptr* dptr) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t addr = 0;
  size_t rounded = 0;
  if (CUresult r = pool->allocate(bytes, &addr, &rounded)) return r;
  call.st.blocks.emplace(addr, Block{bytes, rounded, &pool->device(), nullptr, pool, BlockKind::kPool, false});
  *dptr = addr;
  return CUDA_SUCCESS;
}

// The stream being captured, or nullptr.
Stream* capturing(Call& call, CUstream stream) {
  Stream* s = call.stream_object(stream);
  return s != nullptr && s->capture != nullptr ? s : nullptr;
}

// From the pool current to the stream's device; while the stream is being
// captured, an allocation node of its graph (graph.h).
CUresult alloc_async(Call& call, CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(stream, &ctx)) return r;
  if (Stream* s = capturing(call, stream)) {
    if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    return capture_alloc(call.st, s, ctx->device, bytes, dptr);
  }
  return pool_alloc(call, ctx->device->current_pool, bytes, dptr);
}

// The pool may belong to another device than the stream.
CUresult alloc_from_pool(Call& call, CUdeviceptr* dptr, size_t bytes, CUmemoryPool handle, CUstream stream) {
  MemPool* pool = nullptr;
  if (CUresult r = call.pool(handle, &pool)) return r;
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(stream, &ctx)) return r;
  if (Stream* s = capturing(call, stream)) {
    if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    return capture_alloc(call.st, s, &pool->device(), bytes, dptr);
  }
  return pool_alloc(call, pool, bytes, dptr);
}

// Immediately: nothing runs on a simulated stream, so the free has already
// "happened" in stream order. Linear blocks are accepted too. While the
// stream is being captured: a free node of its graph.
CUresult free_async(Call& call, CUdeviceptr dptr, CUstream stream) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(stream, &ctx)) return r;
  if (Stream* s = capturing(call, stream)) return capture_free(call.st, s, dptr);
  return free_block(call.st, dptr);
}

// Where a pool of this location and allocation type keeps its memory: the
// device, or the host's stand-in device (host and NUMA locations, and
// managed memory without a location). Pinned memory needs a device or host
// location; managed memory may also have none (cuda.h, cuMemGetDefaultMemPool).
CUresult pool_location(Call& call, const CUmemLocation* location, CUmemAllocationType type, Device** out) {
  if (CUresult r = call.initialized()) return r;
  if (location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED && type != CU_MEM_ALLOCATION_TYPE_MANAGED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  switch (location->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      return call.device(location->id, out);
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      *out = &call.st.host;
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_NONE:
      if (type != CU_MEM_ALLOCATION_TYPE_MANAGED) return CUDA_ERROR_INVALID_VALUE;
      *out = &call.st.host;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

bool is_device_pinned(const CUmemLocation* location, CUmemAllocationType type) {
  return location->type == CU_MEM_LOCATION_TYPE_DEVICE && type == CU_MEM_ALLOCATION_TYPE_PINNED;
}

// The default pool of a location and type other than a device's pinned one.
MemPool* other_default_pool(Call& call, Device* device, const CUmemLocation* location, CUmemAllocationType type) {
  const int slot = type == CU_MEM_ALLOCATION_TYPE_PINNED ? kMaxDevices + 1
                   : device == &call.st.host             ? kMaxDevices
                                                          : device->ordinal();
  MemPool*& pool = call.st.other_default_pools[slot];
  if (pool == nullptr) {
    CUmemPoolProps props{};
    props.allocType = type;
    props.location = *location;
    pool = internal_new<MemPool>(*device, true, props);
    call.st.pools.insert(pool);
  }
  return pool;
}

CUresult set_current_pool(Call& call, Device* device, CUmemoryPool handle) {
  MemPool* pool = nullptr;
  if (CUresult r = call.pool(handle, &pool)) return r;
  if (&pool->device() != device || pool->props().allocType != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  device->current_pool = pool;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  Call call(Sym::cuMemAllocAsync);
  return alloc_async(call, dptr, bytesize, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  Call call(Sym::cuMemAllocAsync_ptsz);
  return alloc_async(call, dptr, bytesize, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  Call call(Sym::cuMemAllocFromPoolAsync);
  return alloc_from_pool(call, dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  Call call(Sym::cuMemAllocFromPoolAsync_ptsz);
  return alloc_from_pool(call, dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  Call call(Sym::cuMemFreeAsync);
  return free_async(call, dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  Call call(Sym::cuMemFreeAsync_ptsz);
  return free_async(call, dptr, hStream);
}

CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  Call call(Sym::cuMemPoolCreate);
  if (pool == nullptr || poolProps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Device* device = nullptr;
  if (CUresult r = pool_location(call, &poolProps->location, poolProps->allocType, &device)) return r;
  auto* created = internal_new<MemPool>(*device, false, *poolProps);
  call.st.pools.insert(created);
  *pool = to_handle(created);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  Call call(Sym::cuMemPoolDestroy);
  MemPool* p = nullptr;
  if (CUresult r = call.pool(pool, &p)) return r;
  if (p->is_default()) return CUDA_ERROR_INVALID_VALUE;
  Device& device = p->device();
  if (device.current_pool == p) device.current_pool = device.default_pool;
  // With blocks still allocated the call returns at once and the pool goes
  // away with its last block (see free_block).
  p->trim_to(0);
  if (p->live_blocks() > 0) {
    p->destroyed = true;
  } else {
    call.st.pools.erase(p);
    internal_delete(p);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  Call call(Sym::cuMemPoolTrimTo);
  MemPool* p = nullptr;
  if (CUresult r = call.pool(pool, &p)) return r;
  p->trim_to(minBytesToKeep);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  Call call(Sym::cuMemPoolGetAttribute);
  MemPool* p = nullptr;
  if (CUresult r = call.pool(pool, &p)) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return p->get_attribute(attr, value);
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  Call call(Sym::cuMemPoolSetAttribute);
  MemPool* p = nullptr;
  if (CUresult r = call.pool(pool, &p)) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return p->set_attribute(attr, value);
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  Call call(Sym::cuDeviceGetDefaultMemPool);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool_out = to_handle(device->default_pool);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  Call call(Sym::cuDeviceGetMemPool);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool = to_handle(device->current_pool);
  return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  Call call(Sym::cuDeviceSetMemPool);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  return set_current_pool(call, device, pool);
}

CUresult cuMemGetDefaultMemPool(CUmemoryPool* pool_out, CUmemLocation* location, CUmemAllocationType type) {
  Call call(Sym::cuMemGetDefaultMemPool);
  Device* device = nullptr;
  if (CUresult r = pool_location(call, location, type, &device)) return r;
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool_out = to_handle(is_device_pinned(location, type) ? device->default_pool
                                                         : other_default_pool(call, device, location, type));
  return CUDA_SUCCESS;
}

// Only a device's pinned pool can be replaced (cuMemSetMemPool of another
// location or type is NOT_SUPPORTED here): the others are their defaults.
CUresult cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
  Call call(Sym::cuMemGetMemPool);
  Device* device = nullptr;
  if (CUresult r = pool_location(call, location, type, &device)) return r;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool = to_handle(is_device_pinned(location, type) ? device->current_pool
                                                     : other_default_pool(call, device, location, type));
  return CUDA_SUCCESS;
}

CUresult cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) {
  Call call(Sym::cuMemSetMemPool);
  Device* device = nullptr;
  if (CUresult r = pool_location(call, location, type, &device)) return r;
  if (!is_device_pinned(location, type)) return CUDA_ERROR_NOT_SUPPORTED;
  return set_current_pool(call, device, pool);
}
