// memledger's own CUDA declarations (interposer/cuda_abi.h) against the real
// CUDA headers: built only where the toolkit is installed.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <type_traits>

#include "cuda_abi.h"

namespace ml = memledger::cuda;

TEST_CASE("memledger's CUDA declarations match the toolkit's headers", "[cuda]") {
  STATIC_REQUIRE(sizeof(ml::CUresult) == sizeof(CUresult));
  STATIC_REQUIRE(sizeof(ml::CUdeviceptr) == sizeof(CUdeviceptr));
  STATIC_REQUIRE(sizeof(ml::CUmemGenericAllocationHandle) == sizeof(CUmemGenericAllocationHandle));
  STATIC_REQUIRE(sizeof(ml::cudaError_t) == sizeof(cudaError_t));
  STATIC_REQUIRE(ml::CUDA_SUCCESS == CUDA_SUCCESS);
  STATIC_REQUIRE(ml::CUDA_ERROR_OUT_OF_MEMORY == CUDA_ERROR_OUT_OF_MEMORY);
  STATIC_REQUIRE(ml::cudaErrorMemoryAllocation == cudaErrorMemoryAllocation);
  STATIC_REQUIRE(ml::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  STATIC_REQUIRE(ml::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  STATIC_REQUIRE(ml::CU_MEMPOOL_ATTR_USED_MEM_CURRENT == CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  STATIC_REQUIRE(ml::CU_MEM_LOCATION_TYPE_DEVICE == CU_MEM_LOCATION_TYPE_DEVICE);
  STATIC_REQUIRE(ml::CU_MEM_LOCATION_TYPE_NONE == CU_MEM_LOCATION_TYPE_NONE);
  STATIC_REQUIRE(ml::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
  STATIC_REQUIRE(ml::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
  STATIC_REQUIRE(ml::CU_MEM_LOCATION_TYPE_HOST == CU_MEM_LOCATION_TYPE_HOST);
  STATIC_REQUIRE(ml::CU_MEM_ALLOCATION_TYPE_PINNED == CU_MEM_ALLOCATION_TYPE_PINNED);
  STATIC_REQUIRE(ml::CU_MEM_ALLOCATION_TYPE_MANAGED == CU_MEM_ALLOCATION_TYPE_MANAGED);
  STATIC_REQUIRE(offsetof(CUmemAllocationProp, location) == ml::kPropsLocationOffset);
  STATIC_REQUIRE(offsetof(CUmemPoolProps, location) == ml::kPropsLocationOffset);
  STATIC_REQUIRE(sizeof(ml::MemLocation) == sizeof(CUmemLocation));
  STATIC_REQUIRE(offsetof(CUmemLocation, id) == offsetof(ml::MemLocation, id));
  STATIC_REQUIRE(sizeof(ml::PitchedPtr) == sizeof(cudaPitchedPtr));
  STATIC_REQUIRE(offsetof(cudaPitchedPtr, pitch) == offsetof(ml::PitchedPtr, pitch));
  STATIC_REQUIRE(sizeof(ml::Extent) == sizeof(cudaExtent));
}
