// A stand-in for libcudnn_graph.so.9, the cuDNN 9 sub-library that
// libcudnn.so.9 hands its calls to (cudnn.cpp): the version call, handles,
// and status names, with the real prototypes and status values
// (cudnn_graph.h). The create
// call fails with the status in SIMCUDA_CUDNN_CREATE_STATUS (a number, such
// as 1002 for CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH), for tests of what
// memledger makes of a cuDNN that does not fit the rest of the CUDA stack.
#include <cudnn_graph.h>

#include <cstdlib>

namespace {
int handle_storage;
}

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  const char* status = std::getenv("SIMCUDA_CUDNN_CREATE_STATUS");
  if (status != nullptr && std::atoi(status) != 0) return static_cast<cudnnStatus_t>(std::atoi(status));
  if (handle == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  *handle = reinterpret_cast<cudnnHandle_t>(&handle_storage);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t) { return CUDNN_STATUS_SUCCESS; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH: return "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER: return "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER";
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART: return "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART";
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH: return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    default: return "CUDNN_STATUS_UNKNOWN";
  }
}

}  // extern "C"
