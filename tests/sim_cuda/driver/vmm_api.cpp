// Exported entry points: virtual memory management.

#include <sys/mman.h>

#include "driver_state.h"

using namespace memledger::simcuda;

namespace {

// The device an allocation property names, nullptr for a host location.
CUresult prop_location(Call& call, const CUmemAllocationProp* prop, Device** out) {
  if (CUresult r = call.initialized()) return r;
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      return call.device(prop->location.id, out);
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      *out = nullptr;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  Call call(Sym::cuMemGetAllocationGranularity);
  Device* device = nullptr;
  if (CUresult r = prop_location(call, prop, &device)) return r;
  if (granularity == nullptr ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  Call call(Sym::cuMemAddressReserve);
  if (CUresult r = call.initialized()) return r;
  if (ptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t reserved = 0;
  if (CUresult r = call.st.vmm.reserve(size, alignment, addr, &reserved)) return r;
  *ptr = reserved;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Call call(Sym::cuMemAddressFree);
  if (CUresult r = call.initialized()) return r;
  return call.st.vmm.free_reservation(ptr, size);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  Call call(Sym::cuMemCreate);
  Device* device = nullptr;
  if (CUresult r = prop_location(call, prop, &device)) return r;
  if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return call.st.vmm.create(size, *prop, device, handle);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  Call call(Sym::cuMemRelease);
  if (CUresult r = call.initialized()) return r;
  return call.st.vmm.release(handle);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  Call call(Sym::cuMemMap);
  if (CUresult r = call.initialized()) return r;
  if (offset != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;  // "currently must be zero"
  return call.st.vmm.map(ptr, size, handle);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  Call call(Sym::cuMemUnmap);
  if (CUresult r = call.initialized()) return r;
  return call.st.vmm.unmap(ptr, size);
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  Call call(Sym::cuMemSetAccess);
  if (CUresult r = call.initialized()) return r;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  // One host address space stands for every device's view: the widest
  // access granted to anyone applies.
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
      Device* device = nullptr;
      if (CUresult r = call.device(desc[i].location.id, &device)) return r;
    } else if (desc[i].location.type != CU_MEM_LOCATION_TYPE_HOST &&
               desc[i].location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    switch (desc[i].flags) {
      case CU_MEM_ACCESS_FLAGS_PROT_NONE:
        break;
      case CU_MEM_ACCESS_FLAGS_PROT_READ:
        prot |= PROT_READ;
        break;
      case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        prot |= PROT_READ | PROT_WRITE;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return call.st.vmm.set_access(ptr, size, prot);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  Call call(Sym::cuMemRetainAllocationHandle);
  if (CUresult r = call.initialized()) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return call.st.vmm.retain(reinterpret_cast<uintptr_t>(addr), handle);
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  Call call(Sym::cuMemGetAllocationPropertiesFromHandle);
  if (CUresult r = call.initialized()) return r;
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return call.st.vmm.properties(handle, prop);
}

CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
  Call call(Sym::cuMemExportToShareableHandle);
  if (CUresult r = call.initialized()) return r;
  if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  return call.st.vmm.export_fd(handle, static_cast<int*>(shareableHandle));
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                        CUmemAllocationHandleType shHandleType) {
  Call call(Sym::cuMemImportFromShareableHandle);
  if (CUresult r = call.initialized()) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  // The file descriptor travels as the pointer's value, as the CUDA samples
  // (memMapIPCDrv) pass it.
  return call.st.vmm.import_fd(static_cast<int>(reinterpret_cast<uintptr_t>(osHandle)), handle);
}

CUresult cuMulticastGetGranularity(size_t* granularity, const CUmulticastObjectProp* prop,
                                   CUmulticastGranularity_flags option) {
  Call call(Sym::cuMulticastGetGranularity);
  if (CUresult r = call.initialized()) return r;
  if (granularity == nullptr || prop == nullptr ||
      (option != CU_MULTICAST_GRANULARITY_MINIMUM && option != CU_MULTICAST_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMulticastCreate(CUmemGenericAllocationHandle* mcHandle, const CUmulticastObjectProp* prop) {
  Call call(Sym::cuMulticastCreate);
  if (CUresult r = call.initialized()) return r;
  if (mcHandle == nullptr || prop == nullptr || prop->numDevices == 0 ||
      static_cast<int>(prop->numDevices) > call.st.device_count) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return call.st.vmm.create_multicast(prop->size, mcHandle);
}
