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

// From the pool current to the stream's device.
CUresult alloc_async(Call& call, CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(stream, &ctx)) return r;
  return pool_alloc(call, ctx->device->current_pool, bytes, dptr);
}

// The pool may belong to another device than the stream.
CUresult alloc_from_pool(Call& call, CUdeviceptr* dptr, size_t bytes, CUmemoryPool handle, CUstream stream) {
  MemPool* pool = nullptr;
  if (CUresult r = call.pool(handle, &pool)) return r;
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(stream, &ctx)) return r;
  return pool_alloc(call, pool, bytes, dptr);
}

// Immediately: nothing runs on a simulated stream, so the free has already
// "happened" in stream order. Linear blocks are accepted too.
CUresult free_async(Call& call, CUdeviceptr dptr, CUstream stream) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(stream, &ctx)) return r;
  return free_block(call.st, dptr);
}

// Only device-located pinned pools are simulated; CUDA 13's host and
// managed pools are answered NOT_SUPPORTED.
CUresult device_location(Call& call, const CUmemLocation* location, CUmemAllocationType type, Device** out) {
  if (CUresult r = call.initialized()) return r;
  if (location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED && type != CU_MEM_ALLOCATION_TYPE_MANAGED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  switch (location->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (type == CU_MEM_ALLOCATION_TYPE_MANAGED) return CUDA_ERROR_NOT_SUPPORTED;
      return call.device(location->id, out);
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_NONE:
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult set_current_pool(Call& call, Device* device, CUmemoryPool handle) {
  MemPool* pool = nullptr;
  if (CUresult r = call.pool(handle, &pool)) return r;
  if (&pool->device() != device) return CUDA_ERROR_INVALID_VALUE;
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
  if (CUresult r = device_location(call, &poolProps->location, poolProps->allocType, &device)) return r;
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
  if (CUresult r = device_location(call, location, type, &device)) return r;
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool_out = to_handle(device->default_pool);
  return CUDA_SUCCESS;
}

CUresult cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
  Call call(Sym::cuMemGetMemPool);
  Device* device = nullptr;
  if (CUresult r = device_location(call, location, type, &device)) return r;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool = to_handle(device->current_pool);
  return CUDA_SUCCESS;
}

CUresult cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) {
  Call call(Sym::cuMemSetMemPool);
  Device* device = nullptr;
  if (CUresult r = device_location(call, location, type, &device)) return r;
  return set_current_pool(call, device, pool);
}
