// A stand-in for libcublas.so.13: its version and status-name calls and
// handles, with the real prototypes and status values (cublas_api.h). The
// create call fails with the status in SIMCUDA_CUBLAS_CREATE_STATUS (a
// number, such as 1 for CUBLAS_STATUS_NOT_INITIALIZED).
#include <cublas_api.h>

#include <cstdlib>

namespace {
int handle_storage;
}

extern "C" {

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  const char* status = std::getenv("SIMCUDA_CUBLAS_CREATE_STATUS");
  if (status != nullptr && std::atoi(status) != 0) return static_cast<cublasStatus_t>(std::atoi(status));
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = reinterpret_cast<cublasHandle_t>(&handle_storage);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

}  // extern "C"
