// Finds libcupti, dlopen's it and resolves the functions the tracer calls.
// The module is compiled against the CUPTI headers but never linked against
// libcupti: a process without CUPTI must load the module and be told, in one
// line, why CUPTI is not used.
#pragma once

#include <cupti.h>

#include <cstddef>
#include <cstdint>

namespace memledger::cupti {

// Every CUPTI function the tracer uses, listed once: X(name, required).
#define MEMLEDGER_CUPTI_FUNCTIONS(X)         \
  X(cuptiGetVersion, true)                   \
  X(cuptiGetResultString, true)              \
  X(cuptiSubscribe, true)                    \
  X(cuptiSubscribe_v2, false)                \
  X(cuptiUnsubscribe, true)                  \
  X(cuptiEnableCallback, true)               \
  X(cuptiActivityEnable, true)               \
  X(cuptiActivityDisable, true)              \
  X(cuptiActivityRegisterCallbacks, true)    \
  X(cuptiActivityRegisterTimestampCallback, false) \
  X(cuptiActivityGetNextRecord, true)        \
  X(cuptiActivityGetNumDroppedRecords, true) \
  X(cuptiActivityFlushAll, true)             \
  X(cuptiFinalize, false)

class CuptiLibrary {
 public:
  // The major CUDA version the module was built for (CUPTI_API_VERSION).
  static constexpr uint32_t kBuiltVersion = CUPTI_API_VERSION;
  static constexpr uint32_t kBuiltMajor = CUPTI_API_VERSION / 10000;

  // Finds and loads libcupti: `path` (a file or a folder) when given, and
  // only there; otherwise a libcupti already loaded in the process, the
  // Python package folders of loaded modules (nvidia-cuda-cupti), the CUDA
  // install ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda), the loader's path.
  // On failure returns false with `error` saying what was tried.
  bool load(const char* path, char* error, size_t error_size);

  // The CUPTI API version of the loaded library (after load()).
  uint32_t version() const { return version_; }
  const char* path() const { return path_; }

  // "CUPTI_ERROR_..." for a result code.
  const char* result_name(CUptiResult result) const;

#define MEMLEDGER_CUPTI_POINTER(name, required) decltype(&::name) name = nullptr;
  MEMLEDGER_CUPTI_FUNCTIONS(MEMLEDGER_CUPTI_POINTER)
#undef MEMLEDGER_CUPTI_POINTER

 private:
  bool try_open(const char* candidate, char* error, size_t error_size);
  bool resolve(char* error, size_t error_size);

  void* handle_ = nullptr;
  uint32_t version_ = 0;
  char path_[1024] = {};
  char tried_[2048] = {};
};

// The major CUDA version a CUPTI API version stands for: xxyyzz from CUDA 13
// on, a small sequence number before (cupti_version.h lists them).
uint32_t cupti_major(uint32_t api_version);

}  // namespace memledger::cupti
