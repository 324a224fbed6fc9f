// A training-like loop on the CUDA runtime API, built twice: against the
// shared runtime (cuda_runtime_dynamic, libcudart.so.13) and the static one
// (cuda_runtime_static, libsimcudart_static.a, nvcc's default), where the
// runtime's driver calls are visible only through cuGetProcAddress.
//
// Each step allocates and frees, within the step: cudaMalloc (three sizes),
// cudaMallocAsync on a stream, cudaMallocFromPoolAsync from an explicit pool,
// pinned host memory, managed memory, a pitched and a 3D allocation, and a
// cudaMalloc on device 1 when there is one; then leaks exactly LEAK_BYTES in
// plant_device_leak, with the API the mode names:
//   normal  cudaMalloc           async    cudaMallocAsync
//   pool    cudaMallocFromPoolAsync      managed  cudaMallocManaged
//   oom     cudaMalloc, and after the steps asks for more than device 0 has.
// Output format: program_common.h.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "program_common.h"

using namespace simcuda_programs;

namespace {

const char* const kModes[] = {"normal", "async", "pool", "managed", "oom", nullptr};

void check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "FATAL %s: %d %s\n", what, static_cast<int>(error), cudaGetErrorName(error));
  std::exit(1);
}

struct Resources {
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  int device_count = 0;
};

enum class LeakApi { kMalloc, kAsync, kPool, kManaged };

// The planted leak. Each API's call is on the line kLeakLineBase + its enum
// value names, and carries the "PLANTED LEAK" comment (the tests check).
constexpr int kLeakLineBase = __LINE__ + 6;
__attribute__((noinline, noipa)) void* plant_device_leak(LeakApi api, size_t bytes, const Resources& res) {
  void* p = nullptr;
  cudaError_t error = cudaSuccess;
  switch (api) {
    // clang-format off
    case LeakApi::kMalloc: error = cudaMalloc(&p, bytes); break;  // PLANTED LEAK cudaMalloc
    case LeakApi::kAsync: error = cudaMallocAsync(&p, bytes, res.stream); break;  // PLANTED LEAK cudaMallocAsync
    case LeakApi::kPool: error = cudaMallocFromPoolAsync(&p, bytes, res.pool, res.stream); break;  // PLANTED LEAK cudaMallocFromPoolAsync
    case LeakApi::kManaged: error = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal); break;  // PLANTED LEAK cudaMallocManaged
      // clang-format on
  }
  check(error, "plant_device_leak");
  return p;
}

// Short-lived device memory: activations made and dropped within the step.
__attribute__((noinline)) void forward_pass(const Resources& res, long step) {
  const size_t sizes[] = {1 * kMiB, 3 * kMiB + 5, 64 * 1024 + static_cast<size_t>(step % 7) * 256};
  void* blocks[3] = {};
  for (int i = 0; i < 3; ++i) check(cudaMalloc(&blocks[i], sizes[i]), "cudaMalloc");
  void* async_blocks[2] = {};
  check(cudaMallocAsync(&async_blocks[0], 5 * kMiB, res.stream), "cudaMallocAsync");
  check(cudaMallocAsync(&async_blocks[1], 700 * 1024, res.stream), "cudaMallocAsync");
  void* pooled = nullptr;
  check(cudaMallocFromPoolAsync(&pooled, 4 * kMiB, res.pool, res.stream), "cudaMallocFromPoolAsync");
  for (void* p : blocks) check(cudaFree(p), "cudaFree");
  for (void* p : async_blocks) check(cudaFreeAsync(p, res.stream), "cudaFreeAsync");
  check(cudaFreeAsync(pooled, res.stream), "cudaFreeAsync");
  check(cudaStreamSynchronize(res.stream), "cudaStreamSynchronize");
}

// Short-lived host-side buffers: pinned staging, managed, pitched, 3D.
__attribute__((noinline)) void load_batch() {
  void* pinned = nullptr;
  check(cudaMallocHost(&pinned, 256 * 1024), "cudaMallocHost");
  touch(pinned, 256 * 1024);
  void* mapped = nullptr;
  check(cudaHostAlloc(&mapped, 128 * 1024, cudaHostAllocMapped), "cudaHostAlloc");
  void* managed = nullptr;
  check(cudaMallocManaged(&managed, 512 * 1024, cudaMemAttachGlobal), "cudaMallocManaged");
  touch(managed, 512 * 1024);
  void* pitched = nullptr;
  size_t pitch = 0;
  check(cudaMallocPitch(&pitched, &pitch, 1000, 300), "cudaMallocPitch");
  cudaPitchedPtr volume{};
  check(cudaMalloc3D(&volume, cudaExtent{256, 64, 16}), "cudaMalloc3D");
  check(cudaFree(volume.ptr), "cudaFree");
  check(cudaFree(pitched), "cudaFree");
  check(cudaFree(managed), "cudaFree");
  check(cudaFreeHost(mapped), "cudaFreeHost");
  check(cudaFreeHost(pinned), "cudaFreeHost");
}

// Data-parallel replica: a short-lived buffer on device 1.
__attribute__((noinline)) void replica_step(const Resources& res) {
  if (res.device_count < 2) return;
  check(cudaSetDevice(1), "cudaSetDevice");
  void* p = nullptr;
  check(cudaMalloc(&p, 2 * kMiB), "cudaMalloc");
  check(cudaFree(p), "cudaFree");
  check(cudaSetDevice(0), "cudaSetDevice");
}

size_t device0_free(size_t* total = nullptr) {
  size_t free = 0;
  size_t all = 0;
  check(cudaMemGetInfo(&free, &all), "cudaMemGetInfo");
  if (total) *total = all;
  return free;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, kModes);
  const LeakApi leak_api = mode_is(args, "async")     ? LeakApi::kAsync
                           : mode_is(args, "pool")    ? LeakApi::kPool
                           : mode_is(args, "managed") ? LeakApi::kManaged
                                                      : LeakApi::kMalloc;
  const StepFn marker = find_step_marker();

  Resources res;
  check(cudaGetDeviceCount(&res.device_count), "cudaGetDeviceCount");
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaStreamCreate(&res.stream), "cudaStreamCreate");
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  check(cudaMemPoolCreate(&res.pool, &props), "cudaMemPoolCreate");
  // Keep freed pool memory reserved, as frameworks do.
  uint64_t threshold = UINT64_MAX;
  check(cudaMemPoolSetAttribute(res.pool, cudaMemPoolAttrReleaseThreshold, &threshold), "cudaMemPoolSetAttribute");
  // Pageable memory registered for fast copies, for the whole run.
  static char staging[64 * 1024];
  check(cudaHostRegister(staging, sizeof staging, cudaHostRegisterDefault), "cudaHostRegister");

  print_header(base_name(argv[0]), args, __FILE__, kLeakLineBase + static_cast<int>(leak_api), args.leak_bytes,
               marker != nullptr);
  size_t total = 0;
  print_value("FREE_START", device0_free(&total));
  print_value("TOTAL", total);

  for (long step = 1; step <= args.steps; ++step) {
    forward_pass(res, step);
    load_batch();
    replica_step(res);
    if (args.leak_bytes > 0) plant_device_leak(leak_api, args.leak_bytes, res);
    end_step(marker, step);
  }
  check(cudaStreamSynchronize(res.stream), "cudaStreamSynchronize");
  print_value("FREE_END", device0_free());

  if (mode_is(args, "oom")) {
    const size_t request = total + 2 * kMiB;
    void* p = nullptr;
    const cudaError_t error = cudaMalloc(&p, request);
    std::printf("OOM_REQUESTED=%zu\nOOM_ERROR=%d\nOOM_ERROR_NAME=%s\n", request, static_cast<int>(error),
                cudaGetErrorName(error));
    std::fflush(stdout);
    if (error == cudaErrorMemoryAllocation) return kOomExitCode;
    return 1;
  }
  check(cudaHostUnregister(staging), "cudaHostUnregister");
  std::printf("DONE steps=%ld\n", args.steps);
  return 0;
}
