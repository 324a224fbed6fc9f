#include "virtual_memory.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>

namespace memledger::simcuda {
namespace {

constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kHostPage = 4096;
constexpr size_t kHostStoreSpan = 64 * kGiB;  // sparse: costs what is used

bool power_of_two(size_t value) { return value != 0 && (value & (value - 1)) == 0; }

// Puts a fresh PROT_NONE reservation back over [addr, addr + size).
void restore_reservation(uintptr_t addr, size_t size) {
  mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
       -1, 0);
}

}  // namespace

void PhysicalStore::init(size_t span, const char* name) {
  offsets_ = AddressRange(0, span);
  fd_ = memfd_create(name, MFD_CLOEXEC);
  if (fd_ >= 0 && ftruncate(fd_, static_cast<off_t>(span)) != 0) {
    close(fd_);
    fd_ = -1;
  }
}

std::optional<size_t> PhysicalStore::allocate(size_t bytes) {
  std::optional<uintptr_t> offset = offsets_.allocate(bytes, kGranularity);
  if (!offset) return std::nullopt;
  return static_cast<size_t>(*offset);
}

void PhysicalStore::release(size_t offset, size_t bytes) {
  if (fd_ >= 0) {
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
              static_cast<off_t>(bytes));
  }
  offsets_.release(offset, bytes);
}

void VirtualMemory::init(Device* devices, int device_count) {
  devices_ = devices;
  device_count_ = device_count;
  size_t total = 0;
  for (int i = 0; i < device_count; ++i) total += devices[i].capacity();
  // PyTorch reserves about 1.125x a GPU's memory per segment; leave room
  // for several such segments on every device.
  region_size_ = std::max(16 * kGiB, 8 * total);
}

bool VirtualMemory::ensure_region() {
  if (!region_.empty()) return true;
  // Halved until the system agrees (valgrind refuses 64 GiB, for one).
  for (size_t size = region_size_; size >= kGiB; size /= 2) {
    if (const uintptr_t base = reserve_address_space(size)) {
      region_ = AddressRange(base, size);
      return true;
    }
  }
  return false;
}

PhysicalStore& VirtualMemory::store_for(Device* device) {
  const int index = device ? device->ordinal() : kMaxDevices;
  PhysicalStore& store = stores_[index];
  if (!store.ready()) {
    char name[32];
    if (device) {
      std::snprintf(name, sizeof name, "simcuda-device%d", index);
      // Twice the capacity: room for offset fragmentation.
      store.init(2 * device->capacity(), name);
    } else {
      store.init(kHostStoreSpan, "simcuda-host");
    }
  }
  return store;
}

CUresult VirtualMemory::reserve(size_t size, size_t alignment, uintptr_t hint, uintptr_t* out) {
  if (size == 0 || size % kHostPage != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && !power_of_two(alignment)) return CUDA_ERROR_INVALID_VALUE;
  if (!ensure_region()) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t span = round_up(size, kGranularity);
  // The hint is only a hint: honoured when that range is free.
  if (hint != 0 && hint % std::max(alignment, kGranularity) == 0 && region_.allocate_at(hint, span)) {
    *out = hint;
  } else {
    std::optional<uintptr_t> addr = region_.allocate(span, std::max(alignment, kGranularity));
    if (!addr) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = *addr;
  }
  reservations_.emplace(*out, Reservation{size, span});
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::free_reservation(uintptr_t addr, size_t size) {
  auto it = reservations_.find(addr);
  if (it == reservations_.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  // Still-mapped memory inside is refused rather than silently unmapped, so
  // that a tracer test sees the program's mistake (see README.md).
  auto mapped = mappings_.lower_bound(addr);
  if (mapped != mappings_.end() && mapped->first < addr + it->second.span) return CUDA_ERROR_INVALID_VALUE;
  region_.release(addr, it->second.span);
  reservations_.erase(it);
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::create(size_t size, const CUmemAllocationProp& prop, Device* device,
                               CUmemGenericAllocationHandle* out) {
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (device && !device->hold(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  PhysicalStore& store = store_for(device);
  std::optional<size_t> offset = store.allocate(size);
  if (!offset) {
    if (device) device->unhold(size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUmemGenericAllocationHandle handle = next_handle_++;
  handles_.emplace(handle, Handle{device, size, *offset, 1, 0, prop, false});
  *out = handle;
  return CUDA_SUCCESS;
}

void VirtualMemory::free_if_unused(InternalMap<CUmemGenericAllocationHandle, Handle>::iterator it) {
  Handle& h = it->second;
  if (h.refs > 0 || h.mappings > 0) return;
  if (!h.multicast) {
    store_for(h.device).release(h.offset, h.size);
    if (h.device) h.device->unhold(h.size);
  }
  for (auto e = exported_.begin(); e != exported_.end();) {
    e = e->second == it->first ? exported_.erase(e) : std::next(e);
  }
  handles_.erase(it);
}

CUresult VirtualMemory::release(CUmemGenericAllocationHandle handle) {
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  --it->second.refs;
  free_if_unused(it);
  return CUDA_SUCCESS;
}

const VirtualMemory::Reservation* VirtualMemory::reservation_containing(uintptr_t addr, size_t size) const {
  auto it = reservations_.upper_bound(addr);
  if (it == reservations_.begin()) return nullptr;
  --it;
  if (addr - it->first > it->second.span || it->second.span - (addr - it->first) < size) return nullptr;
  return &it->second;
}

CUresult VirtualMemory::map(uintptr_t addr, size_t size, CUmemGenericAllocationHandle handle) {
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  Handle& h = it->second;
  if (size == 0 || size % kGranularity != 0 || addr % kGranularity != 0 || size > h.size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (reservation_containing(addr, size) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Only unmapped parts of a reservation can be mapped.
  auto next = mappings_.lower_bound(addr);
  if (next != mappings_.end() && next->first < addr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > addr) return CUDA_ERROR_INVALID_VALUE;
  }
  // No access until cuMemSetAccess, as on the real driver.
  const PhysicalStore& store = store_for(h.device);
  void* wanted = reinterpret_cast<void*>(addr);
  void* got = store.fd() >= 0
                  ? mmap(wanted, size, PROT_NONE, MAP_SHARED | MAP_FIXED, store.fd(), static_cast<off_t>(h.offset))
                  : mmap(wanted, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (got == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  ++h.mappings;
  mappings_.emplace(addr, Mapping{size, handle});
  return CUDA_SUCCESS;
}

bool VirtualMemory::whole_mappings(uintptr_t addr, size_t size) const {
  if (size == 0) return false;
  uintptr_t cursor = addr;
  auto it = mappings_.find(addr);
  while (cursor < addr + size) {
    if (it == mappings_.end() || it->first != cursor) return false;
    cursor += it->second.size;
    ++it;
  }
  return cursor == addr + size;
}

CUresult VirtualMemory::unmap(uintptr_t addr, size_t size) {
  // Whole mappings only: the real driver cannot unmap part of one.
  if (!whole_mappings(addr, size)) return CUDA_ERROR_INVALID_VALUE;
  auto it = mappings_.find(addr);
  while (it != mappings_.end() && it->first < addr + size) {
    restore_reservation(it->first, it->second.size);
    auto handle = handles_.find(it->second.handle);
    it = mappings_.erase(it);
    --handle->second.mappings;
    free_if_unused(handle);
  }
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::set_access(uintptr_t addr, size_t size, int prot) {
  if (!whole_mappings(addr, size)) return CUDA_ERROR_INVALID_VALUE;
  if (mprotect(reinterpret_cast<void*>(addr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

std::optional<VirtualMemory::MappingInfo> VirtualMemory::find_mapping(uintptr_t addr) const {
  auto it = mappings_.upper_bound(addr);
  if (it == mappings_.begin()) return std::nullopt;
  --it;
  if (addr - it->first >= it->second.size) return std::nullopt;
  const Handle& h = handles_.at(it->second.handle);
  return MappingInfo{it->first, it->second.size, h.device, it->second.handle};
}

CUresult VirtualMemory::retain(uintptr_t addr, CUmemGenericAllocationHandle* out) {
  std::optional<MappingInfo> mapping = find_mapping(addr);
  if (!mapping) return CUDA_ERROR_INVALID_VALUE;
  ++handles_.at(mapping->handle).refs;
  *out = mapping->handle;
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::properties(CUmemGenericAllocationHandle handle, CUmemAllocationProp* out) const {
  auto it = handles_.find(handle);
  if (it == handles_.end()) return CUDA_ERROR_INVALID_VALUE;
  *out = it->second.prop;
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::export_fd(CUmemGenericAllocationHandle handle, int* fd) {
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  // Only the types the allocation asked for (CUmemAllocationProp::requestedHandleTypes).
  if (!it->second.multicast && (it->second.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int made = eventfd(0, EFD_CLOEXEC);
  if (made < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  exported_[made] = handle;
  *fd = made;
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::import_fd(int fd, CUmemGenericAllocationHandle* out) {
  auto it = exported_.find(fd);
  if (it == exported_.end()) return CUDA_ERROR_INVALID_VALUE;
  auto handle = handles_.find(it->second);
  if (handle == handles_.end()) return CUDA_ERROR_INVALID_VALUE;
  ++handle->second.refs;
  *out = handle->first;
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::create_multicast(size_t size, CUmemGenericAllocationHandle* out) {
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  const CUmemGenericAllocationHandle handle = next_handle_++;
  CUmemAllocationProp prop{};
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  handles_.emplace(handle, Handle{nullptr, size, 0, 1, 0, prop, true});
  *out = handle;
  return CUDA_SUCCESS;
}

}  // namespace memledger::simcuda
