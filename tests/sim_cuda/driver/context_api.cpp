// Exported entry points: initialisation, devices, contexts, streams.
// Every function keeps the exact name and signature of cuda.h (compiled with
// __CUDA_API_VERSION_INTERNAL, which also declares the old _v1 names).

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "driver_state.h"

using namespace memledger::simcuda;

namespace {

CUresult create_context(Call& call, CUcontext* pctx, unsigned int flags, CUdevice dev) {
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // A context holds device memory of its own (SIMCUDA_CONTEXT_MB), which no
  // allocation call shows.
  if (!device->hold(config().context_bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  auto* ctx = internal_new<Context>(Context{device, flags, false, true, call.st.next_context_id++});
  if (!push_context(ctx)) {
    device->unhold(config().context_bytes);
    internal_delete(ctx);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  call.st.contexts.insert(ctx);
  *pctx = to_handle(ctx);
  return CUDA_SUCCESS;
}

CUresult destroy_context(Call& call, CUcontext handle) {
  if (CUresult r = call.initialized()) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* ctx = reinterpret_cast<Context*>(handle);
  if (call.st.contexts.count(ctx) == 0 || ctx->primary || !ctx->alive) return CUDA_ERROR_INVALID_CONTEXT;
  tear_down(call.st, ctx);
  forget_context(ctx);
  return CUDA_SUCCESS;
}

CUresult release_primary(Call& call, CUdevice dev) {
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (device->primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  // The last release destroys the primary context and everything it owns,
  // without a cuMemFree for each allocation.
  if (--device->primary_refs == 0) tear_down(call.st, &device->primary);
  return CUDA_SUCCESS;
}

CUresult synchronize(Call& call, CUcontext handle) {
  Context* ctx = nullptr;
  if (CUresult r = call.context(handle, &ctx)) return r;
  trim_pools_after_sync(call.st, ctx->device);
  return CUDA_SUCCESS;
}

CUresult stream_destroy(Call& call, CUstream handle) {
  if (CUresult r = call.initialized()) return r;
  auto* stream = reinterpret_cast<Stream*>(handle);
  if (call.st.streams.erase(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
  end_capture(call.st, stream);
  internal_delete(stream);
  return CUDA_SUCCESS;
}

CUresult stream_synchronize(Call& call, CUstream handle) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(handle, &ctx)) return r;
  trim_pools_after_sync(call.st, ctx->device);
  return CUDA_SUCCESS;
}

// Answers for the attributes programs commonly ask; any other valid
// attribute reads 0. Shaped after a recent data-centre GPU.
int attribute_value(CUdevice_attribute attrib, const Device& device) {
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x10 + device.ordinal();
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      return 1;
    default:
      return 0;
  }
}

}  // namespace

CUresult cuInit(unsigned int Flags) {
  Call call(Sym::cuInit);
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& st = call.st;
  if (st.initialized) return CUDA_SUCCESS;
  if (st.forked_child) return CUDA_ERROR_NOT_INITIALIZED;
  const Config& c = config();
  if (c.device_count == 0) return CUDA_ERROR_NO_DEVICE;
  // First, while the low 4 GiB are still free (under valgrind everything
  // lands there).
  st.low32 = reserve_low32(256 * kMiB);
  for (int i = 0; i < c.device_count; ++i) {
    Device& device = st.devices[i];
    if (!device.init(i, c.memory_bytes)) return CUDA_ERROR_OPERATING_SYSTEM;
    device.primary = Context{&device, 0, true, false, st.next_context_id++};
    st.contexts.insert(&device.primary);
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = i;
    device.default_pool = internal_new<MemPool>(device, true, props);
    device.current_pool = device.default_pool;
    st.pools.insert(device.default_pool);
  }
  if (!st.host.init(kMaxDevices, c.memory_bytes)) return CUDA_ERROR_OPERATING_SYSTEM;
  st.device_count = c.device_count;
  st.vmm.init(st.devices, st.device_count);
  st.initialized = true;
  return CUDA_SUCCESS;
}

// Works before cuInit, like the real one.
CUresult cuDriverGetVersion(int* driverVersion) {
  SIMCUDA_COUNT(cuDriverGetVersion);
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = config().driver_version;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  Call call(Sym::cuDeviceGet);
  Device* d = nullptr;
  if (CUresult r = call.device(ordinal, &d)) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  Call call(Sym::cuDeviceGetCount);
  if (CUresult r = call.initialized()) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = call.st.device_count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  Call call(Sym::cuDeviceGetName);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "SimCUDA GPU %d", dev);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  Call call(Sym::cuDeviceTotalMem_v2);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = device->capacity();
  return CUDA_SUCCESS;
}

// CUDA 2.x ABI: 32-bit sizes, clamped.
CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  Call call(Sym::cuDeviceTotalMem);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = static_cast<unsigned int>(std::min<size_t>(device->capacity(), 0xffffffffu));
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  Call call(Sym::cuDeviceGetAttribute);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (pi == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  *pi = attribute_value(attrib, *device);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  Call call(Sym::cuDevicePrimaryCtxRetain);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device->primary_refs == 0) {
    if (!device->hold(config().context_bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    device->primary.alive = true;
  }
  ++device->primary_refs;
  // Not made current: that is the caller's job (cuCtxSetCurrent).
  *pctx = to_handle(&device->primary);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  Call call(Sym::cuDevicePrimaryCtxRelease_v2);
  return release_primary(call, dev);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  Call call(Sym::cuDevicePrimaryCtxRelease);
  return release_primary(call, dev);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  Call call(Sym::cuDevicePrimaryCtxGetState);
  Device* device = nullptr;
  if (CUresult r = call.device(dev, &device)) return r;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = device->primary.flags;
  *active = device->primary_refs > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  Call call(Sym::cuCtxCreate);
  return create_context(call, pctx, flags, dev);
}

CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  Call call(Sym::cuCtxCreate_v2);
  return create_context(call, pctx, flags, dev);
}

CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams, unsigned int flags,
                        CUdevice dev) {
  Call call(Sym::cuCtxCreate_v3);
  if (numParams < 0 || (numParams > 0 && paramsArray == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (numParams > 0) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;  // no SM partitioning here
  return create_context(call, pctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams, unsigned int flags, CUdevice dev) {
  Call call(Sym::cuCtxCreate_v4);
  if (ctxCreateParams != nullptr) {
    if (ctxCreateParams->execAffinityParams != nullptr && ctxCreateParams->numExecAffinityParams > 0) {
      return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
    }
    if (ctxCreateParams->cigParams != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  }
  return create_context(call, pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  Call call(Sym::cuCtxDestroy_v2);
  return destroy_context(call, ctx);
}

CUresult cuCtxDestroy(CUcontext ctx) {
  Call call(Sym::cuCtxDestroy);
  return destroy_context(call, ctx);
}

namespace {

CUresult push_current(Call& call, CUcontext handle) {
  if (CUresult r = call.initialized()) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Context* ctx = nullptr;
  if (CUresult r = call.context(handle, &ctx)) return r;
  return push_context(ctx) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult pop_current(Call& call, CUcontext* pctx) {
  if (CUresult r = call.initialized()) return r;
  if (current_context() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Context* ctx = pop_context();
  if (pctx != nullptr) *pctx = to_handle(ctx);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  Call call(Sym::cuCtxPushCurrent_v2);
  return push_current(call, ctx);
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  Call call(Sym::cuCtxPushCurrent);
  return push_current(call, ctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  Call call(Sym::cuCtxPopCurrent_v2);
  return pop_current(call, pctx);
}

CUresult cuCtxPopCurrent(CUcontext* pctx) {
  Call call(Sym::cuCtxPopCurrent);
  return pop_current(call, pctx);
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  Call call(Sym::cuCtxSetCurrent);
  if (CUresult r = call.initialized()) return r;
  if (ctx == nullptr) {
    set_current_context(nullptr);
    return CUDA_SUCCESS;
  }
  Context* context = nullptr;
  if (CUresult r = call.context(ctx, &context)) return r;
  set_current_context(context);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  Call call(Sym::cuCtxGetCurrent);
  if (CUresult r = call.initialized()) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = to_handle(current_context());
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  Call call(Sym::cuCtxGetDevice);
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device->ordinal();
  return CUDA_SUCCESS;
}

// CUDA 13: the context is an argument (NULL: the current one).
CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  Call call(Sym::cuCtxGetDevice_v2);
  Context* context = nullptr;
  if (CUresult r = call.context(ctx, &context)) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = context->device->ordinal();
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  Call call(Sym::cuCtxSynchronize);
  return synchronize(call, nullptr);
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  Call call(Sym::cuCtxSynchronize_v2);
  return synchronize(call, ctx);
}

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  Call call(Sym::cuStreamCreate);
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  if (phStream == nullptr || (Flags != CU_STREAM_DEFAULT && Flags != CU_STREAM_NON_BLOCKING)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* stream = internal_new<Stream>(Stream{ctx, Flags});
  call.st.streams.insert(stream);
  *phStream = to_handle(stream);
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
  Call call(Sym::cuStreamDestroy_v2);
  return stream_destroy(call, hStream);
}

CUresult cuStreamDestroy(CUstream hStream) {
  Call call(Sym::cuStreamDestroy);
  return stream_destroy(call, hStream);
}

CUresult cuStreamSynchronize(CUstream hStream) {
  Call call(Sym::cuStreamSynchronize);
  return stream_synchronize(call, hStream);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  Call call(Sym::cuStreamSynchronize_ptsz);
  return stream_synchronize(call, hStream);
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  Call call(Sym::cuStreamGetCtx);
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(hStream, &ctx)) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = to_handle(ctx);
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) {
  Call call(Sym::cuStreamGetCtx_ptsz);
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(hStream, &ctx)) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = to_handle(ctx);
  return CUDA_SUCCESS;
}

// The device of the stream's context, whatever context is current.
CUresult cuStreamGetDevice(CUstream hStream, CUdevice* device) {
  Call call(Sym::cuStreamGetDevice);
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(hStream, &ctx)) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device->ordinal();
  return CUDA_SUCCESS;
}

CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice* device) {
  Call call(Sym::cuStreamGetDevice_ptsz);
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(hStream, &ctx)) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device->ordinal();
  return CUDA_SUCCESS;
}

// The device's graph memory (graph.h): used is the bytes of its live graph
// allocations, reserved what they hold at the granularity (freed memory is
// given back at once, so reserved never exceeds what is live).
CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  Call call(Sym::cuDeviceGetGraphMemAttribute);
  Device* d = nullptr;
  if (CUresult r = call.device(device, &d)) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* out = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *out = d->graph_used; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *out = d->graph_used_high; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *out = d->graph_reserved; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *out = d->graph_reserved_high; return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
