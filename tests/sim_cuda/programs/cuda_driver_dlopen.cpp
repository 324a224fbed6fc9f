// A training-like loop that reaches the driver the TensorFlow/XLA way:
// dlopen("libcuda.so.1") and dlsym of each function by its versioned name,
// so no call goes through a PLT entry a preloaded tracer could bind.
//
// Set-up: one large cuMemAlloc_v2 arena held for the whole run (a BFC
// allocator's region), an explicit memory pool that keeps freed memory
// (release threshold UINT64_MAX, as TF_GPU_ALLOCATOR=cuda_malloc_async
// sets), and 1 GiB of reserved address space for PyTorch-style expandable
// segments. Each step allocates and frees, within the step: cuMemAlloc_v2
// (two sizes), three pool blocks (cuMemAllocFromPoolAsync/cuMemFreeAsync)
// and one VMM chunk (create, map, set access, unmap, release); then leaks in
// plant_device_leak, with the API the mode names:
//   normal  cuMemAlloc_v2 of LEAK_BYTES
//   pool    cuMemAllocFromPoolAsync of LEAK_BYTES
//   vmm     the expandable segment grows: LEAK_BYTES rounded up to whole
//           2 MiB chunks (at least one) are created and mapped, never unmapped
//   nccl    as vmm, but each chunk's handle is released once mapped (the
//           mapping keeps the memory), after a retain/release pair (NCCL's
//           handle query) and an export/import/release; each step also
//           frees a buffer as NCCL's ncclCuMemFree does (retain, release,
//           unmap, release, address free) and makes and releases a
//           multicast object
//   oom     cuMemAlloc_v2, and after the steps asks for more than device 0 has.
// Output format: program_common.h.

#include <cudaTypedefs.h>

#include <unistd.h>

#include <cstdint>

#include "program_common.h"

using namespace simcuda_programs;

namespace {

const char* const kModes[] = {"normal", "pool", "vmm", "nccl", "oom", nullptr};

// X(exported name, typedef of that ABI)
#define DRIVER_FUNCTIONS(X)                                                  \
  X(cuInit, PFN_cuInit_v2000)                                                \
  X(cuGetErrorName, PFN_cuGetErrorName_v6000)                                \
  X(cuDeviceGet, PFN_cuDeviceGet_v2000)                                      \
  X(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000)            \
  X(cuDevicePrimaryCtxRelease_v2, PFN_cuDevicePrimaryCtxRelease_v11000)      \
  X(cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000)                              \
  X(cuStreamCreate, PFN_cuStreamCreate_v2000)                                \
  X(cuStreamSynchronize, PFN_cuStreamSynchronize_v2000)                      \
  X(cuStreamDestroy_v2, PFN_cuStreamDestroy_v4000)                           \
  X(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020)                                 \
  X(cuMemAlloc_v2, PFN_cuMemAlloc_v3020)                                     \
  X(cuMemFree_v2, PFN_cuMemFree_v3020)                                       \
  X(cuMemPoolCreate, PFN_cuMemPoolCreate_v11020)                             \
  X(cuMemPoolSetAttribute, PFN_cuMemPoolSetAttribute_v11020)                 \
  X(cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020)             \
  X(cuMemFreeAsync, PFN_cuMemFreeAsync_v11020)                               \
  X(cuMemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020) \
  X(cuMemAddressReserve, PFN_cuMemAddressReserve_v10020)                     \
  X(cuMemAddressFree, PFN_cuMemAddressFree_v10020)                           \
  X(cuMemCreate, PFN_cuMemCreate_v10020)                                     \
  X(cuMemRelease, PFN_cuMemRelease_v10020)                                   \
  X(cuMemMap, PFN_cuMemMap_v10020)                                           \
  X(cuMemUnmap, PFN_cuMemUnmap_v10020)                                       \
  X(cuMemSetAccess, PFN_cuMemSetAccess_v10020)                               \
  X(cuMemRetainAllocationHandle, PFN_cuMemRetainAllocationHandle_v11000)     \
  X(cuMemGetAddressRange_v2, PFN_cuMemGetAddressRange_v3020)                 \
  X(cuMemExportToShareableHandle, PFN_cuMemExportToShareableHandle_v10020)   \
  X(cuMemImportFromShareableHandle, PFN_cuMemImportFromShareableHandle_v10020) \
  X(cuMulticastCreate, PFN_cuMulticastCreate_v12010)

struct Driver {
#define DRIVER_MEMBER(name, pfn) pfn name = nullptr;
  DRIVER_FUNCTIONS(DRIVER_MEMBER)
#undef DRIVER_MEMBER
};
Driver drv;

void load_driver() {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "FATAL dlopen libcuda.so.1: %s\n", dlerror());
    std::exit(1);
  }
#define DRIVER_RESOLVE(name, pfn)                                         \
  drv.name = reinterpret_cast<pfn>(dlsym(library, #name));                \
  if (drv.name == nullptr) {                                              \
    std::fprintf(stderr, "FATAL dlsym %s: %s\n", #name, dlerror());       \
    std::exit(1);                                                         \
  }
  DRIVER_FUNCTIONS(DRIVER_RESOLVE)
#undef DRIVER_RESOLVE
}

void check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  drv.cuGetErrorName(result, &name);
  std::fprintf(stderr, "FATAL %s: %d %s\n", what, static_cast<int>(result), name ? name : "?");
  std::exit(1);
}

constexpr size_t kReserve = size_t{1} << 30;

// An expandable segment: a reservation that grows by mapped chunks.
struct Segment {
  CUdeviceptr base = 0;
  size_t chunk = 0;
  size_t mapped = 0;  // bytes mapped from base, never unmapped (the leak)
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
};

struct Resources {
  CUstream stream = nullptr;
  CUmemoryPool pool = nullptr;
  Segment segment;
};

// Maps handles of one chunk each at `where`, accessible from device 0.
void map_chunks(const Segment& seg, CUdeviceptr where, size_t count, const CUmemGenericAllocationHandle* handles) {
  for (size_t i = 0; i < count; ++i) {
    check(drv.cuMemMap(where + i * seg.chunk, seg.chunk, 0, handles[i], 0), "cuMemMap");
    check(drv.cuMemSetAccess(where + i * seg.chunk, seg.chunk, &seg.access, 1), "cuMemSetAccess");
  }
}

enum class LeakApi { kMalloc, kPool, kVmm, kNccl };

// The planted leak. Each API's call is on the line kLeakLineBase + its enum
// value names, and carries the "PLANTED LEAK" comment (the tests check). In
// mode vmm that is the cuMemCreate of the chunks (physical memory is what a
// tracer counts); they are mapped after the segment's end and never unmapped.
constexpr int kLeakLineBase = __LINE__ + 7;
__attribute__((noinline, noipa)) void plant_device_leak(LeakApi api, size_t bytes, Resources& res) {
  CUdeviceptr p = 0;
  Segment& seg = res.segment;
  CUmemGenericAllocationHandle handles[512];
  switch (api) {
    // clang-format off
    case LeakApi::kMalloc: check(drv.cuMemAlloc_v2(&p, bytes), "cuMemAlloc_v2"); break;  // PLANTED LEAK cuMemAlloc_v2
    case LeakApi::kPool: check(drv.cuMemAllocFromPoolAsync(&p, bytes, res.pool, res.stream), "cuMemAllocFromPoolAsync"); break;  // PLANTED LEAK cuMemAllocFromPoolAsync
    case LeakApi::kVmm: for (size_t i = 0; i < bytes / seg.chunk; ++i) check(drv.cuMemCreate(&handles[i], seg.chunk, &seg.prop, 0), "cuMemCreate"); break;  // PLANTED LEAK cuMemCreate
    case LeakApi::kNccl: for (size_t i = 0; i < bytes / seg.chunk; ++i) check(drv.cuMemCreate(&handles[i], seg.chunk, &seg.prop, 0), "cuMemCreate"); break;  // PLANTED LEAK cuMemCreate
      // clang-format on
  }
  if (api == LeakApi::kVmm || api == LeakApi::kNccl) {
    map_chunks(seg, seg.base + seg.mapped, bytes / seg.chunk, handles);
    seg.mapped += bytes;
  }
  if (api != LeakApi::kNccl) return;
  for (size_t i = 0; i < bytes / seg.chunk; ++i) {
    const CUdeviceptr at = seg.base + seg.mapped - bytes + i * seg.chunk;
    CUmemGenericAllocationHandle queried = 0;
    check(drv.cuMemRetainAllocationHandle(&queried, reinterpret_cast<void*>(at)), "cuMemRetainAllocationHandle");
    check(drv.cuMemRelease(queried), "cuMemRelease");
    int fd = -1;
    check(drv.cuMemExportToShareableHandle(&fd, handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle");
    CUmemGenericAllocationHandle imported = 0;
    check(drv.cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle");
    check(drv.cuMemRelease(imported), "cuMemRelease");
    close(fd);
    // Mapped memory outlives its handle.
    check(drv.cuMemRelease(handles[i]), "cuMemRelease");
  }
}

// NCCL's buffers (src/include/alloc.h): ncclCuMemAlloc creates, reserves,
// maps and keeps the handle; ncclCuMemFree retains it again from the
// address, releases, unmaps, releases and frees the address range.
void nccl_buffer_round_trip(const Segment& seg) {
  CUmemGenericAllocationHandle handle = 0;
  check(drv.cuMemCreate(&handle, seg.chunk, &seg.prop, 0), "cuMemCreate");
  CUdeviceptr ptr = 0;
  check(drv.cuMemAddressReserve(&ptr, seg.chunk, seg.chunk, 0, 0), "cuMemAddressReserve");
  map_chunks(seg, ptr, 1, &handle);
  touch(reinterpret_cast<void*>(ptr), seg.chunk);
  CUmemGenericAllocationHandle again = 0;
  check(drv.cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(ptr)), "cuMemRetainAllocationHandle");
  check(drv.cuMemRelease(again), "cuMemRelease");
  size_t size = 0;
  check(drv.cuMemGetAddressRange_v2(nullptr, &size, ptr), "cuMemGetAddressRange_v2");
  check(drv.cuMemUnmap(ptr, size), "cuMemUnmap");
  check(drv.cuMemRelease(again), "cuMemRelease");
  check(drv.cuMemAddressFree(ptr, size), "cuMemAddressFree");
  // A multicast object (NVLS) holds no memory of its own.
  CUmulticastObjectProp mc{};
  mc.numDevices = 1;
  mc.size = seg.chunk;
  mc.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle multicast = 0;
  check(drv.cuMulticastCreate(&multicast, &mc), "cuMulticastCreate");
  check(drv.cuMemRelease(multicast), "cuMemRelease");
}

__attribute__((noinline)) void forward_pass(Resources& res, long step, bool nccl) {
  if (nccl) nccl_buffer_round_trip(res.segment);
  CUdeviceptr blocks[2] = {};
  check(drv.cuMemAlloc_v2(&blocks[0], 2 * kMiB), "cuMemAlloc_v2");
  check(drv.cuMemAlloc_v2(&blocks[1], 256 * 1024 + static_cast<size_t>(step % 5) * 512), "cuMemAlloc_v2");
  CUdeviceptr pooled[3] = {};
  const size_t pool_sizes[] = {6 * kMiB, 1 * kMiB, 100 * 1024};
  for (int i = 0; i < 3; ++i) {
    check(drv.cuMemAllocFromPoolAsync(&pooled[i], pool_sizes[i], res.pool, res.stream), "cuMemAllocFromPoolAsync");
  }
  // A transient chunk at the top of the reservation, unmapped again.
  const CUdeviceptr top = res.segment.base + kReserve - res.segment.chunk;
  CUmemGenericAllocationHandle handle = 0;
  check(drv.cuMemCreate(&handle, res.segment.chunk, &res.segment.prop, 0), "cuMemCreate");
  map_chunks(res.segment, top, 1, &handle);
  touch(reinterpret_cast<void*>(top), res.segment.chunk);
  check(drv.cuMemUnmap(top, res.segment.chunk), "cuMemUnmap");
  check(drv.cuMemRelease(handle), "cuMemRelease");
  for (CUdeviceptr p : pooled) check(drv.cuMemFreeAsync(p, res.stream), "cuMemFreeAsync");
  for (CUdeviceptr p : blocks) check(drv.cuMemFree_v2(p), "cuMemFree_v2");
  check(drv.cuStreamSynchronize(res.stream), "cuStreamSynchronize");
}

size_t device0_free(size_t* total = nullptr) {
  size_t free = 0;
  size_t all = 0;
  check(drv.cuMemGetInfo_v2(&free, &all), "cuMemGetInfo_v2");
  if (total) *total = all;
  return free;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, kModes);
  const LeakApi leak_api = mode_is(args, "pool") ? LeakApi::kPool
                           : mode_is(args, "vmm")  ? LeakApi::kVmm
                           : mode_is(args, "nccl") ? LeakApi::kNccl
                                                   : LeakApi::kMalloc;
  const StepFn marker = find_step_marker();
  load_driver();

  check(drv.cuInit(0), "cuInit");
  CUdevice device = 0;
  check(drv.cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext primary = nullptr;
  check(drv.cuDevicePrimaryCtxRetain(&primary, device), "cuDevicePrimaryCtxRetain");
  check(drv.cuCtxSetCurrent(primary), "cuCtxSetCurrent");

  Resources res;
  check(drv.cuStreamCreate(&res.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUdeviceptr arena = 0;
  check(drv.cuMemAlloc_v2(&arena, 64 * kMiB), "cuMemAlloc_v2");
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  check(drv.cuMemPoolCreate(&res.pool, &props), "cuMemPoolCreate");
  cuuint64_t threshold = UINT64_MAX;
  check(drv.cuMemPoolSetAttribute(res.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), "cuMemPoolSetAttribute");

  Segment& seg = res.segment;
  seg.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  seg.prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  if (leak_api == LeakApi::kNccl) seg.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  seg.access.location = seg.prop.location;
  seg.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(drv.cuMemGetAllocationGranularity(&seg.chunk, &seg.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity");
  check(drv.cuMemAddressReserve(&seg.base, kReserve, 0, 0, 0), "cuMemAddressReserve");

  size_t leak_per_step = args.leak_bytes;
  if (leak_api == LeakApi::kVmm || leak_api == LeakApi::kNccl) {
    const size_t chunks = args.leak_bytes == 0 ? 1 : (args.leak_bytes + seg.chunk - 1) / seg.chunk;
    leak_per_step = chunks * seg.chunk;
    // The transient chunk lives in the top chunk of the reservation.
    if (leak_per_step * static_cast<size_t>(args.steps) > kReserve - seg.chunk || chunks > 512) {
      std::fprintf(stderr, "%s: STEPS x LEAK_BYTES does not fit the 1 GiB segment\n", argv[0]);
      return 2;
    }
  }
  print_header(base_name(argv[0]), args, __FILE__, kLeakLineBase + static_cast<int>(leak_api), leak_per_step,
               marker != nullptr);
  size_t total = 0;
  print_value("FREE_START", device0_free(&total));
  print_value("TOTAL", total);

  for (long step = 1; step <= args.steps; ++step) {
    forward_pass(res, step, leak_api == LeakApi::kNccl);
    if (leak_per_step > 0) plant_device_leak(leak_api, leak_per_step, res);
    end_step(marker, step);
  }
  print_value("FREE_END", device0_free());

  if (mode_is(args, "oom")) {
    const size_t request = total + 2 * kMiB;
    CUdeviceptr p = 0;
    const CUresult result = drv.cuMemAlloc_v2(&p, request);
    const char* name = nullptr;
    drv.cuGetErrorName(result, &name);
    std::printf("OOM_REQUESTED=%zu\nOOM_ERROR=%d\nOOM_ERROR_NAME=%s\n", request, static_cast<int>(result),
                name ? name : "?");
    std::fflush(stdout);
    return result == CUDA_ERROR_OUT_OF_MEMORY ? kOomExitCode : 1;
  }
  check(drv.cuMemFree_v2(arena), "cuMemFree_v2");
  check(drv.cuStreamDestroy_v2(res.stream), "cuStreamDestroy_v2");
  std::printf("DONE steps=%ld\n", args.steps);
  return 0;
}
