// Every function the simulated libcuda.so.1 exports, listed once. The same
// list declares the call counters, builds the cuGetProcAddress table and is
// checked by the tests against what the library really exports.
//
// X(base name that cuGetProcAddress is asked for, exported symbol, first CUDA
//   version with this ABI as cuGetProcAddress's cudaVersion counts it,
//   kLegacy or kPerThread for the per-thread default stream variant)
//
// The versions are those of the PFN_<name>_v<version> typedefs in CUDA 13's
// cudaTypedefs.h; the _v2.._v4 suffixes are the exported names cuda.h maps
// the plain names to.
#pragma once

#define SIMCUDA_DRIVER_SYMBOLS(X)                                              \
  X(cuInit, cuInit, 2000, kLegacy)                                             \
  X(cuDriverGetVersion, cuDriverGetVersion, 2020, kLegacy)                     \
  X(cuGetErrorString, cuGetErrorString, 6000, kLegacy)                         \
  X(cuGetErrorName, cuGetErrorName, 6000, kLegacy)                             \
  X(cuGetProcAddress, cuGetProcAddress, 11030, kLegacy)                        \
  X(cuGetProcAddress, cuGetProcAddress_v2, 12000, kLegacy)                     \
  X(cuGetExportTable, cuGetExportTable, 3000, kLegacy)                         \
  /* devices */                                                                \
  X(cuDeviceGet, cuDeviceGet, 2000, kLegacy)                                   \
  X(cuDeviceGetCount, cuDeviceGetCount, 2000, kLegacy)                         \
  X(cuDeviceGetName, cuDeviceGetName, 2000, kLegacy)                           \
  X(cuDeviceTotalMem, cuDeviceTotalMem, 2000, kLegacy)                         \
  X(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020, kLegacy)                      \
  X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, kLegacy)                 \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, kLegacy)         \
  X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, kLegacy)       \
  X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000, kLegacy)   \
  X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState, 7000, kLegacy)     \
  X(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, 11040, kLegacy) \
  /* contexts */                                                               \
  X(cuCtxCreate, cuCtxCreate, 2000, kLegacy)                                   \
  X(cuCtxCreate, cuCtxCreate_v2, 3020, kLegacy)                                \
  X(cuCtxCreate, cuCtxCreate_v3, 11040, kLegacy)                               \
  X(cuCtxCreate, cuCtxCreate_v4, 12050, kLegacy)                               \
  X(cuCtxDestroy, cuCtxDestroy, 2000, kLegacy)                                 \
  X(cuCtxDestroy, cuCtxDestroy_v2, 4000, kLegacy)                              \
  X(cuCtxPushCurrent, cuCtxPushCurrent, 2000, kLegacy)                         \
  X(cuCtxPushCurrent, cuCtxPushCurrent_v2, 4000, kLegacy)                      \
  X(cuCtxPopCurrent, cuCtxPopCurrent, 2000, kLegacy)                           \
  X(cuCtxPopCurrent, cuCtxPopCurrent_v2, 4000, kLegacy)                        \
  X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, kLegacy)                           \
  X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, kLegacy)                           \
  X(cuCtxGetDevice, cuCtxGetDevice, 2000, kLegacy)                             \
  X(cuCtxGetDevice, cuCtxGetDevice_v2, 13000, kLegacy)                         \
  X(cuCtxSynchronize, cuCtxSynchronize, 2000, kLegacy)                         \
  X(cuCtxSynchronize, cuCtxSynchronize_v2, 13000, kLegacy)                     \
  /* streams */                                                                \
  X(cuStreamCreate, cuStreamCreate, 2000, kLegacy)                             \
  X(cuStreamDestroy, cuStreamDestroy, 2000, kLegacy)                           \
  X(cuStreamDestroy, cuStreamDestroy_v2, 4000, kLegacy)                        \
  X(cuStreamSynchronize, cuStreamSynchronize, 2000, kLegacy)                   \
  X(cuStreamSynchronize, cuStreamSynchronize_ptsz, 7000, kPerThread)           \
  X(cuStreamGetCtx, cuStreamGetCtx, 9020, kLegacy)                             \
  X(cuStreamGetCtx, cuStreamGetCtx_ptsz, 9020, kPerThread)                     \
  X(cuStreamGetDevice, cuStreamGetDevice, 12080, kLegacy)                      \
  X(cuStreamGetDevice, cuStreamGetDevice_ptsz, 12080, kPerThread)              \
  /* stream capture and graphs */                                             \
  X(cuStreamBeginCapture, cuStreamBeginCapture, 10000, kLegacy)                \
  X(cuStreamBeginCapture, cuStreamBeginCapture_ptsz, 10000, kPerThread)        \
  X(cuStreamBeginCapture, cuStreamBeginCapture_v2, 10010, kLegacy)             \
  X(cuStreamBeginCapture, cuStreamBeginCapture_v2_ptsz, 10010, kPerThread)     \
  X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, 12030, kLegacy) \
  X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz, 12030, kPerThread) \
  X(cuStreamEndCapture, cuStreamEndCapture, 10000, kLegacy)                    \
  X(cuStreamEndCapture, cuStreamEndCapture_ptsz, 10000, kPerThread)            \
  X(cuStreamIsCapturing, cuStreamIsCapturing, 10000, kLegacy)                  \
  X(cuStreamIsCapturing, cuStreamIsCapturing_ptsz, 10000, kPerThread)          \
  X(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v2, 11030, kLegacy)         \
  X(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v2_ptsz, 11030, kPerThread) \
  X(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v3, 12030, kLegacy)         \
  X(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v3_ptsz, 12030, kPerThread) \
  X(cuGraphInstantiate, cuGraphInstantiate_v2, 11000, kLegacy)                 \
  X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, kLegacy)  \
  X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, kLegacy) \
  X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz, 12000, kPerThread) \
  X(cuGraphLaunch, cuGraphLaunch, 10000, kLegacy)                              \
  X(cuGraphLaunch, cuGraphLaunch_ptsz, 10000, kPerThread)                      \
  X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, kLegacy)                    \
  X(cuGraphCreate, cuGraphCreate, 10000, kLegacy)                              \
  X(cuGraphDestroy, cuGraphDestroy, 10000, kLegacy)                            \
  /* linear device, managed and pinned host memory */                         \
  X(cuMemGetInfo, cuMemGetInfo, 2000, kLegacy)                                 \
  X(cuMemGetInfo, cuMemGetInfo_v2, 3020, kLegacy)                              \
  X(cuMemAlloc, cuMemAlloc, 2000, kLegacy)                                     \
  X(cuMemAlloc, cuMemAlloc_v2, 3020, kLegacy)                                  \
  X(cuMemAllocPitch, cuMemAllocPitch, 2000, kLegacy)                           \
  X(cuMemAllocPitch, cuMemAllocPitch_v2, 3020, kLegacy)                        \
  X(cuMemFree, cuMemFree, 2000, kLegacy)                                       \
  X(cuMemFree, cuMemFree_v2, 3020, kLegacy)                                    \
  X(cuMemGetAddressRange, cuMemGetAddressRange, 2000, kLegacy)                 \
  X(cuMemGetAddressRange, cuMemGetAddressRange_v2, 3020, kLegacy)              \
  X(cuMemAllocManaged, cuMemAllocManaged, 6000, kLegacy)                       \
  X(cuMemAllocHost, cuMemAllocHost, 2000, kLegacy)                             \
  X(cuMemAllocHost, cuMemAllocHost_v2, 3020, kLegacy)                          \
  X(cuMemHostAlloc, cuMemHostAlloc, 2020, kLegacy)                             \
  X(cuMemFreeHost, cuMemFreeHost, 2000, kLegacy)                               \
  X(cuMemHostRegister, cuMemHostRegister, 4000, kLegacy)                       \
  X(cuMemHostRegister, cuMemHostRegister_v2, 6050, kLegacy)                    \
  X(cuMemHostUnregister, cuMemHostUnregister, 4000, kLegacy)                   \
  X(cuPointerGetAttribute, cuPointerGetAttribute, 4000, kLegacy)               \
  /* stream-ordered allocator and memory pools */                              \
  X(cuMemAllocAsync, cuMemAllocAsync, 11020, kLegacy)                          \
  X(cuMemAllocAsync, cuMemAllocAsync_ptsz, 11020, kPerThread)                  \
  X(cuMemFreeAsync, cuMemFreeAsync, 11020, kLegacy)                            \
  X(cuMemFreeAsync, cuMemFreeAsync_ptsz, 11020, kPerThread)                    \
  X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, kLegacy)          \
  X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz, 11020, kPerThread)  \
  X(cuMemPoolCreate, cuMemPoolCreate, 11020, kLegacy)                          \
  X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, kLegacy)                        \
  X(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, kLegacy)                          \
  X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, kLegacy)              \
  X(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, kLegacy)              \
  X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, kLegacy)      \
  X(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, kLegacy)                    \
  X(cuDeviceSetMemPool, cuDeviceSetMemPool, 11020, kLegacy)                    \
  X(cuMemGetDefaultMemPool, cuMemGetDefaultMemPool, 13000, kLegacy)            \
  X(cuMemGetMemPool, cuMemGetMemPool, 13000, kLegacy)                          \
  X(cuMemSetMemPool, cuMemSetMemPool, 13000, kLegacy)                          \
  /* virtual memory management (PyTorch's expandable segments) */             \
  X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020, kLegacy) \
  X(cuMemAddressReserve, cuMemAddressReserve, 10020, kLegacy)                  \
  X(cuMemAddressFree, cuMemAddressFree, 10020, kLegacy)                        \
  X(cuMemCreate, cuMemCreate, 10020, kLegacy)                                  \
  X(cuMemRelease, cuMemRelease, 10020, kLegacy)                                \
  X(cuMemMap, cuMemMap, 10020, kLegacy)                                        \
  X(cuMemUnmap, cuMemUnmap, 10020, kLegacy)                                    \
  X(cuMemSetAccess, cuMemSetAccess, 10020, kLegacy)                            \
  X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, kLegacy)  \
  X(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle, 10020, kLegacy) \
  X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, kLegacy) \
  X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, kLegacy) \
  X(cuMulticastCreate, cuMulticastCreate, 12010, kLegacy)                      \
  X(cuMulticastGetGranularity, cuMulticastGetGranularity, 12010, kLegacy)

namespace memledger::simcuda {

// One value per exported symbol, in list order.
enum class Sym : int {
#define SIMCUDA_SYM_ENUM(base, symbol, version, variant) symbol,
  SIMCUDA_DRIVER_SYMBOLS(SIMCUDA_SYM_ENUM)
#undef SIMCUDA_SYM_ENUM
      kCount
};

enum class Variant : unsigned char { kLegacy, kPerThread };

}  // namespace memledger::simcuda
