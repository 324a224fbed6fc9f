// Hooks for the handle-creating calls of CUDA's libraries (cudnnCreate,
// cublasCreate_v2). A library that does not fit the driver, the runtime or
// its own sub-libraries fails right there (CUDNN_STATUS_SUBLIBRARY_VERSION_
// MISMATCH, CUBLAS_STATUS_NOT_INITIALIZED, ...), and the frameworks turn that
// into a message far from the cause. The failure is recorded as a
// cuda.create_error fact with the library's own name for the status, and
// the report makes a finding of it (report/environment.h).
//
// Reached like the runtime hooks: as exported symbols (a program or
// framework linked against the library), and through dlsym on the library
// (TensorFlow and XLA dlopen it), via wrap_library_lookup. The real
// functions are found in the loaded library, never loaded by memledger.

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "cuda_stack.h"
#include "libc_symbols.h"
#include "library_hooks.h"
#include "recorder.h"

// X(exported name, library file prefix, the library's call that names a
// status, the status returned when the real function cannot be found).
// cuDNN 9's CUDNN_STATUS_NOT_INITIALIZED is 1001; cuBLAS's is 1.
#define MEMLEDGER_CUDA_LIBRARY_HOOKS(X)                                  \
  X(cudnnCreate, "libcudnn", "cudnnGetErrorString", 1001)                \
  X(cublasCreate_v2, "libcublas", "cublasGetStatusName", 1)

namespace {

using memledger::interposer::HookGuard;
using memledger::interposer::recorder;

#define MEMLEDGER_LIBRARY_SLOT(name, ...) std::atomic<void*> real_##name{nullptr};
MEMLEDGER_CUDA_LIBRARY_HOOKS(MEMLEDGER_LIBRARY_SLOT)

using memledger::interposer::find_in_loaded_library;
using memledger::interposer::is_library_file;
using memledger::interposer::libc_dlsym;

// `library` itself, never a sub-library (is_library_file): cuDNN 9's
// libcudnn.so.9 is a front that hands each call to the function of the same
// name in libcudnn_graph.so.9, found by dlsym. Taken for the library, that
// function would be answered with the hook, and the front's call would come
// back to the hook without end.
bool lives_in(const void* p, const char* library) {
  Dl_info info;
  if (p == nullptr || dladdr(p, &info) == 0 || info.dli_fname == nullptr) return false;
  return is_library_file(info.dli_fname, library);
}

// The library's own definition of `name`: the next one after memledger in
// the global scope, else the one in any loaded copy of the library (one
// loaded RTLD_LOCAL by a framework).
void* find_real(std::atomic<void*>& slot, const char* name, const char* library) {
  void* p = slot.load(std::memory_order_acquire);
  if (p != nullptr) return p;
  p = libc_dlsym(RTLD_NEXT, name);
  if (!lives_in(p, library)) {
    p = find_in_loaded_library(name, library);
  }
  if (p != nullptr) slot.store(p, std::memory_order_release);
  return p;
}

// Records "CALL STATUS NAME\tLIBRARY PATH" once per call and status.
void note_create_error(const char* call, int status, const void* real, const char* status_call) {
  HookGuard guard;
  Dl_info info{};
  const char* path = dladdr(real, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "";
  const char* status_name = "";
  if (void* handle = path[0] != '\0' ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : nullptr) {
    // cudnnGetErrorString and cublasGetStatusName only look up a table.
    if (auto fn = reinterpret_cast<const char* (*)(int)>(libc_dlsym(handle, status_call))) {
      const char* text = fn(status);
      if (text != nullptr) status_name = text;
    }
    dlclose(handle);
  }
  char value[700];
  std::snprintf(value, sizeof value, "%s %d %.80s\t%s", call, status, status_name, path);
  recorder().on_info("cuda.create_error", value);
}

}  // namespace

#define MEMLEDGER_LIBRARY_HOOK(name, library, status_call, not_found)                                     \
  extern "C" __attribute__((visibility("default"))) int name(void** handle) {                              \
    auto real = reinterpret_cast<int (*)(void**)>(find_real(real_##name, #name, library));                 \
    if (real == nullptr) return not_found;                                                                 \
    const int status = real(handle);                                                                       \
    if (recorder().active()) {                                                                             \
      if (status != 0) note_create_error(#name, status, reinterpret_cast<void*>(real), status_call);       \
      memledger::interposer::note_cuda_stack(nullptr, 0); /* the library, loaded by now, with its version */ \
    }                                                                                                      \
    return status;                                                                                         \
  }
MEMLEDGER_CUDA_LIBRARY_HOOKS(MEMLEDGER_LIBRARY_HOOK)

namespace memledger::interposer {

void* wrap_library_lookup(const char* name, void* p) {
#define MEMLEDGER_LIBRARY_LOOKUP(hook, library, ...)                              \
  if (strcmp(name, #hook) == 0) {                                                 \
    if (p == reinterpret_cast<void*>(&::hook) || !lives_in(p, library)) return p; \
    void* expected = nullptr;                                                     \
    real_##hook.compare_exchange_strong(expected, p, std::memory_order_acq_rel);  \
    return reinterpret_cast<void*>(&::hook);                                      \
  }
  MEMLEDGER_CUDA_LIBRARY_HOOKS(MEMLEDGER_LIBRARY_LOOKUP)
  return p;
}

}  // namespace memledger::interposer

// The hook list as data, for the test that checks every hook is exported.
#define MEMLEDGER_LIBRARY_NAME(name, ...) #name,
extern "C" __attribute__((visibility("default"))) const char* const memledger_cuda_library_hook_names[] = {
    MEMLEDGER_CUDA_LIBRARY_HOOKS(MEMLEDGER_LIBRARY_NAME) nullptr};
