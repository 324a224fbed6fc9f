// A stand-in for libcudnn.so.9. As in cuDNN 9, this library is a front that
// loads its sub-library (libcudnn_graph.so.9, cudnn_graph.cpp) from its own
// folder, RTLD_LOCAL, and hands each call to the function of the same name
// that dlsym finds there: a hook that answers the front's own look-ups with
// itself makes each call come back to it without end.
#include <cudnn_graph.h>
#include <dlfcn.h>

#include <cstring>
#include <string>

namespace {

void* sub_library() {
  static void* const handle = []() -> void* {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&sub_library), &info) == 0 || info.dli_fname == nullptr) return nullptr;
    std::string path = info.dli_fname;
    path.resize(path.rfind('/') + 1);
    path += "libcudnn_graph.so.9";
    return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }();
  return handle;
}

template <typename Fn>
Fn in_sub_library(const char* name) {
  void* handle = sub_library();
  return handle != nullptr ? reinterpret_cast<Fn>(dlsym(handle, name)) : nullptr;
}

}  // namespace

extern "C" {

size_t cudnnGetVersion(void) {
  auto fn = in_sub_library<size_t (*)()>("cudnnGetVersion");
  return fn != nullptr ? fn() : 0;
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  auto fn = in_sub_library<cudnnStatus_t (*)(cudnnHandle_t*)>("cudnnCreate");
  return fn != nullptr ? fn(handle) : CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  auto fn = in_sub_library<cudnnStatus_t (*)(cudnnHandle_t)>("cudnnDestroy");
  return fn != nullptr ? fn(handle) : CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
  auto fn = in_sub_library<const char* (*)(cudnnStatus_t)>("cudnnGetErrorString");
  return fn != nullptr ? fn(status) : "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED";
}

}  // extern "C"
