// The few CUDA driver and runtime types and constants the hooks need,
// declared here so that the preload library builds without the CUDA toolkit
// and never links against it. They mirror cuda.h / cuda_runtime_api.h of
// CUDA 13 (ABI-stable since CUDA 11.2); tests/unit/cuda_abi_test.cpp checks
// them against the real headers when the toolkit is installed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memledger::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUmemoryPool = struct CUmemPoolHandle_st*;
using CUmemGenericAllocationHandle = unsigned long long;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;
using CUgraphNode = struct CUgraphNode_st*;
using cuuint64_t = uint64_t;
using cudaError_t = int;
using cudaStream_t = CUstream;
using cudaMemPool_t = CUmemoryPool;

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr cudaError_t cudaSuccess = 0;
inline constexpr cudaError_t cudaErrorMemoryAllocation = 2;

// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD (cudaStreamLegacy, cudaStreamPerThread).
inline const CUstream kStreamLegacy = reinterpret_cast<CUstream>(0x1);
inline const CUstream kStreamPerThread = reinterpret_cast<CUstream>(0x2);

inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1;
inline constexpr int CU_GET_PROC_ADDRESS_SUCCESS = 0;

inline constexpr int CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5;
inline constexpr int CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7;
inline constexpr int CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0;
inline constexpr int CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2;

inline constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
inline constexpr int CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;
inline constexpr unsigned long long CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1;

inline constexpr int CU_MEM_LOCATION_TYPE_NONE = 0;
inline constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 1;
inline constexpr int CU_MEM_LOCATION_TYPE_HOST = 2;
inline constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 1;
inline constexpr int CU_MEM_ALLOCATION_TYPE_MANAGED = 2;

// CUmemLocation, and the leading fields of CUmemAllocationProp and
// CUmemPoolProps (both start with two enums, then a CUmemLocation).
struct MemLocation {
  int type;
  int id;
};
struct PropsPrefix {
  int type;
  int handle_types;
  MemLocation location;
};
inline constexpr size_t kPropsLocationOffset = 8;

// cudaPitchedPtr and cudaExtent (cudaMalloc3D passes them by pointer and value).
struct PitchedPtr {
  void* ptr;
  size_t pitch;
  size_t xsize;
  size_t ysize;
};
struct Extent {
  size_t width;
  size_t height;
  size_t depth;
};

}  // namespace memledger::cuda
