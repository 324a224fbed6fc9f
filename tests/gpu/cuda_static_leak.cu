// A CUDA C++ training-like loop built by nvcc with its default static cudart:
// the runtime reaches the driver only through cuGetProcAddress. Each step
// allocates and frees scratch buffers (cudaMalloc and cudaMallocAsync) and
// leaks LEAK_BYTES with cudaMalloc in plant_device_leak. Mode "oom" ends by
// asking for more than the device has.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void touch(float* p, size_t n) {
  size_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = static_cast<float>(i);
}

static std::vector<void*> g_kept;

__attribute__((noinline)) void plant_device_leak(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) == cudaSuccess) g_kept.push_back(p);  // LEAK_LINE
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  const size_t leak = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (4u << 20);
  const bool oom = argc > 3 && std::strcmp(argv[3], "oom") == 0;
  auto step = reinterpret_cast<void (*)(const char*)>(dlsym(RTLD_DEFAULT, "memledger_step"));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  for (int s = 0; s < steps; ++s) {
    float* scratch = nullptr;
    cudaMalloc(&scratch, 8u << 20);
    touch<<<(2u << 20) / 256, 256, 0, stream>>>(scratch, 2u << 20);
    void* async_buf = nullptr;
    cudaMallocAsync(&async_buf, 16u << 20, stream);
    cudaFreeAsync(async_buf, stream);
    cudaStreamSynchronize(stream);
    cudaFree(scratch);
    if (leak) plant_device_leak(leak);
    if (step) step("train");
    std::printf("STEP_DONE %d\n", s);
  }
  if (oom) {
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    void* huge = nullptr;
    size_t request = total + (1ull << 30);
    std::printf("OOM_REQUESTED=%zu\n", request);
    cudaError_t err = cudaMalloc(&huge, request);
    std::printf("OOM_ERROR=%d\n", static_cast<int>(err));
    std::fflush(stdout);
    return err == cudaErrorMemoryAllocation ? 3 : 0;
  }
  return 0;
}
