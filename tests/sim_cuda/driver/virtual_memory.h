// The virtual memory management API (cuMemAddressReserve, cuMemCreate,
// cuMemMap, ...), as PyTorch's expandable segments use it: reserve a large
// address range once, then create and map granularity-sized chunks into it.
//
// Reservations come from one PROT_NONE region shared by all devices (virtual
// addresses are unified, as with UVA) and count nothing. Physical memory is
// counted at cuMemCreate against the device in the allocation's location
// (host locations count against no device). It lives in one sparse memfd per
// location, carved into handles, so that a handle mapped at two addresses
// shows the same bytes, as on the real driver. A handle's memory is freed
// when its last reference (cuMemCreate, cuMemRetainAllocationHandle,
// cuMemImportFromShareableHandle) is released and its last mapping is gone.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "address_range.h"
#include "device.h"
#include "internal_heap.h"

namespace memledger::simcuda {

// Physical memory of one location: a memfd and the offsets handed out in it.
// Without memfd (old kernels, seccomp), mappings fall back to anonymous
// memory, which only loses the sharing between two mappings of one handle.
class PhysicalStore {
 public:
  void init(size_t span, const char* name);
  bool ready() const { return !offsets_.empty(); }
  int fd() const { return fd_; }
  std::optional<size_t> allocate(size_t bytes);
  void release(size_t offset, size_t bytes);

 private:
  int fd_ = -1;
  AddressRange offsets_;
};

class VirtualMemory {
 public:
  struct MappingInfo {
    uintptr_t base;
    size_t size;
    Device* device;  // nullptr for host memory
    CUmemGenericAllocationHandle handle;
  };

  // Called once by cuInit.
  void init(Device* devices, int device_count);

  // All of these run under the driver lock.
  CUresult reserve(size_t size, size_t alignment, uintptr_t hint, uintptr_t* out);
  CUresult free_reservation(uintptr_t addr, size_t size);
  // `device` is the device in prop.location, or nullptr for a host location.
  CUresult create(size_t size, const CUmemAllocationProp& prop, Device* device,
                  CUmemGenericAllocationHandle* out);
  CUresult release(CUmemGenericAllocationHandle handle);
  CUresult map(uintptr_t addr, size_t size, CUmemGenericAllocationHandle handle);
  CUresult unmap(uintptr_t addr, size_t size);
  CUresult set_access(uintptr_t addr, size_t size, int prot);
  CUresult retain(uintptr_t addr, CUmemGenericAllocationHandle* out);
  CUresult properties(CUmemGenericAllocationHandle handle, CUmemAllocationProp* out) const;
  // A POSIX file descriptor standing for the handle (only this process can
  // import it), and its import: one more reference to the same handle.
  CUresult export_fd(CUmemGenericAllocationHandle handle, int* fd);
  CUresult import_fd(int fd, CUmemGenericAllocationHandle* out);
  // A multicast object: a handle with references but no memory.
  CUresult create_multicast(size_t size, CUmemGenericAllocationHandle* out);
  std::optional<MappingInfo> find_mapping(uintptr_t addr) const;

 private:
  struct Handle {
    Device* device;
    size_t size;
    size_t offset;
    int refs;      // cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease
    int mappings;  // live cuMemMap mappings
    CUmemAllocationProp prop;
    bool multicast;  // no memory (cuMulticastCreate)
  };
  struct Reservation {
    size_t size;  // as requested, what cuMemAddressFree must repeat
    size_t span;  // taken from the region
  };
  struct Mapping {
    size_t size;
    CUmemGenericAllocationHandle handle;
  };

  bool ensure_region();
  PhysicalStore& store_for(Device* device);
  const Reservation* reservation_containing(uintptr_t addr, size_t size) const;
  // True when [addr, addr + size) is exactly a run of adjacent whole mappings.
  bool whole_mappings(uintptr_t addr, size_t size) const;
  void free_if_unused(InternalMap<CUmemGenericAllocationHandle, Handle>::iterator it);

  Device* devices_ = nullptr;
  int device_count_ = 0;
  size_t region_size_ = 0;
  AddressRange region_;
  InternalMap<uintptr_t, Reservation> reservations_;
  InternalMap<uintptr_t, Mapping> mappings_;
  InternalMap<CUmemGenericAllocationHandle, Handle> handles_;
  InternalMap<int, CUmemGenericAllocationHandle> exported_;  // fd -> handle
  PhysicalStore stores_[kMaxDevices + 1];  // one per device, then the host
  // Recognisable handle values that are no address and never 0.
  CUmemGenericAllocationHandle next_handle_ = 0x5100000000000001ull;
};

}  // namespace memledger::simcuda
