// The simulated CUDA runtime: the allocation-related part of
// cuda_runtime_api.h, each function with its real name and prototype
// (compiled with __CUDA_API_VERSION_INTERNAL, which also declares the _ptsz
// variants). Every runtime allocation is exactly one driver allocation call,
// made in the current device's primary context.

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cuda_error_names.h"
#include "driver_api.h"

#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

namespace memledger::simcuda::runtime {
namespace {

constexpr int kMaxDevices = 64;

DriverApi g_driver;
cudaError_t g_load_status = cudaSuccess;
cudaError_t g_init_status = cudaSuccess;
std::once_flag g_load_once;
std::once_flag g_init_once;
std::mutex g_primary_mutex;
CUcontext g_primary[kMaxDevices] = {};

thread_local int t_device = -1;  // -1: none chosen, device 0 is used
thread_local cudaError_t t_last_error = cudaSuccess;

#define SIMCUDART_RESULT_MAP(X)                                                \
  X(CUDA_SUCCESS, cudaSuccess)                                                 \
  X(CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue)                           \
  X(CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation)                       \
  X(CUDA_ERROR_NOT_INITIALIZED, cudaErrorInitializationError)                  \
  X(CUDA_ERROR_DEINITIALIZED, cudaErrorCudartUnloading)                        \
  X(CUDA_ERROR_STUB_LIBRARY, cudaErrorStubLibrary)                             \
  X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, cudaErrorCallRequiresNewerDriver)   \
  X(CUDA_ERROR_NO_DEVICE, cudaErrorNoDevice)                                   \
  X(CUDA_ERROR_INVALID_DEVICE, cudaErrorInvalidDevice)                         \
  X(CUDA_ERROR_INVALID_CONTEXT, cudaErrorDeviceUninitialized)                  \
  X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, cudaErrorUnsupportedExecAffinity)    \
  X(CUDA_ERROR_OPERATING_SYSTEM, cudaErrorOperatingSystem)                     \
  X(CUDA_ERROR_INVALID_HANDLE, cudaErrorInvalidResourceHandle)                 \
  X(CUDA_ERROR_NOT_FOUND, cudaErrorSymbolNotFound)                             \
  X(CUDA_ERROR_CONTEXT_IS_DESTROYED, cudaErrorContextIsDestroyed)              \
  X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cudaErrorHostMemoryAlreadyRegistered) \
  X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cudaErrorHostMemoryNotRegistered)   \
  X(CUDA_ERROR_NOT_PERMITTED, cudaErrorNotPermitted)                           \
  X(CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported)                           \
  X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, cudaErrorSystemDriverMismatch)

cudaError_t to_runtime_error(CUresult result) {
  switch (result) {
#define SIMCUDART_MAP_CASE(driver, runtime) \
  case driver:                              \
    return runtime;
    SIMCUDART_RESULT_MAP(SIMCUDART_MAP_CASE)
#undef SIMCUDART_MAP_CASE
    default:
      return cudaErrorUnknown;
  }
}

// Every runtime function returns through here: errors become the thread's
// last error, as cudaGetLastError reports them.
cudaError_t record(cudaError_t error) {
  if (error != cudaSuccess) t_last_error = error;
  return error;
}
cudaError_t record(CUresult result) { return record(to_runtime_error(result)); }

// Only the CUDA 11.3 - 11.8 cuGetProcAddress exists: adapt it.
PFN_cuGetProcAddress_v11030 g_get_proc_address_v1 = nullptr;
CUresult get_proc_address_v1(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  const CUresult result = g_get_proc_address_v1(symbol, pfn, version, flags);
  if (status) *status = result == CUDA_SUCCESS && *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return result;
}

void* find_get_proc_address(void* library) {
#ifdef SIMCUDART_STATIC
  // The real static runtime imports dlvsym, so the static build asks that
  // way first and a tracer's dlvsym hook sees the request. glibc answers
  // NULL for a versioned request on the unversioned libcuda (the real one
  // is unversioned too), so dlsym below is what normally finds it.
  if (void* f = dlvsym(library, "cuGetProcAddress_v2", "libcuda.so.1")) return f;
#endif
  return dlsym(library, "cuGetProcAddress_v2");
}

cudaError_t load_driver() {
  // A machine without the NVIDIA driver: no libcuda.so.1 to load.
  const char* no_driver = std::getenv("SIMCUDA_NO_DRIVER");
  if (no_driver != nullptr && std::strcmp(no_driver, "1") == 0) return cudaErrorInsufficientDriver;
  void* library = dlopen("libcuda.so.1", RTLD_NOW);
  if (library == nullptr) return cudaErrorInsufficientDriver;
  g_driver.library = library;
  g_driver.get_proc_address = reinterpret_cast<PFN_cuGetProcAddress_v12000>(find_get_proc_address(library));
  if (g_driver.get_proc_address == nullptr) {
    g_get_proc_address_v1 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(dlsym(library, "cuGetProcAddress"));
    if (g_get_proc_address_v1 == nullptr) return cudaErrorInsufficientDriver;
    g_driver.get_proc_address = get_proc_address_v1;
  }
  CUdriverProcAddressQueryResult status;
  if (g_driver.get_proc_address("cuDriverGetVersion", reinterpret_cast<void**>(&g_driver.cuDriverGetVersion), 2020,
                                CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
      g_driver.cuDriverGetVersion == nullptr) {
    return cudaErrorInsufficientDriver;
  }
  int version = 0;
  if (g_driver.cuDriverGetVersion(&version) != CUDA_SUCCESS || version < kRuntimeVersion) {
    return cudaErrorInsufficientDriver;
  }
#define SIMCUDART_RESOLVE(member, base, version, variant)                                                  \
  if (g_driver.get_proc_address(#base, reinterpret_cast<void**>(&g_driver.member), version,                  \
                                SIMCUDART_FLAGS_##variant, &status) != CUDA_SUCCESS ||                       \
      g_driver.member == nullptr) {                                                                          \
    return cudaErrorInsufficientDriver;                                                                      \
  }
  SIMCUDART_DRIVER_FUNCTIONS(SIMCUDART_RESOLVE)
#undef SIMCUDART_RESOLVE
  return cudaSuccess;
}

// The driver loaded and its functions resolved; no cuInit yet.
cudaError_t loaded() {
  std::call_once(g_load_once, [] { g_load_status = load_driver(); });
  return g_load_status;
}

// The driver loaded and initialised.
cudaError_t ready() {
  if (cudaError_t e = loaded()) return e;
  std::call_once(g_init_once, [] { g_init_status = to_runtime_error(g_driver.cuInit(0)); });
  return g_init_status;
}

CUresult device_count(int* count) { return g_driver.cuDeviceGetCount(count); }

// Makes the device's primary context current on this thread, retaining it
// once per process as the real runtime does.
cudaError_t make_current(int device) {
  CUcontext ctx = nullptr;
  {
    std::lock_guard lock(g_primary_mutex);
    if (g_primary[device] == nullptr) {
      if (CUresult r = g_driver.cuDevicePrimaryCtxRetain(&g_primary[device], device)) return to_runtime_error(r);
    }
    ctx = g_primary[device];
  }
  return to_runtime_error(g_driver.cuCtxSetCurrent(ctx));
}

// Before any call that needs a context: a context the program made current
// itself is used as it is, otherwise the chosen device's primary one.
cudaError_t activate() {
  if (cudaError_t e = ready()) return e;
  CUcontext current = nullptr;
  if (CUresult r = g_driver.cuCtxGetCurrent(&current)) return to_runtime_error(r);
  if (current != nullptr) return cudaSuccess;
  return make_current(t_device < 0 ? 0 : t_device);
}

// The driver function is named by its member: read only once activate()
// has loaded the driver (this may be the program's first runtime call).
cudaError_t malloc_async(void** devPtr, size_t size, cudaStream_t stream, PFN_cuMemAllocAsync_v11020 DriverApi::*alloc) {
  if (devPtr == nullptr) return cudaErrorInvalidValue;
  if (cudaError_t e = activate()) return e;
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  if (CUresult r = (g_driver.*alloc)(&p, size, stream)) return to_runtime_error(r);
  *devPtr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t free_async(void* devPtr, cudaStream_t stream, PFN_cuMemFreeAsync_v11020 DriverApi::*free) {
  if (cudaError_t e = activate()) return e;
  if (devPtr == nullptr) return cudaSuccess;
  return to_runtime_error((g_driver.*free)(reinterpret_cast<CUdeviceptr>(devPtr), stream));
}

cudaError_t malloc_from_pool(void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream,
                             PFN_cuMemAllocFromPoolAsync_v11020 DriverApi::*alloc) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  if (cudaError_t e = activate()) return e;
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  if (CUresult r = (g_driver.*alloc)(&p, size, pool, stream)) return to_runtime_error(r);
  *ptr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t malloc_pitch(void** devPtr, size_t* pitch, size_t width, size_t rows) {
  if (devPtr == nullptr || pitch == nullptr) return cudaErrorInvalidValue;
  if (cudaError_t e = activate()) return e;
  if (width == 0 || rows == 0) {
    *devPtr = nullptr;
    *pitch = 0;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  if (CUresult r = g_driver.cuMemAllocPitch(&p, pitch, width, rows, 16)) return to_runtime_error(r);
  *devPtr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t get_entry_point(const char* symbol, void** funcPtr, int version, unsigned long long flags,
                            cudaDriverEntryPointQueryResult* driverStatus) {
  if (symbol == nullptr || funcPtr == nullptr) return cudaErrorInvalidValue;
  if (cudaError_t e = ready()) return e;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult result = g_driver.get_proc_address(symbol, funcPtr, version, flags, &status);
  if (driverStatus != nullptr) *driverStatus = static_cast<cudaDriverEntryPointQueryResult>(status);
  return to_runtime_error(result);
}

// Descriptions made from the names: "cudaErrorMemoryAllocation" -> "memory allocation".
struct ErrorText {
  cudaError_t code;
  const char* name;
  char description[64];
};
ErrorText g_errors[] = {
#define SIMCUDART_ERROR_ENTRY(name) {name, #name, {}},
    SIMCUDART_ERRORS(SIMCUDART_ERROR_ENTRY)
#undef SIMCUDART_ERROR_ENTRY
};

const ErrorText* find_error(cudaError_t code) {
  static std::once_flag described;
  std::call_once(described, [] {
    for (ErrorText& e : g_errors) {
      const char* words = std::strncmp(e.name, "cudaError", 9) == 0 ? e.name + 9 : "";
      size_t n = 0;
      if (*words == '\0') {
        std::strcpy(e.description, "no error");
        continue;
      }
      for (size_t i = 0; words[i] != '\0' && n + 2 < sizeof e.description; ++i) {
        const char c = words[i];
        const bool upper = c >= 'A' && c <= 'Z';
        if (upper && i > 0) e.description[n++] = ' ';
        e.description[n++] = upper ? static_cast<char>(c - 'A' + 'a') : c;
      }
      e.description[n] = '\0';
    }
  });
  for (const ErrorText& e : g_errors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace
}  // namespace memledger::simcuda::runtime

using namespace memledger::simcuda::runtime;

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (devPtr == nullptr) return record(cudaErrorInvalidValue);
  if (cudaError_t e = activate()) return record(e);
  // Zero bytes: success and NULL, without a driver call (the driver would
  // refuse a zero-sized allocation).
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  if (CUresult r = g_driver.cuMemAlloc(&p, size)) return record(r);
  *devPtr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  // cudaFree(NULL) is the classic way to initialise the runtime.
  if (cudaError_t e = activate()) return record(e);
  if (devPtr == nullptr) return cudaSuccess;
  return record(g_driver.cuMemFree(reinterpret_cast<CUdeviceptr>(devPtr)));
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  return record(malloc_async(devPtr, size, hStream, &DriverApi::cuMemAllocAsync));
}

cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  return record(malloc_async(devPtr, size, hStream, &DriverApi::cuMemAllocAsync_ptsz));
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  return record(free_async(devPtr, hStream, &DriverApi::cuMemFreeAsync));
}

cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  return record(free_async(devPtr, hStream, &DriverApi::cuMemFreeAsync_ptsz));
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  return record(malloc_from_pool(ptr, size, memPool, stream, &DriverApi::cuMemAllocFromPoolAsync));
}

cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  return record(malloc_from_pool(ptr, size, memPool, stream, &DriverApi::cuMemAllocFromPoolAsync_ptsz));
}

cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
  if (devPtr == nullptr || size == 0) return record(cudaErrorInvalidValue);
  if (cudaError_t e = activate()) return record(e);
  CUdeviceptr p = 0;
  if (CUresult r = g_driver.cuMemAllocManaged(&p, size, flags)) return record(r);
  *devPtr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  if (pHost == nullptr) return record(cudaErrorInvalidValue);
  if (cudaError_t e = activate()) return record(e);
  if (size == 0) {
    *pHost = nullptr;
    return cudaSuccess;
  }
  // cudaHostAlloc* flags have the values of the CU_MEMHOSTALLOC_* ones.
  return record(g_driver.cuMemHostAlloc(pHost, size, flags));
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
  if (cudaError_t e = activate()) return record(e);
  if (ptr == nullptr) return cudaSuccess;
  return record(g_driver.cuMemFreeHost(ptr));
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  if (cudaError_t e = activate()) return record(e);
  return record(g_driver.cuMemHostRegister(ptr, size, flags));
}

cudaError_t cudaHostUnregister(void* ptr) {
  if (cudaError_t e = activate()) return record(e);
  return record(g_driver.cuMemHostUnregister(ptr));
}

cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  return record(malloc_pitch(devPtr, pitch, width, height));
}

cudaError_t cudaMalloc3D(struct cudaPitchedPtr* pitchedDevPtr, struct cudaExtent extent) {
  if (pitchedDevPtr == nullptr) return record(cudaErrorInvalidValue);
  void* p = nullptr;
  size_t pitch = 0;
  // One pitched allocation of height * depth rows, as for a 3D array.
  if (cudaError_t e = malloc_pitch(&p, &pitch, extent.width, extent.height * extent.depth)) return record(e);
  *pitchedDevPtr = cudaPitchedPtr{p, pitch, extent.width, extent.height};
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (cudaError_t e = activate()) return record(e);
  return record(g_driver.cuMemGetInfo(free, total));
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return record(cudaErrorInvalidValue);
  if (cudaError_t e = ready()) {
    *count = 0;
    return record(e);
  }
  return record(device_count(count));
}

cudaError_t cudaSetDevice(int device) {
  if (cudaError_t e = ready()) return record(e);
  int count = 0;
  if (CUresult r = device_count(&count)) return record(r);
  if (device < 0 || device >= count || device >= kMaxDevices) return record(cudaErrorInvalidDevice);
  t_device = device;
  return record(make_current(device));
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return record(cudaErrorInvalidValue);
  if (cudaError_t e = ready()) return record(e);
  CUcontext current = nullptr;
  if (CUresult r = g_driver.cuCtxGetCurrent(&current)) return record(r);
  if (current == nullptr) {
    *device = t_device < 0 ? 0 : t_device;
    return cudaSuccess;
  }
  CUdevice ordinal = 0;
  if (CUresult r = g_driver.cuCtxGetDevice(&ordinal, current)) return record(r);
  *device = ordinal;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (cudaError_t e = activate()) return record(e);
  return record(g_driver.cuCtxSynchronize(nullptr));
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  if (pStream == nullptr) return record(cudaErrorInvalidValue);
  if (cudaError_t e = activate()) return record(e);
  return record(g_driver.cuStreamCreate(pStream, CU_STREAM_DEFAULT));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t e = activate()) return record(e);
  return record(g_driver.cuStreamSynchronize(stream));
}

cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  if (cudaError_t e = activate()) return record(e);
  return record(g_driver.cuStreamSynchronize_ptsz(stream));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (cudaError_t e = activate()) return record(e);
  return record(g_driver.cuStreamDestroy(stream));
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  if (cudaError_t e = ready()) return record(e);
  return record(g_driver.cuDeviceGetDefaultMemPool(memPool, device));
}

cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* memPool, int device) {
  if (cudaError_t e = ready()) return record(e);
  return record(g_driver.cuDeviceGetMemPool(memPool, device));
}

cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  if (cudaError_t e = ready()) return record(e);
  return record(g_driver.cuDeviceSetMemPool(device, memPool));
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const struct cudaMemPoolProps* poolProps) {
  if (poolProps == nullptr) return record(cudaErrorInvalidValue);
  if (cudaError_t e = ready()) return record(e);
  // The runtime's enums have the driver's values; the structs are copied
  // field by field rather than cast.
  CUmemPoolProps props{};
  props.allocType = static_cast<CUmemAllocationType>(poolProps->allocType);
  props.handleTypes = static_cast<CUmemAllocationHandleType>(poolProps->handleTypes);
  props.location.type = static_cast<CUmemLocationType>(poolProps->location.type);
  props.location.id = poolProps->location.id;
  props.win32SecurityAttributes = poolProps->win32SecurityAttributes;
  props.maxSize = poolProps->maxSize;
  props.usage = poolProps->usage;
  return record(g_driver.cuMemPoolCreate(memPool, &props));
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  if (cudaError_t e = ready()) return record(e);
  return record(g_driver.cuMemPoolDestroy(memPool));
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  if (cudaError_t e = ready()) return record(e);
  return record(g_driver.cuMemPoolTrimTo(memPool, minBytesToKeep));
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
  if (cudaError_t e = ready()) return record(e);
  return record(g_driver.cuMemPoolGetAttribute(memPool, static_cast<CUmemPool_attribute>(attr), value));
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
  if (cudaError_t e = ready()) return record(e);
  return record(g_driver.cuMemPoolSetAttribute(memPool, static_cast<CUmemPool_attribute>(attr), value));
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t error = t_last_error;
  t_last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e ? e->name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e ? e->description : "unrecognized error code";
}

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  if (runtimeVersion == nullptr) return record(cudaErrorInvalidValue);
  *runtimeVersion = kRuntimeVersion;
  return cudaSuccess;
}

// 0 without a driver, and no cuInit: the version check comes before.
cudaError_t cudaDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return record(cudaErrorInvalidValue);
  *driverVersion = 0;
  loaded();  // a too-old driver fails to load, but still has a version to tell
  if (g_driver.cuDriverGetVersion == nullptr) return cudaSuccess;
  return record(g_driver.cuDriverGetVersion(driverVersion));
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* driverStatus) {
  return record(get_entry_point(symbol, funcPtr, kRuntimeVersion, flags, driverStatus));
}

// What a program built with --default-stream per-thread calls.
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr, unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult* driverStatus) {
  if (flags == cudaEnableDefault) flags = cudaEnablePerThreadDefaultStream;
  return record(get_entry_point(symbol, funcPtr, kRuntimeVersion, flags, driverStatus));
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult* driverStatus) {
  return record(get_entry_point(symbol, funcPtr, static_cast<int>(cudaVersion), flags, driverStatus));
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  enum cudaDriverEntryPointQueryResult* driverStatus) {
  if (flags == cudaEnableDefault) flags = cudaEnablePerThreadDefaultStream;
  return record(get_entry_point(symbol, funcPtr, static_cast<int>(cudaVersion), flags, driverStatus));
}
