// Exported entry points: linear device memory (cuMemAlloc, pitched, managed),
// page-locked host memory, host registration and pointer queries.

#include <sys/mman.h>

#include <algorithm>
#include <iterator>
#include <limits>

#include "driver_state.h"

using namespace memledger::simcuda;

namespace {

// SIMCUDA_CRASH_IN_ALLOC: a store to an unmapped page from inside the
// driver, as a driver bug (or a driver that does not fit its runtime)
// faults, so that tools see a SIGSEGV whose stack starts in libcuda.
__attribute__((noinline)) void fault_inside_driver() {
  static volatile uintptr_t unmapped = 16;
  *reinterpret_cast<volatile int*>(unmapped) = 1;
}

constexpr size_t kPitchAlignment = 512;
constexpr size_t kHostPage = 4096;

// What cuMemAlloc, cuMemAllocPitch and cuMemAllocManaged share: the bytes
// rounded up to the granularity count against the current context's device.
CUresult alloc_linear(Call& call, size_t bytes, BlockKind kind, bool low32, uintptr_t* out) {
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > std::numeric_limits<size_t>::max() - kGranularity) return CUDA_ERROR_OUT_OF_MEMORY;
  State& st = call.st;
  Device& device = *ctx->device;
  const size_t held = round_up(bytes, kGranularity);
  if (!device.hold(held)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::optional<uintptr_t> addr;
  if (low32) {
    addr = st.low32.allocate(held, kGranularity);
    if (addr && !make_accessible(*addr, held)) {
      st.low32.release(*addr, held);
      addr.reset();
    }
  } else {
    addr = device.map_linear(held);
  }
  if (!addr) {
    device.unhold(held);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  st.blocks.emplace(*addr, Block{bytes, held, &device, ctx, nullptr, kind, low32});
  *out = *addr;
  return CUDA_SUCCESS;
}

CUresult alloc_pitch(Call& call, size_t width, size_t height, unsigned int element_size, bool low32,
                     uintptr_t* out, size_t* pitch) {
  if (CUresult r = call.initialized()) return r;
  if (width == 0 || height == 0 || (element_size != 4 && element_size != 8 && element_size != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t row = round_up(width, kPitchAlignment);
  if (row < width || height > std::numeric_limits<size_t>::max() / row) return CUDA_ERROR_OUT_OF_MEMORY;
  if (CUresult r = alloc_linear(call, row * height, BlockKind::kPitch, low32, out)) return r;
  *pitch = row;
  return CUDA_SUCCESS;
}

CUresult free_linear(Call& call, CUdeviceptr dptr) {
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  return free_block(call.st, dptr);
}

CUresult memory_info(Call& call, size_t* free, size_t* total) {
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *total = ctx->device->capacity();
  *free = ctx->device->capacity() - ctx->device->held();
  return CUDA_SUCCESS;
}

// The allocation that contains addr: a device block, else a VMM mapping.
CUresult address_range(Call& call, CUdeviceptr dptr, uintptr_t* base, size_t* size) {
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  const State& st = call.st;
  auto it = st.blocks.upper_bound(dptr);
  if (it != st.blocks.begin()) {
    --it;
    if (dptr - it->first < it->second.size) {
      *base = it->first;
      *size = it->second.size;
      return CUDA_SUCCESS;
    }
  }
  if (auto mapping = st.vmm.find_mapping(dptr)) {
    *base = mapping->base;
    *size = mapping->size;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_FOUND;
}

// Page-locked host memory is real host memory from mmap (never malloc: a
// tracer must not see it twice, once as a pinned block and once as heap).
// It is not locked: the simulator must not need RLIMIT_MEMLOCK.
CUresult host_alloc(Call& call, void** pp, size_t bytes, unsigned int flags) {
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (bytes > std::numeric_limits<size_t>::max() - kHostPage) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t mapped = round_up(bytes, kHostPage);
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  call.st.host_blocks.emplace(reinterpret_cast<uintptr_t>(p), HostBlock{bytes, mapped, ctx, flags});
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult host_register(Call& call, void* p, size_t bytes, unsigned int flags) {
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  if (p == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  constexpr unsigned int kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                  CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  const auto start = reinterpret_cast<uintptr_t>(p);
  auto& registered = call.st.registered;
  auto next = registered.lower_bound(start);
  if (next != registered.end() && next->first < start + bytes) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (next != registered.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > start) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  registered.emplace(start, bytes);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (config().crash_in_alloc) fault_inside_driver();
  Call call(Sym::cuMemAlloc_v2);
  if (CUresult r = call.initialized()) return r;
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t addr = 0;
  if (CUresult r = alloc_linear(call, bytesize, BlockKind::kLinear, false, &addr)) return r;
  *dptr = addr;
  return CUDA_SUCCESS;
}

// CUDA 2.x ABI: 32-bit device pointers, served from a window below 4 GiB.
CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  Call call(Sym::cuMemAlloc);
  if (CUresult r = call.initialized()) return r;
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t addr = 0;
  if (CUresult r = alloc_linear(call, bytesize, BlockKind::kLinear, true, &addr)) return r;
  *dptr = static_cast<CUdeviceptr_v1>(addr);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
  Call call(Sym::cuMemAllocPitch_v2);
  if (CUresult r = call.initialized()) return r;
  if (dptr == nullptr || pPitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t addr = 0;
  size_t pitch = 0;
  if (CUresult r = alloc_pitch(call, WidthInBytes, Height, ElementSizeBytes, false, &addr, &pitch)) return r;
  *dptr = addr;
  *pPitch = pitch;
  return CUDA_SUCCESS;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes) {
  Call call(Sym::cuMemAllocPitch);
  if (CUresult r = call.initialized()) return r;
  if (dptr == nullptr || pPitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t addr = 0;
  size_t pitch = 0;
  if (CUresult r = alloc_pitch(call, WidthInBytes, Height, ElementSizeBytes, true, &addr, &pitch)) return r;
  *dptr = static_cast<CUdeviceptr_v1>(addr);
  *pPitch = static_cast<unsigned int>(pitch);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  Call call(Sym::cuMemAllocManaged);
  if (CUresult r = call.initialized()) return r;
  if (dptr == nullptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Counted against the device at once (the real driver migrates pages on
  // demand; counting up front is what a tracer's "held" needs to compare).
  uintptr_t addr = 0;
  if (CUresult r = alloc_linear(call, bytesize, BlockKind::kManaged, false, &addr)) return r;
  *dptr = addr;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  Call call(Sym::cuMemFree_v2);
  return free_linear(call, dptr);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr) {
  Call call(Sym::cuMemFree);
  return free_linear(call, dptr);
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  Call call(Sym::cuMemGetInfo_v2);
  return memory_info(call, free, total);
}

CUresult cuMemGetInfo(unsigned int* free, unsigned int* total) {
  Call call(Sym::cuMemGetInfo);
  size_t free64 = 0;
  size_t total64 = 0;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = memory_info(call, &free64, &total64)) return r;
  *free = static_cast<unsigned int>(std::min<size_t>(free64, 0xffffffffu));
  *total = static_cast<unsigned int>(std::min<size_t>(total64, 0xffffffffu));
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  Call call(Sym::cuMemGetAddressRange_v2);
  uintptr_t base = 0;
  size_t size = 0;
  if (CUresult r = address_range(call, dptr, &base, &size)) return r;
  if (pbase != nullptr) *pbase = base;
  if (psize != nullptr) *psize = size;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr_v1* pbase, unsigned int* psize, CUdeviceptr_v1 dptr) {
  Call call(Sym::cuMemGetAddressRange);
  uintptr_t base = 0;
  size_t size = 0;
  if (CUresult r = address_range(call, dptr, &base, &size)) return r;
  if (pbase != nullptr) *pbase = static_cast<CUdeviceptr_v1>(base);
  if (psize != nullptr) *psize = static_cast<unsigned int>(std::min<size_t>(size, 0xffffffffu));
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  Call call(Sym::cuMemAllocHost_v2);
  return host_alloc(call, pp, bytesize, 0);
}

CUresult cuMemAllocHost(void** pp, unsigned int bytesize) {
  Call call(Sym::cuMemAllocHost);
  return host_alloc(call, pp, bytesize, 0);
}

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  Call call(Sym::cuMemHostAlloc);
  return host_alloc(call, pp, bytesize, Flags);
}

CUresult cuMemFreeHost(void* p) {
  Call call(Sym::cuMemFreeHost);
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  auto it = call.st.host_blocks.find(reinterpret_cast<uintptr_t>(p));
  if (it == call.st.host_blocks.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.mapped);
  call.st.host_blocks.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  Call call(Sym::cuMemHostRegister_v2);
  return host_register(call, p, bytesize, Flags);
}

CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  Call call(Sym::cuMemHostRegister);
  return host_register(call, p, bytesize, Flags);
}

CUresult cuMemHostUnregister(void* p) {
  Call call(Sym::cuMemHostUnregister);
  Context* ctx = nullptr;
  if (CUresult r = call.current(&ctx)) return r;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (call.st.registered.erase(reinterpret_cast<uintptr_t>(p)) == 0) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  return CUDA_SUCCESS;
}

namespace {

// What cuPointerGetAttribute knows about an address.
struct PointerInfo {
  uintptr_t base = 0;
  size_t size = 0;
  Context* context = nullptr;
  int device = CU_DEVICE_CPU;
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  bool managed = false;
  MemPool* pool = nullptr;
};

template <class Map>
auto containing(const Map& map, uintptr_t addr) {
  auto it = map.upper_bound(addr);
  if (it == map.begin()) return map.end();
  --it;
  return it;
}

bool describe_pointer(const State& st, uintptr_t addr, PointerInfo* info) {
  if (auto it = containing(st.blocks, addr); it != st.blocks.end() && addr - it->first < it->second.size) {
    const Block& b = it->second;
    *info = {it->first, b.size, b.context, b.device->ordinal(), CU_MEMORYTYPE_DEVICE, b.kind == BlockKind::kManaged,
             b.pool};
    if (b.context == nullptr) info->context = &b.device->primary;
    return true;
  }
  if (auto it = containing(st.host_blocks, addr); it != st.host_blocks.end() && addr - it->first < it->second.size) {
    const HostBlock& h = it->second;
    *info = {it->first, h.size, h.context, h.context->device->ordinal(), CU_MEMORYTYPE_HOST, false, nullptr};
    return true;
  }
  if (auto it = containing(st.registered, addr); it != st.registered.end() && addr - it->first < it->second) {
    *info = {it->first, it->second, current_context(), CU_DEVICE_CPU, CU_MEMORYTYPE_HOST, false, nullptr};
    if (info->context) info->device = info->context->device->ordinal();
    return true;
  }
  if (auto mapping = st.vmm.find_mapping(addr)) {
    const bool on_device = mapping->device != nullptr;
    *info = {mapping->base, mapping->size, nullptr, on_device ? mapping->device->ordinal() : CU_DEVICE_CPU,
             on_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST, false, nullptr};
    return true;
  }
  return false;
}

}  // namespace

// The attributes a tracer uses to place a pointer; others are NOT_SUPPORTED.
CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  Call call(Sym::cuPointerGetAttribute);
  if (CUresult r = call.initialized()) return r;
  PointerInfo info;
  if (data == nullptr || !describe_pointer(call.st, ptr, &info)) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = to_handle(info.context);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) = info.type;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (info.type != CU_MEMORYTYPE_HOST && !info.managed) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<bool*>(data) = info.managed;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = info.device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = info.base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = info.size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<CUmemoryPool*>(data) = to_handle(info.pool);
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}
