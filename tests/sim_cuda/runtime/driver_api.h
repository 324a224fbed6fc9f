// The driver functions the simulated runtime calls. Like the real cudart it
// never links against libcuda: it dlopens libcuda.so.1, finds
// cuGetProcAddress_v2 and resolves everything else through it, so a program
// that carries the runtime statically reaches the driver only through
// pointers that cuGetProcAddress handed out.
#pragma once

#include <cudaTypedefs.h>  // PFN_<name>_v<version>, the typedef of each ABI

namespace memledger::simcuda::runtime {

// X(member, base name for cuGetProcAddress, version of the ABI used,
//   LEGACY or PTSZ). Each function is asked for at the version of its ABI
// (cuMemAlloc at 3020 gives cuMemAlloc_v2), with the per-thread flag for the
// _ptsz variants: what the real libcudart.so.13 does (SIMCUDA_TRACE=1 shows
// its look-ups), rather than asking everything at 13000. The member's type is
// the matching PFN_<base>_v<version>[_ptsz] of cudaTypedefs.h.
#define SIMCUDART_DRIVER_FUNCTIONS(X)                                        \
  X(cuInit, cuInit, 2000, LEGACY)                                            \
  X(cuDeviceGetCount, cuDeviceGetCount, 2000, LEGACY)                        \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, LEGACY)        \
  X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, LEGACY)                          \
  X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, LEGACY)                          \
  X(cuCtxGetDevice, cuCtxGetDevice, 13000, LEGACY)                           \
  X(cuCtxSynchronize, cuCtxSynchronize, 13000, LEGACY)                       \
  X(cuStreamCreate, cuStreamCreate, 2000, LEGACY)                            \
  X(cuStreamDestroy, cuStreamDestroy, 4000, LEGACY)                          \
  X(cuStreamSynchronize, cuStreamSynchronize, 2000, LEGACY)                  \
  X(cuStreamSynchronize_ptsz, cuStreamSynchronize, 7000, PTSZ)               \
  X(cuMemGetInfo, cuMemGetInfo, 3020, LEGACY)                                \
  X(cuMemAlloc, cuMemAlloc, 3020, LEGACY)                                    \
  X(cuMemAllocPitch, cuMemAllocPitch, 3020, LEGACY)                          \
  X(cuMemFree, cuMemFree, 3020, LEGACY)                                      \
  X(cuMemAllocManaged, cuMemAllocManaged, 6000, LEGACY)                      \
  X(cuMemHostAlloc, cuMemHostAlloc, 2020, LEGACY)                            \
  X(cuMemFreeHost, cuMemFreeHost, 2000, LEGACY)                              \
  X(cuMemHostRegister, cuMemHostRegister, 6050, LEGACY)                      \
  X(cuMemHostUnregister, cuMemHostUnregister, 4000, LEGACY)                  \
  X(cuMemAllocAsync, cuMemAllocAsync, 11020, LEGACY)                         \
  X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, PTSZ)                      \
  X(cuMemFreeAsync, cuMemFreeAsync, 11020, LEGACY)                           \
  X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, PTSZ)                        \
  X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, LEGACY)         \
  X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, PTSZ)      \
  X(cuMemPoolCreate, cuMemPoolCreate, 11020, LEGACY)                         \
  X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, LEGACY)                       \
  X(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, LEGACY)                         \
  X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, LEGACY)             \
  X(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, LEGACY)             \
  X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, LEGACY)     \
  X(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, LEGACY)                   \
  X(cuDeviceSetMemPool, cuDeviceSetMemPool, 11020, LEGACY)

#define SIMCUDART_PFN_LEGACY(base, version) PFN_##base##_v##version
#define SIMCUDART_PFN_PTSZ(base, version) PFN_##base##_v##version##_ptsz
#define SIMCUDART_FLAGS_LEGACY CU_GET_PROC_ADDRESS_DEFAULT
#define SIMCUDART_FLAGS_PTSZ CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

// The toolkit the runtime was built with: its cudaRuntimeGetVersion, the
// oldest driver it accepts, and what cudaGetDriverEntryPoint asks for.
// runtime/cuda12/ builds the same source as a CUDA 12.8 runtime
// (libcudart.so.12), for programs that load two runtime majors.
#ifdef SIMCUDART_RUNTIME_VERSION
inline constexpr int kRuntimeVersion = SIMCUDART_RUNTIME_VERSION;
#else
inline constexpr int kRuntimeVersion = CUDA_VERSION;
#endif

struct DriverApi {
  void* library = nullptr;
  PFN_cuGetProcAddress_v12000 get_proc_address = nullptr;
  // Resolved first, to refuse a driver older than the runtime.
  PFN_cuDriverGetVersion_v2020 cuDriverGetVersion = nullptr;
#define SIMCUDART_DRIVER_MEMBER(member, base, version, variant) SIMCUDART_PFN_##variant(base, version) member = nullptr;
  SIMCUDART_DRIVER_FUNCTIONS(SIMCUDART_DRIVER_MEMBER)
#undef SIMCUDART_DRIVER_MEMBER
};

}  // namespace memledger::simcuda::runtime
