// A training-like loop on the CUDA driver API, linked against libcuda.so.1
// the plain way: cuda.h maps cuMemAlloc to cuMemAlloc_v2 and so on, and the
// calls go through the PLT.
//
// Each step allocates and frees, within the step: cuMemAlloc (three sizes),
// cuMemAllocPitch, cuMemAllocManaged, cuMemHostAlloc and cuMemAllocHost,
// cuMemAllocAsync on a stream, and a cuMemAlloc on device 1 in a context of
// its own (cuCtxCreate, pushed and popped) when there is one; then leaks
// exactly LEAK_BYTES in plant_device_leak, with the API the mode names:
//   normal  cuMemAlloc      async  cuMemAllocAsync      managed  cuMemAllocManaged
//   oom     cuMemAlloc, and after the steps asks for more than device 0 has.
// Output format: program_common.h.

#include <cuda.h>

#include "program_common.h"

using namespace simcuda_programs;

namespace {

const char* const kModes[] = {"normal", "async", "managed", "oom", nullptr};

void check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  cuGetErrorName(result, &name);
  std::fprintf(stderr, "FATAL %s: %d %s\n", what, static_cast<int>(result), name ? name : "?");
  std::exit(1);
}

struct Resources {
  CUstream stream = nullptr;
  CUcontext replica = nullptr;  // device 1, or nullptr
};

enum class LeakApi { kMalloc, kAsync, kManaged };

// The planted leak. Each API's call is on the line kLeakLineBase + its enum
// value names, and carries the "PLANTED LEAK" comment (the tests check).
constexpr int kLeakLineBase = __LINE__ + 6;
__attribute__((noinline, noipa)) CUdeviceptr plant_device_leak(LeakApi api, size_t bytes, const Resources& res) {
  CUdeviceptr p = 0;
  CUresult result = CUDA_SUCCESS;
  switch (api) {
    // clang-format off
    case LeakApi::kMalloc: result = cuMemAlloc(&p, bytes); break;  // PLANTED LEAK cuMemAlloc
    case LeakApi::kAsync: result = cuMemAllocAsync(&p, bytes, res.stream); break;  // PLANTED LEAK cuMemAllocAsync
    case LeakApi::kManaged: result = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL); break;  // PLANTED LEAK cuMemAllocManaged
      // clang-format on
  }
  check(result, "plant_device_leak");
  return p;
}

__attribute__((noinline)) void forward_pass(const Resources& res, long step) {
  const size_t sizes[] = {1 * kMiB, 3 * kMiB + 5, 64 * 1024 + static_cast<size_t>(step % 7) * 256};
  CUdeviceptr blocks[3] = {};
  for (int i = 0; i < 3; ++i) check(cuMemAlloc(&blocks[i], sizes[i]), "cuMemAlloc");
  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  check(cuMemAllocPitch(&pitched, &pitch, 1000, 300, 4), "cuMemAllocPitch");
  CUdeviceptr async_block = 0;
  check(cuMemAllocAsync(&async_block, 5 * kMiB, res.stream), "cuMemAllocAsync");
  for (CUdeviceptr p : blocks) check(cuMemFree(p), "cuMemFree");
  check(cuMemFree(pitched), "cuMemFree");
  check(cuMemFreeAsync(async_block, res.stream), "cuMemFreeAsync");
  check(cuStreamSynchronize(res.stream), "cuStreamSynchronize");
}

__attribute__((noinline)) void load_batch() {
  void* pinned = nullptr;
  check(cuMemHostAlloc(&pinned, 256 * 1024, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
  touch(pinned, 256 * 1024);
  void* staging = nullptr;
  check(cuMemAllocHost(&staging, 64 * 1024), "cuMemAllocHost");
  CUdeviceptr managed = 0;
  check(cuMemAllocManaged(&managed, 512 * 1024, CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged");
  touch(reinterpret_cast<void*>(managed), 512 * 1024);
  check(cuMemFree(managed), "cuMemFree");
  check(cuMemFreeHost(staging), "cuMemFreeHost");
  check(cuMemFreeHost(pinned), "cuMemFreeHost");
}

__attribute__((noinline)) void replica_step(const Resources& res) {
  if (res.replica == nullptr) return;
  check(cuCtxPushCurrent(res.replica), "cuCtxPushCurrent");
  CUdeviceptr p = 0;
  check(cuMemAlloc(&p, 2 * kMiB), "cuMemAlloc");
  check(cuMemFree(p), "cuMemFree");
  CUcontext popped = nullptr;
  check(cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
}

size_t device0_free(size_t* total = nullptr) {
  size_t free = 0;
  size_t all = 0;
  check(cuMemGetInfo(&free, &all), "cuMemGetInfo");
  if (total) *total = all;
  return free;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, kModes);
  const LeakApi leak_api = mode_is(args, "async")     ? LeakApi::kAsync
                           : mode_is(args, "managed") ? LeakApi::kManaged
                                                      : LeakApi::kMalloc;
  const StepFn marker = find_step_marker();

  check(cuInit(0), "cuInit");
  int count = 0;
  check(cuDeviceGetCount(&count), "cuDeviceGetCount");
  CUdevice device = 0;
  check(cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext primary = nullptr;
  check(cuDevicePrimaryCtxRetain(&primary, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(primary), "cuCtxSetCurrent");
  Resources res;
  check(cuStreamCreate(&res.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  if (count > 1) {
    CUdevice second = 0;
    check(cuDeviceGet(&second, 1), "cuDeviceGet");
    check(cuCtxCreate(&res.replica, nullptr, 0, second), "cuCtxCreate");  // made current: pop it
    CUcontext popped = nullptr;
    check(cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
  }

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
  check(cuStreamSynchronize(res.stream), "cuStreamSynchronize");
  print_value("FREE_END", device0_free());

  if (mode_is(args, "oom")) {
    const size_t request = total + 2 * kMiB;
    CUdeviceptr p = 0;
    const CUresult result = cuMemAlloc(&p, request);
    const char* name = nullptr;
    cuGetErrorName(result, &name);
    std::printf("OOM_REQUESTED=%zu\nOOM_ERROR=%d\nOOM_ERROR_NAME=%s\n", request, static_cast<int>(result),
                name ? name : "?");
    std::fflush(stdout);
    return result == CUDA_ERROR_OUT_OF_MEMORY ? kOomExitCode : 1;
  }
  if (res.replica) check(cuCtxDestroy(res.replica), "cuCtxDestroy");
  check(cuStreamDestroy(res.stream), "cuStreamDestroy");
  std::printf("DONE steps=%ld\n", args.steps);
  return 0;
}
