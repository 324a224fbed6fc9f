// Tests of the simulated CUDA driver and runtime themselves (no memledger).
// meson runs this binary several times, each a fresh process with its own
// SIMCUDA_* environment: the default run (2 devices of 256 MiB) takes the
// untagged cases; hidden tags select the cases that need a process of their
// own: [uninit] (nothing initialised yet), [defaults] (no SIMCUDA_*),
// [old_driver] (SIMCUDA_DRIVER_VERSION=12080), [no_device] (SIMCUDA_DEVICES=0).
//
// The driver is linked directly; the runtime is the static archive, which
// reaches the driver only through cuGetProcAddress.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "simcuda.h"

// The per-thread default stream variants, declared by cuda_runtime_api.h
// only for programs built with CUDA_API_PER_THREAD_DEFAULT_STREAM.
extern "C" {
decltype(cudaMallocAsync) cudaMallocAsync_ptsz;
decltype(cudaFreeAsync) cudaFreeAsync_ptsz;
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr, unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* driverStatus);
}

namespace {

// The CUDA 2.x ABI, which cudaTypedefs.h declares only inside the toolkit.
using PFN_cuMemAlloc_v1 = CUresult (*)(unsigned int* dptr, unsigned int bytesize);
using PFN_cuMemFree_v1 = CUresult (*)(unsigned int dptr);

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGranule = 2 * kMiB;
constexpr size_t kCapacity = 256 * kMiB;  // SIMCUDA_MEMORY_MB of the default run

#define CU_OK(expr) REQUIRE((expr) == CUDA_SUCCESS)

CUcontext primary(int device) {
  static CUcontext contexts[2] = {};
  if (contexts[device] == nullptr) {
    CU_OK(cuInit(0));
    CU_OK(cuDevicePrimaryCtxRetain(&contexts[device], device));
  }
  return contexts[device];
}

// Makes a context current for a scope and restores the previous one.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx) {
    cuCtxGetCurrent(&previous_);
    cuCtxSetCurrent(ctx);
  }
  ~ScopedContext() { cuCtxSetCurrent(previous_); }

 private:
  CUcontext previous_ = nullptr;
};

size_t free_bytes() {
  size_t free = 0;
  size_t total = 0;
  REQUIRE(cuMemGetInfo(&free, &total) == CUDA_SUCCESS);
  return free;
}

cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute attr) {
  cuuint64_t value = 0;
  REQUIRE(cuMemPoolGetAttribute(pool, attr, &value) == CUDA_SUCCESS);
  return value;
}

struct Calls {
  unsigned long long direct = 0;
  unsigned long long via_proc = 0;
};
Calls calls(const char* symbol) {
  Calls c;
  REQUIRE(simcuda_symbol_calls(symbol, &c.direct, &c.via_proc) == 0);
  return c;
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  return prop;
}

void* lookup(const char* symbol, int version, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT,
             CUdriverProcAddressQueryResult* status = nullptr) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult local = CU_GET_PROC_ADDRESS_SUCCESS;
  REQUIRE(cuGetProcAddress(symbol, &fn, version, flags, status ? status : &local) == CUDA_SUCCESS);
  return fn;
}

}  // namespace

TEST_CASE("devices have the configured count, capacity and attributes") {
  CU_OK(cuInit(0));
  int count = 0;
  CU_OK(cuDeviceGetCount(&count));
  CHECK(count == 2);
  size_t total = 0;
  CU_OK(cuDeviceTotalMem(&total, 1));
  CHECK(total == kCapacity);
  CUdevice device = -1;
  CU_OK(cuDeviceGet(&device, 1));
  CHECK(device == 1);
  CHECK(cuDeviceGet(&device, 2) == CUDA_ERROR_INVALID_DEVICE);
  char name[64];
  CU_OK(cuDeviceGetName(name, sizeof name, 0));
  CHECK(std::string(name).find("SimCUDA") != std::string::npos);
  int value = 0;
  CU_OK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CHECK(value == 1);
  CU_OK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1));
  CHECK(value == 1);
  CHECK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAX, 0) == CUDA_ERROR_INVALID_VALUE);
  int version = 0;
  CU_OK(cuDriverGetVersion(&version));
  CHECK(version == 13000);
  CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("context-bound calls need a current context") {
  CU_OK(cuInit(0));
  // A fresh thread has no current context.
  CUresult alloc = CUDA_SUCCESS;
  CUresult info = CUDA_SUCCESS;
  CUresult stream = CUDA_SUCCESS;
  CUcontext current = reinterpret_cast<CUcontext>(1);
  std::thread([&] {
    CUdeviceptr p = 0;
    size_t free = 0;
    size_t total = 0;
    CUstream s = nullptr;
    alloc = cuMemAlloc(&p, kMiB);
    info = cuMemGetInfo(&free, &total);
    stream = cuMemAllocAsync(&p, kMiB, nullptr);
    cuCtxGetCurrent(&current);
    (void)s;
  }).join();
  CHECK(alloc == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(info == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(stream == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(current == nullptr);
}

TEST_CASE("cuMemAlloc holds its size rounded up to 2 MiB") {
  ScopedContext scope(primary(0));
  const size_t before = free_bytes();
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CU_OK(cuMemAlloc(&a, 1));
  CHECK(free_bytes() == before - kGranule);
  CU_OK(cuMemAlloc(&b, 3 * kMiB));
  CHECK(free_bytes() == before - 3 * kGranule);
  CHECK(simcuda_device_held(0) == static_cast<long long>(kCapacity - free_bytes()));

  CUdeviceptr base = 0;
  size_t size = 0;
  CU_OK(cuMemGetAddressRange(&base, &size, b + 12345));
  CHECK(base == b);
  CHECK(size == 3 * kMiB);
  CHECK(cuMemGetAddressRange(&base, &size, b + 3 * kMiB) == CUDA_ERROR_NOT_FOUND);

  // Host memory backs it: the program may write through the pointer.
  std::memset(reinterpret_cast<void*>(b), 1, 3 * kMiB);

  CU_OK(cuMemFree(a));
  CU_OK(cuMemFree(b));
  CHECK(free_bytes() == before);
  CHECK(cuMemFree(a) == CUDA_ERROR_INVALID_VALUE);  // double free
  CHECK(cuMemFree(0x1234) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("invalid arguments and out of memory") {
  ScopedContext scope(primary(0));
  const size_t before = free_bytes();
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(nullptr, kMiB) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemGetInfo(nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(&p, kCapacity + 1) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(cuMemAlloc(&p, SIZE_MAX) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(free_bytes() == before);

  // Exactly what is free fits; one more byte does not.
  CU_OK(cuMemAlloc(&p, before));
  CHECK(free_bytes() == 0);
  CUdeviceptr q = 0;
  CHECK(cuMemAlloc(&q, 1) == CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(cuMemFree(p));

  size_t pitch = 0;
  CHECK(cuMemAllocPitch(&p, &pitch, 100, 10, 3) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAllocManaged(&p, kMiB, 0) == CUDA_ERROR_INVALID_VALUE);
  void* host = nullptr;
  CHECK(cuMemHostAlloc(&host, kMiB, 0x100) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFreeHost(&pitch) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("pitched and managed memory count like cuMemAlloc; pinned host memory does not") {
  ScopedContext scope(primary(0));
  const size_t before = free_bytes();
  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  CU_OK(cuMemAllocPitch(&pitched, &pitch, 1000, 3000, 4));
  CHECK(pitch >= 1000);
  CHECK(pitch % 512 == 0);
  CHECK(free_bytes() == before - ((pitch * 3000 + kGranule - 1) / kGranule) * kGranule);
  CUdeviceptr managed = 0;
  CU_OK(cuMemAllocManaged(&managed, 100, CU_MEM_ATTACH_GLOBAL));
  std::memset(reinterpret_cast<void*>(managed), 7, 100);
  bool is_managed = false;
  CU_OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, managed));
  CHECK(is_managed);
  CU_OK(cuMemFree(managed));
  CU_OK(cuMemFree(pitched));
  CHECK(free_bytes() == before);

  void* pinned = nullptr;
  CU_OK(cuMemHostAlloc(&pinned, 3 * kMiB, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  void* staging = nullptr;
  CU_OK(cuMemAllocHost(&staging, 4096));
  std::memset(pinned, 1, 3 * kMiB);
  CHECK(free_bytes() == before);
  unsigned int type = 0;
  CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(pinned)));
  CHECK(type == CU_MEMORYTYPE_HOST);
  CU_OK(cuMemFreeHost(staging));
  CU_OK(cuMemFreeHost(pinned));
  CHECK(cuMemFreeHost(pinned) == CUDA_ERROR_INVALID_VALUE);

  std::vector<char> buffer(1 << 16);
  CU_OK(cuMemHostRegister(buffer.data(), buffer.size(), CU_MEMHOSTREGISTER_PORTABLE));
  CHECK(cuMemHostRegister(buffer.data() + 100, 10, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CU_OK(cuMemHostUnregister(buffer.data()));
  CHECK(cuMemHostUnregister(buffer.data()) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

TEST_CASE("two devices: separate capacity, contexts and address ranges") {
  CUdeviceptr on0 = 0;
  CUdeviceptr on1 = 0;
  size_t free0 = 0;
  {
    ScopedContext scope(primary(0));
    free0 = free_bytes();
    CU_OK(cuMemAlloc(&on0, 8 * kMiB));
    CUdevice device = -1;
    CU_OK(cuCtxGetDevice(&device));
    CHECK(device == 0);
  }
  {
    ScopedContext scope(primary(1));
    const size_t free1 = free_bytes();
    CU_OK(cuMemAlloc(&on1, 8 * kMiB));
    CHECK(free_bytes() == free1 - 8 * kMiB);
    CUdevice device = -1;
    CU_OK(cuCtxGetDevice(&device));
    CHECK(device == 1);
  }
  int ordinal = -1;
  CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on1));
  CHECK(ordinal == 1);
  // Unique across devices, and nowhere near the host heap.
  CHECK((on1 >= on0 + 8 * kMiB || on0 >= on1 + 8 * kMiB));
  void* heap = std::malloc(64);
  const auto h = reinterpret_cast<uintptr_t>(heap);
  CHECK((h < on0 || h >= on0 + 8 * kMiB));
  CHECK((h < on1 || h >= on1 + 8 * kMiB));
  std::free(heap);
  {
    ScopedContext scope(primary(0));
    CHECK(free_bytes() == free0 - 8 * kMiB);
    // Freeing needs a context, not the allocating one (unified addressing).
    CU_OK(cuMemFree(on1));
    CU_OK(cuMemFree(on0));
    CHECK(free_bytes() == free0);
  }
  CHECK(primary(0) != primary(1));
  CUcontext again = nullptr;
  CU_OK(cuDevicePrimaryCtxRetain(&again, 1));
  CHECK(again == primary(1));
  CU_OK(cuDevicePrimaryCtxRelease(1));
}

TEST_CASE("cuCtxCreate pushes a context; destroying it frees what it owns") {
  CU_OK(cuInit(0));
  ScopedContext none(nullptr);  // whatever an earlier case left current
  const long long held = simcuda_device_held(1);
  CUcontext ctx = nullptr;
  CU_OK(cuCtxCreate(&ctx, nullptr, 0, 1));  // cuCtxCreate_v4
  CUcontext current = nullptr;
  CU_OK(cuCtxGetCurrent(&current));
  CHECK(current == ctx);
  CUdevice device = -1;
  CU_OK(cuCtxGetDevice_v2(&device, ctx));
  CHECK(device == 1);
  CUdeviceptr p = 0;
  CU_OK(cuMemAlloc(&p, 5 * kMiB));
  void* pinned = nullptr;
  CU_OK(cuMemAllocHost(&pinned, 4096));
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK(simcuda_device_held(1) == held + 6 * static_cast<long long>(kMiB));

  // A stream belongs to its context, whatever context is current.
  CU_OK(cuCtxPushCurrent(primary(0)));
  CU_OK(cuStreamGetDevice(stream, &device));
  CHECK(device == 1);
  CUcontext owner = nullptr;
  CU_OK(cuStreamGetCtx(stream, &owner));
  CHECK(owner == ctx);
  CU_OK(cuStreamGetDevice(CU_STREAM_LEGACY, &device));
  CHECK(device == 0);
  CU_OK(cuCtxPopCurrent(&owner));

  CU_OK(cuCtxPushCurrent(primary(0)));
  CU_OK(cuCtxGetDevice(&device));
  CHECK(device == 0);
  CUcontext popped = nullptr;
  CU_OK(cuCtxPopCurrent(&popped));
  CHECK(popped == primary(0));

  // No cuMemFree: the context's allocations go with it.
  CU_OK(cuCtxDestroy(ctx));
  CHECK(simcuda_device_held(1) == held);
  CHECK(cuStreamSynchronize(stream) == CUDA_ERROR_INVALID_HANDLE);
  CU_OK(cuCtxGetCurrent(&current));
  CHECK(current == nullptr);
  CHECK(cuCtxSetCurrent(ctx) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK(cuCtxDestroy(primary(0)) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuCtxPopCurrent(&popped) == CUDA_ERROR_INVALID_CONTEXT);
}

TEST_CASE("memory pools reserve 32 MiB chunks and keep them until trimmed") {
  ScopedContext scope(primary(0));
  CUmemoryPool pool = nullptr;
  CU_OK(cuDeviceGetDefaultMemPool(&pool, 0));
  CUmemoryPool current = nullptr;
  CU_OK(cuDeviceGetMemPool(&current, 0));
  CHECK(current == pool);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0);
  cuuint64_t keep_all = UINT64_MAX;
  CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
  const size_t before = free_bytes();

  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_DEFAULT));
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CU_OK(cuMemAllocAsync(&a, kMiB, stream));
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 32 * kMiB);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == kMiB);
  CHECK(free_bytes() == before - 32 * kMiB);  // reserved counts against the device
  CU_OK(cuMemAllocAsync(&b, 40 * kMiB, stream));  // larger than a chunk: a chunk of its own
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 72 * kMiB);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 41 * kMiB);
  CUmemoryPool owner = nullptr;
  CU_OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, b));
  CHECK(owner == pool);

  CU_OK(cuMemFreeAsync(b, stream));
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == kMiB);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 41 * kMiB);
  CU_OK(cuStreamSynchronize(stream));  // threshold UINT64_MAX: nothing released
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 72 * kMiB);
  CU_OK(cuMemPoolTrimTo(pool, 40 * kMiB));  // keeps at least 40 MiB: the 40 MiB chunk must stay
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 72 * kMiB);
  CU_OK(cuMemPoolTrimTo(pool, 0));  // the chunk holding `a` stays
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 32 * kMiB);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 72 * kMiB);
  cuuint64_t zero = 0;
  CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 32 * kMiB);
  CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero) == CUDA_ERROR_INVALID_VALUE);

  // cuMemFree accepts pool blocks too; threshold 0 releases at synchronize.
  CU_OK(cuMemFree(a));
  CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 32 * kMiB);
  CU_OK(cuCtxSynchronize());
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
  CHECK(free_bytes() == before);
  CHECK(cuMemFreeAsync(a, stream) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAllocAsync(&a, 0, stream) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemPoolDestroy(pool) == CUDA_ERROR_INVALID_VALUE);  // a default pool
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("explicit pools: other devices, current pool, destroy with live blocks, out of memory") {
  ScopedContext scope(primary(0));
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  CUmemoryPool pool = nullptr;
  CU_OK(cuMemPoolCreate(&pool, &props));
  const long long held1 = simcuda_device_held(1);
  const size_t free0 = free_bytes();

  // A device-1 pool serves a stream of device 0 and counts on device 1.
  CUdeviceptr p = 0;
  CU_OK(cuMemAllocFromPoolAsync(&p, 3 * kMiB, pool, nullptr));
  CHECK(simcuda_device_held(1) == held1 + 32 * static_cast<long long>(kMiB));
  CHECK(free_bytes() == free0);

  // The device's current pool is what cuMemAllocAsync uses.
  CHECK(cuDeviceSetMemPool(0, pool) == CUDA_ERROR_INVALID_VALUE);  // wrong device
  CU_OK(cuDeviceSetMemPool(1, pool));
  CUmemLocation location{CU_MEM_LOCATION_TYPE_DEVICE, 1};
  CUmemoryPool current = nullptr;
  CU_OK(cuMemGetMemPool(&current, &location, CU_MEM_ALLOCATION_TYPE_PINNED));
  CHECK(current == pool);
  {
    ScopedContext on1(primary(1));
    CUdeviceptr q = 0;
    CU_OK(cuMemAllocAsync(&q, kMiB, CU_STREAM_PER_THREAD));
    CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 4 * kMiB);
    CU_OK(cuMemFreeAsync(q, CU_STREAM_PER_THREAD));
  }

  // Destroyed with a block outstanding: the call succeeds, the device's
  // current pool falls back to the default, and the pool's memory goes
  // with its last block.
  CU_OK(cuMemPoolDestroy(pool));
  CU_OK(cuMemGetMemPool(&current, &location, CU_MEM_ALLOCATION_TYPE_PINNED));
  CUmemoryPool default1 = nullptr;
  CU_OK(cuMemGetDefaultMemPool(&default1, &location, CU_MEM_ALLOCATION_TYPE_PINNED));
  CHECK(current == default1);
  CHECK(simcuda_device_held(1) == held1 + 32 * static_cast<long long>(kMiB));
  CU_OK(cuMemFreeAsync(p, nullptr));
  CHECK(simcuda_device_held(1) == held1);
  cuuint64_t value = 0;
  CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &value) == CUDA_ERROR_INVALID_VALUE);

  // A pool that cannot grow reports OUT_OF_MEMORY.
  props.location.id = 0;
  props.maxSize = 32 * kMiB;
  CU_OK(cuMemPoolCreate(&pool, &props));
  CHECK(cuMemAllocFromPoolAsync(&p, 33 * kMiB, pool, nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(cuMemAllocFromPoolAsync(&p, kCapacity, pool, nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(cuMemPoolDestroy(pool));
  CHECK(free_bytes() == free0);

  // CUDA 13's host and managed pools hold memory of no device.
  const long long held0 = simcuda_device_held(0);
  props.maxSize = 0;
  props.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CU_OK(cuMemPoolCreate(&pool, &props));
  CU_OK(cuMemAllocFromPoolAsync(&p, 3 * kMiB, pool, nullptr));
  std::memset(reinterpret_cast<void*>(p), 1, 3 * kMiB);
  CHECK(simcuda_device_held(0) == held0);
  CU_OK(cuMemFreeAsync(p, nullptr));
  CU_OK(cuMemPoolDestroy(pool));
  props.location.type = CU_MEM_LOCATION_TYPE_NONE;
  CHECK(cuMemPoolCreate(&pool, &props) == CUDA_ERROR_INVALID_VALUE);  // pinned memory needs a location
  props.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
  CU_OK(cuMemPoolCreate(&pool, &props));
  CU_OK(cuMemPoolDestroy(pool));
  CUmemLocation host{CU_MEM_LOCATION_TYPE_HOST, 0};
  CUmemoryPool host_default = nullptr, again = nullptr;
  CU_OK(cuMemGetDefaultMemPool(&host_default, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
  CU_OK(cuMemGetMemPool(&again, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
  CHECK(host_default == again);
  CHECK(cuMemPoolDestroy(host_default) == CUDA_ERROR_INVALID_VALUE);  // a default pool
  CHECK(cuMemSetMemPool(&host, CU_MEM_ALLOCATION_TYPE_PINNED, host_default) == CUDA_ERROR_NOT_SUPPORTED);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 7};
  CHECK(cuMemPoolCreate(&pool, &props) == CUDA_ERROR_INVALID_DEVICE);
}

TEST_CASE("graph memory nodes: captured at a fixed address, allocated at launch, freed by the graph or later") {
  CU_OK(cuInit(0));
  ScopedContext scope(primary(1));
  const long long held = simcuda_device_held(1);
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));  // cuStreamBeginCapture_v2
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CU_OK(cuStreamIsCapturing(stream, &status));
  CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUdeviceptr scratch = 0, kept = 0;
  CU_OK(cuMemAllocAsync(&scratch, 3 * kMiB, stream));
  CU_OK(cuMemAllocAsync(&kept, 1 * kMiB, stream));
  CU_OK(cuMemFreeAsync(scratch, stream));
  CHECK(cuMemFreeAsync(scratch, stream) == CUDA_ERROR_INVALID_VALUE);  // freed twice in the graph
  CUgraph graph = nullptr, info_graph = nullptr;
  cuuint64_t id = 0;
  CU_OK(cuStreamGetCaptureInfo(stream, &status, &id, &info_graph, nullptr, nullptr, nullptr));  // _v3
  CU_OK(cuStreamEndCapture(stream, &graph));
  CHECK(graph == info_graph);
  CHECK(cuStreamEndCapture(stream, &graph) == CUDA_ERROR_ILLEGAL_STATE);
  // Nothing is allocated by capture.
  CHECK(simcuda_device_held(1) == held);
  cuuint64_t used = 1;
  CU_OK(cuDeviceGetGraphMemAttribute(1, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used));
  CHECK(used == 0);

  CUgraphExec exec = nullptr, second = nullptr;
  CU_OK(cuGraphInstantiate(&exec, graph, 0));  // cuGraphInstantiateWithFlags
  CHECK(cuGraphInstantiate(&second, graph, 0) == CUDA_ERROR_INVALID_VALUE);  // one executable at a time
  CU_OK(cuGraphLaunch(exec, stream));
  CHECK(simcuda_device_held(1) == held + 2 * static_cast<long long>(kMiB));  // the kept MiB, granular
  CU_OK(cuDeviceGetGraphMemAttribute(1, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used));
  CHECK(used == 1 * kMiB);
  static_cast<char*>(reinterpret_cast<void*>(kept))[0] = 1;  // accessible after the launch
  // Its allocation is still live: no relaunch.
  CHECK(cuGraphLaunch(exec, stream) == CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuMemFreeAsync(kept, stream));
  CHECK(simcuda_device_held(1) == held);
  CU_OK(cuGraphLaunch(exec, stream));
  CU_OK(cuGraphExecDestroy(exec));
  // Auto-free on launch frees the previous launch's allocation first.
  CU_OK(cuGraphInstantiate(&exec, graph, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
  CU_OK(cuGraphLaunch(exec, stream));
  CU_OK(cuGraphLaunch(exec, stream));
  CHECK(simcuda_device_held(1) == held + 2 * static_cast<long long>(kMiB));
  // Destroying the graph and its executable frees no live allocation.
  CU_OK(cuGraphExecDestroy(exec));
  CU_OK(cuGraphDestroy(graph));
  CHECK(cuGraphDestroy(graph) == CUDA_ERROR_INVALID_VALUE);
  CHECK(simcuda_device_held(1) == held + 2 * static_cast<long long>(kMiB));
  CU_OK(cuMemFree(kept));
  CHECK(simcuda_device_held(1) == held);
  // Within a launch both were live before the scratch's free node.
  CU_OK(cuDeviceGetGraphMemAttribute(1, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &used));
  CHECK(used == 4 * kMiB);
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("stream capture: into an existing graph, and ended only by the thread that began it") {
  CU_OK(cuInit(0));
  ScopedContext scope(primary(0));
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUgraph into = nullptr, graph = nullptr;
  CHECK(cuGraphCreate(&into, 1) == CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuGraphCreate(&into, 0));
  CU_OK(cuStreamBeginCaptureToGraph(stream, into, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr p = 0;
  CU_OK(cuMemAllocAsync(&p, 1 * kMiB, stream));
  CUresult other = CUDA_SUCCESS;
  std::thread([&] { other = cuStreamEndCapture(stream, &graph); }).join();
  CHECK(other == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CU_OK(cuStreamIsCapturing(stream, &status));
  CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(cuStreamEndCapture(stream, &graph));
  CHECK(graph == into);
  // Relaxed mode: any thread ends it.
  CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  std::thread([&] { other = cuStreamEndCapture(stream, &graph); }).join();
  CHECK(other == CUDA_SUCCESS);
  CU_OK(cuGraphDestroy(graph));
  CU_OK(cuGraphDestroy(into));  // its node was never launched: nothing to free
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("VMM: reservations count nothing, physical memory is counted at cuMemCreate") {
  CU_OK(cuInit(0));
  const CUmemAllocationProp prop = device_prop(0);
  size_t granularity = 0;
  CU_OK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK(granularity == kGranule);
  const long long held = simcuda_device_held(0);

  CUdeviceptr base = 0;
  CU_OK(cuMemAddressReserve(&base, 1ull << 30, 0, 0, 0));  // more than the device has
  CHECK(simcuda_device_held(0) == held);
  CUmemGenericAllocationHandle handle = 0;
  CHECK(cuMemCreate(&handle, 3 * kMiB, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemCreate(&handle, kCapacity + kGranule, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(cuMemCreate(&handle, 2 * kGranule, &prop, 0));
  CHECK(simcuda_device_held(0) == held + 4 * static_cast<long long>(kMiB));

  CHECK(cuMemMap(base + kMiB, 2 * kGranule, 0, handle, 0) == CUDA_ERROR_INVALID_VALUE);  // unaligned
  CHECK(cuMemMap(base, 2 * kGranule, kGranule, handle, 0) == CUDA_ERROR_INVALID_VALUE);  // offset must be 0
  CU_OK(cuMemMap(base, 2 * kGranule, 0, handle, 0));
  CHECK(cuMemMap(base + kGranule, kGranule, 0, handle, 0) == CUDA_ERROR_INVALID_VALUE);  // already mapped
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_OK(cuMemSetAccess(base, 2 * kGranule, &access, 1));
  std::memset(reinterpret_cast<void*>(base), 3, 2 * kGranule);

  // The handle's memory is shared by every mapping of it.
  CU_OK(cuMemMap(base + 8 * kGranule, kGranule, 0, handle, 0));
  CU_OK(cuMemSetAccess(base + 8 * kGranule, kGranule, &access, 1));
  CHECK(*reinterpret_cast<unsigned char*>(base + 8 * kGranule + 100) == 3);

  CUmemAllocationProp got{};
  CU_OK(cuMemGetAllocationPropertiesFromHandle(&got, handle));
  CHECK(got.location.id == 0);
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  {
    ScopedContext scope(primary(0));
    CU_OK(cuMemGetAddressRange(&range_base, &range_size, base + kGranule + 5));
  }
  CHECK(range_base == base);
  CHECK(range_size == 2 * kGranule);

  // Released while mapped: the memory stays until the last unmap.
  CU_OK(cuMemRelease(handle));
  CHECK(cuMemRelease(handle) == CUDA_ERROR_INVALID_VALUE);
  CHECK(simcuda_device_held(0) == held + 4 * static_cast<long long>(kMiB));
  CUmemGenericAllocationHandle retained = 0;
  CU_OK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(base + 12345)));
  CHECK(retained == handle);
  CHECK(cuMemUnmap(base, kGranule) == CUDA_ERROR_INVALID_VALUE);  // part of a mapping
  CHECK(cuMemAddressFree(base, 1ull << 30) == CUDA_ERROR_INVALID_VALUE);  // still mapped
  CU_OK(cuMemUnmap(base, 2 * kGranule));
  CU_OK(cuMemUnmap(base + 8 * kGranule, kGranule));
  CHECK(simcuda_device_held(0) == held + 4 * static_cast<long long>(kMiB));  // the retained reference
  CU_OK(cuMemRelease(retained));
  CHECK(simcuda_device_held(0) == held);
  CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(base)) == CUDA_ERROR_INVALID_VALUE);

  // Host-located physical memory counts against no device.
  CUmemAllocationProp host{};
  host.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CU_OK(cuMemCreate(&handle, kGranule, &host, 0));
  CU_OK(cuMemMap(base, kGranule, 0, handle, 0));
  int ordinal = 0;
  CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, base));
  CHECK(ordinal == CU_DEVICE_CPU);
  CHECK(simcuda_device_held(0) == held);
  CU_OK(cuMemUnmap(base, kGranule));
  CU_OK(cuMemRelease(handle));

  // An exported handle imported again is one more reference to it.
  CUmemAllocationProp shareable = device_prop(0);
  int fd = -1;
  CU_OK(cuMemCreate(&handle, kGranule, &shareable, 0));
  CHECK(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
        CUDA_ERROR_INVALID_VALUE);  // not requested at creation
  CU_OK(cuMemRelease(handle));
  shareable.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CU_OK(cuMemCreate(&handle, kGranule, &shareable, 0));
  CU_OK(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle imported = 0;
  CU_OK(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CU_OK(cuMemRelease(handle));
  CHECK(simcuda_device_held(0) == held + 2 * static_cast<long long>(kMiB));
  CU_OK(cuMemRelease(imported));
  CHECK(simcuda_device_held(0) == held);
  close(fd);

  // A multicast object holds no memory.
  CUmulticastObjectProp mc{};
  mc.numDevices = 1;
  mc.size = kGranule;
  CU_OK(cuMulticastCreate(&handle, &mc));
  CHECK(simcuda_device_held(0) == held);
  CU_OK(cuMemRelease(handle));
  CHECK(cuMemRelease(handle) == CUDA_ERROR_INVALID_VALUE);

  CHECK(cuMemAddressFree(base, 1ull << 29) == CUDA_ERROR_INVALID_VALUE);  // wrong size
  CU_OK(cuMemAddressFree(base, 1ull << 30));
}

TEST_CASE("cuGetProcAddress picks the ABI by version and stream flag") {
  CU_OK(cuInit(0));
  ScopedContext scope(primary(0));
  CUdriverProcAddressQueryResult status{};

  // cuMemAlloc at 3.2+ is the size_t ABI (cuMemAlloc_v2) ...
  auto alloc_v2 = reinterpret_cast<PFN_cuMemAlloc_v3020>(lookup("cuMemAlloc", 13000, 0, &status));
  REQUIRE(alloc_v2 != nullptr);
  CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK(reinterpret_cast<void*>(alloc_v2) != dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));  // internal, like the real one
  const Calls before_v2 = calls("cuMemAlloc_v2");
  CUdeviceptr p = 0;
  CU_OK(alloc_v2(&p, kMiB));
  CHECK(calls("cuMemAlloc_v2").via_proc == before_v2.via_proc + 1);
  CHECK(calls("cuMemAlloc_v2").direct == before_v2.direct);
  CU_OK(cuMemFree(p));

  // ... and before it the CUDA 2.x one, with 32-bit device pointers.
  auto alloc_v1 = reinterpret_cast<PFN_cuMemAlloc_v1>(lookup("cuMemAlloc", 3010));
  REQUIRE(alloc_v1 != nullptr);
  auto free_v1 = reinterpret_cast<PFN_cuMemFree_v1>(lookup("cuMemFree", 2000));
  unsigned int small = 0;
  CU_OK(alloc_v1(&small, 4096));
  CHECK(small != 0);
  CHECK(calls("cuMemAlloc").via_proc == 1);
  CU_OK(free_v1(small));

  // Newer ABIs of CUDA 13: cuCtxGetDevice takes the context.
  auto get_device = reinterpret_cast<PFN_cuCtxGetDevice_v13000>(lookup("cuCtxGetDevice", 13000));
  CUdevice device = -1;
  CU_OK(get_device(&device, primary(1)));
  CHECK(device == 1);
  auto get_device_old = reinterpret_cast<PFN_cuCtxGetDevice_v2000>(lookup("cuCtxGetDevice", 12080));
  CU_OK(get_device_old(&device));
  CHECK(device == 0);

  // The per-thread default stream flag picks _ptsz where there is one.
  const Calls ptsz_before = calls("cuMemAllocAsync_ptsz");
  auto alloc_async = reinterpret_cast<PFN_cuMemAllocAsync_v11020_ptsz>(
      lookup("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
  CU_OK(alloc_async(&p, kMiB, nullptr));
  CHECK(calls("cuMemAllocAsync_ptsz").via_proc == ptsz_before.via_proc + 1);
  auto free_async = reinterpret_cast<PFN_cuMemFreeAsync_v11020>(lookup("cuMemFreeAsync", 13000));
  const Calls legacy_before = calls("cuMemFreeAsync");
  CU_OK(free_async(p, nullptr));
  CHECK(calls("cuMemFreeAsync").via_proc == legacy_before.via_proc + 1);
  CHECK(lookup("cuStreamSynchronize", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) !=
        lookup("cuStreamSynchronize", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM));
  // No per-thread variant: the legacy function, and before 7.0 no _ptsz at all.
  CHECK(lookup("cuMemAlloc", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) == lookup("cuMemAlloc", 13000));
  CHECK(lookup("cuStreamSynchronize", 6050, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ==
        lookup("cuStreamSynchronize", 6050));

  // Unknown names and too-old versions: success with NULL.
  CHECK(lookup("cuNoSuchFunction", 13000, 0, &status) == nullptr);
  CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK(lookup("cuMemAllocAsync", 11010, 0, &status) == nullptr);
  CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK(lookup("cuMemAlloc_v2", 13000, 0, &status) == nullptr);  // base names only
  CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

  // Errors: no symbol or out-pointer, unknown flags, a version past the driver.
  void* fn = nullptr;
  CHECK(cuGetProcAddress(nullptr, &fn, 13000, 0, &status) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGetProcAddress("cuInit", nullptr, 13000, 0, &status) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGetProcAddress("cuInit", &fn, 13000, 0x10, &status) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGetProcAddress("cuInit", &fn, 13010, 0, &status) == CUDA_ERROR_INVALID_VALUE);

  // Asked for itself it answers itself; the CUDA 11.x ABI has no status.
  CHECK(lookup("cuGetProcAddress", 13000) == reinterpret_cast<void*>(&cuGetProcAddress));
  void* old_self = lookup("cuGetProcAddress", 11080);
  CHECK(old_self == dlsym(RTLD_DEFAULT, "cuGetProcAddress"));
  auto get_v1 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(old_self);
  CU_OK(get_v1("cuInit", &fn, 11080, 0));
  CHECK(fn != nullptr);
}

TEST_CASE("every listed symbol is exported and answered by cuGetProcAddress") {
  const int count = simcuda_symbols(nullptr, 0);
  std::vector<simcuda_symbol_t> symbols(static_cast<size_t>(count));
  REQUIRE(simcuda_symbols(symbols.data(), count) == count);
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(driver != nullptr);
  for (const simcuda_symbol_t& s : symbols) {
    INFO(s.symbol);
    CHECK(dlsym(driver, s.symbol) != nullptr);
    CUdriverProcAddressQueryResult status{};
    const cuuint64_t flags = s.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    CHECK(lookup(s.base, s.version, flags, &status) != nullptr);
    CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
  }
  dlclose(driver);
  const char* name = nullptr;
  CU_OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name));
  CHECK(std::string(name) == "CUDA_ERROR_OUT_OF_MEMORY");
  CU_OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &name));
  CHECK(std::string(name) == "out of memory");
  CHECK(cuGetErrorName(static_cast<CUresult>(12345), &name) == CUDA_ERROR_INVALID_VALUE);
  CHECK(name == nullptr);
  const void* table = reinterpret_cast<const void*>(1);
  const CUuuid id{};
  CHECK(cuGetExportTable(&table, &id) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(table == nullptr);
}

TEST_CASE("the static runtime reaches the driver only through cuGetProcAddress") {
  const Calls alloc_before = calls("cuMemAlloc_v2");
  const Calls free_before = calls("cuMemFree_v2");
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 3 * kMiB) == cudaSuccess);
  REQUIRE(cudaFree(p) == cudaSuccess);
  // One driver allocation per runtime allocation, through a pointer from
  // cuGetProcAddress, none through the exported symbols.
  CHECK(calls("cuMemAlloc_v2").via_proc == alloc_before.via_proc + 1);
  CHECK(calls("cuMemAlloc_v2").direct == alloc_before.direct);
  CHECK(calls("cuMemFree_v2").via_proc == free_before.via_proc + 1);
  CHECK(simcuda_stats().proc_address_lookups > 30);

  struct Case {
    const char* symbol;
    cudaError_t (*run)();
  };
  const Case cases[] = {
      {"cuMemAllocAsync",
       [] {
         void* q = nullptr;
         cudaError_t e = cudaMallocAsync(&q, kMiB, nullptr);
         return e ? e : cudaFreeAsync(q, nullptr);
       }},
      {"cuMemAllocAsync_ptsz",
       [] {
         void* q = nullptr;
         cudaError_t e = cudaMallocAsync_ptsz(&q, kMiB, nullptr);
         return e ? e : cudaFreeAsync_ptsz(q, nullptr);
       }},
      {"cuMemAllocManaged",
       [] {
         void* q = nullptr;
         cudaError_t e = cudaMallocManaged(&q, kMiB, cudaMemAttachGlobal);
         return e ? e : cudaFree(q);
       }},
      {"cuMemHostAlloc",
       [] {
         void* q = nullptr;
         cudaError_t e = cudaMallocHost(&q, kMiB);
         return e ? e : cudaFreeHost(q);
       }},
      {"cuMemAllocPitch_v2",
       [] {
         void* q = nullptr;
         size_t pitch = 0;
         cudaError_t e = cudaMallocPitch(&q, &pitch, 1000, 10);
         return e ? e : cudaFree(q);
       }},
      {"cuMemAllocPitch_v2",
       [] {
         cudaPitchedPtr q{};
         cudaError_t e = cudaMalloc3D(&q, cudaExtent{100, 10, 10});
         return e ? e : cudaFree(q.ptr);
       }},
      {"cuMemAllocFromPoolAsync",
       [] {
         cudaMemPool_t pool = nullptr;
         cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, 0);
         void* q = nullptr;
         e = e ? e : cudaMallocFromPoolAsync(&q, kMiB, pool, nullptr);
         return e ? e : cudaFreeAsync(q, nullptr);
       }},
  };
  for (const Case& c : cases) {
    INFO(c.symbol);
    const Calls before = calls(c.symbol);
    CHECK(c.run() == cudaSuccess);
    CHECK(calls(c.symbol).via_proc == before.via_proc + 1);
    CHECK(calls(c.symbol).direct == before.direct);
  }
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("runtime: devices, errors, pools and driver entry points") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 2);
  int version = 0;
  CHECK(cudaRuntimeGetVersion(&version) == cudaSuccess);
  CHECK(version == 13000);
  CHECK(cudaDriverGetVersion(&version) == cudaSuccess);
  CHECK(version == 13000);

  // The primary context of the device chosen, per thread.
  std::thread([] {
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    int device = -1;
    CHECK(cudaGetDevice(&device) == cudaSuccess);
    CHECK(device == 1);
    const long long held = simcuda_device_held(1);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, kMiB) == cudaSuccess);
    CHECK(simcuda_device_held(1) == held + static_cast<long long>(kGranule));
    size_t free = 0;
    size_t total = 0;
    CHECK(cudaMemGetInfo(&free, &total) == cudaSuccess);
    CHECK(free == kCapacity - static_cast<size_t>(simcuda_device_held(1)));
    CHECK(cudaFree(p) == cudaSuccess);
    CUcontext current = nullptr;
    CHECK(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
    CHECK(current == primary(1));
  }).join();

  // Errors are the runtime's codes and become the thread's last error.
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kCapacity + 1) == cudaErrorMemoryAllocation);
  CHECK(cudaPeekAtLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(std::string(cudaGetErrorName(cudaErrorMemoryAllocation)) == "cudaErrorMemoryAllocation");
  CHECK(std::string(cudaGetErrorString(cudaErrorMemoryAllocation)) == "memory allocation");
  CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice);
  CHECK(cudaFree(reinterpret_cast<void*>(0x1000)) == cudaErrorInvalidValue);
  CHECK(cudaMalloc(&p, 0) == cudaSuccess);
  CHECK(p == nullptr);
  CHECK(cudaMallocManaged(&p, 0, cudaMemAttachGlobal) == cudaErrorInvalidValue);
  static char page[4096];
  CHECK(cudaHostRegister(page, sizeof page, cudaHostRegisterDefault) == cudaSuccess);
  CHECK(cudaHostRegister(page, sizeof page, cudaHostRegisterDefault) == cudaErrorHostMemoryAlreadyRegistered);
  CHECK(cudaHostUnregister(page) == cudaSuccess);
  CHECK(cudaHostUnregister(page) == cudaErrorHostMemoryNotRegistered);
  cudaGetLastError();

  // Pools through the runtime.
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = nullptr;
  REQUIRE(cudaMemPoolCreate(&pool, &props) == cudaSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  CHECK(cudaMallocFromPoolAsync(&p, 5 * kMiB, pool, stream) == cudaSuccess);
  cuuint64_t used = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess);
  CHECK(used == 5 * kMiB);
  CHECK(cudaFreeAsync(p, stream) == cudaSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);  // threshold 0: released
  cuuint64_t reserved = 1;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess);
  CHECK(reserved == 0);
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess);
  CHECK(cudaMemPoolDestroy(pool) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);

  // Driver entry points, by the runtime's version or a chosen one (the
  // versionless cudaGetDriverEntryPoint is deprecated, and still used).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  CHECK(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &status) == cudaSuccess);
  CHECK(status == cudaDriverEntryPointSuccess);
  CHECK(fn == lookup("cuMemAlloc", 13000));
  CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 2000, cudaEnableDefault, &status) == cudaSuccess);
  CHECK(fn == lookup("cuMemAlloc", 2000));
  CHECK(cudaGetDriverEntryPoint_ptsz("cuMemAllocAsync", &fn, cudaEnableDefault, &status) == cudaSuccess);
  CHECK(fn == lookup("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
  CHECK(cudaGetDriverEntryPoint("cuNoSuchFunction", &fn, cudaEnableDefault, &status) == cudaSuccess);
  CHECK(fn == nullptr);
  CHECK(status == cudaDriverEntryPointSymbolNotFound);
#pragma GCC diagnostic pop
}

TEST_CASE("a forked child cannot use the driver its parent initialised") {
  ScopedContext scope(primary(0));
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    size_t free = 0;
    size_t total = 0;
    CUdeviceptr p = 0;
    void* q = nullptr;
    const bool refused = cuMemGetInfo(&free, &total) == CUDA_ERROR_NOT_INITIALIZED &&
                         cuMemAlloc(&p, kMiB) == CUDA_ERROR_NOT_INITIALIZED &&
                         cuInit(0) == CUDA_ERROR_NOT_INITIALIZED &&
                         cudaMalloc(&q, kMiB) == cudaErrorInitializationError;
    _exit(refused ? 0 : 1);
  }
  int status = -1;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  free_bytes();  // the parent goes on
}

TEST_CASE("before cuInit", "[.uninit]") {
  CUdeviceptr p = 0;
  int count = 0;
  CHECK(cuMemAlloc(&p, kMiB) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(cuCtxGetCurrent(nullptr) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(simcuda_device_held(0) == -1);
  // What works before cuInit: the version and the entry points.
  int version = 0;
  CU_OK(cuDriverGetVersion(&version));
  CHECK(lookup("cuInit", 13000) != nullptr);
  CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuInit(0));

  // The last release of a primary context frees what it owns.
  CUcontext ctx = nullptr;
  CU_OK(cuDevicePrimaryCtxRetain(&ctx, 1));
  CU_OK(cuCtxSetCurrent(ctx));
  CU_OK(cuMemAlloc(&p, kMiB));
  unsigned int flags = 0;
  int active = 0;
  CU_OK(cuDevicePrimaryCtxGetState(1, &flags, &active));
  CHECK(active == 1);
  CHECK(simcuda_device_held(1) == static_cast<long long>(kGranule));
  CU_OK(cuDevicePrimaryCtxRelease(1));
  CHECK(simcuda_device_held(1) == 0);
  CU_OK(cuDevicePrimaryCtxGetState(1, &flags, &active));
  CHECK(active == 0);
  CHECK(cuMemAlloc(&p, kMiB) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK(cuDevicePrimaryCtxRelease(1) == CUDA_ERROR_INVALID_CONTEXT);
}

TEST_CASE("defaults without SIMCUDA_*", "[.defaults]") {
  CU_OK(cuInit(0));
  int count = 0;
  CU_OK(cuDeviceGetCount(&count));
  CHECK(count == 2);
  size_t total = 0;
  CU_OK(cuDeviceTotalMem(&total, 0));
  CHECK(total == 1024 * kMiB);
  int version = 0;
  CU_OK(cuDriverGetVersion(&version));
  CHECK(version == 13000);
}

TEST_CASE("a driver older than the runtime", "[.old_driver]") {
  int version = 0;
  CU_OK(cuDriverGetVersion(&version));
  CHECK(version == 12080);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  CHECK(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0, &status) == CUDA_ERROR_INVALID_VALUE);
  CHECK(lookup("cuMemAlloc", 12080) != nullptr);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kMiB) == cudaErrorInsufficientDriver);
  CHECK(cudaDriverGetVersion(&version) == cudaSuccess);
  CHECK(version == 12080);
}

TEST_CASE("no device", "[.no_device]") {
  CHECK(cuInit(0) == CUDA_ERROR_NO_DEVICE);
  int count = -1;
  CHECK(cudaGetDeviceCount(&count) == cudaErrorNoDevice);
  CHECK(count == 0);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kMiB) == cudaErrorNoDevice);
}
