// A library linked against the shared runtime and loaded RTLD_LOCAL, as
// Python packages load theirs (ctypes; the JAX CUDA plugin): its runtime and
// the runtime's dependencies are outside the process's global scope. The
// integration tests call it from Python through ctypes.

#include <dlfcn.h>

#include <cuda_runtime_api.h>

extern "C" {

// One step's planted leak through the runtime's PLT; the runtime's error code.
__attribute__((visibility("default"), noinline)) int plugin_leak(size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes);
}

// An allocation freed at once; the first error code.
__attribute__((visibility("default"))) int plugin_alloc_free(size_t bytes) {
  void* p = nullptr;
  const cudaError_t r = cudaMalloc(&p, bytes);
  if (r != cudaSuccess) return r;
  return cudaFree(p);
}

// dlsym(RTLD_DEFAULT) of a runtime function from here finds this library's
// own runtime (its local scope): the device count through it, or -1 when
// the look-up fails, -2 when the call does.
__attribute__((visibility("default"))) int plugin_default_lookup(void) {
  using Fn = cudaError_t (*)(int*);
  auto count = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "cudaGetDeviceCount"));
  if (count == nullptr) return -1;
  int n = 0;
  return count(&n) == cudaSuccess ? n : -2;
}

}
