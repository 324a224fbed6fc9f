#include "device_memory.h"

#include <algorithm>
#include <cstdio>

namespace memledger::report {

void DeviceLedger::absorb(uint64_t seq) {
  for (; vmm_i_ < trace_.vmm.size() && trace_.vmm[vmm_i_].seq < seq; ++vmm_i_) {
    const TraceVmmEvent& v = trace_.vmm[vmm_i_];
    if (v.type == TraceVmmEvent::Type::kReserve) {
      reservations_[v.addr] = v.size;
      reserved_va_ += v.size;
    } else if (v.type == TraceVmmEvent::Type::kUnreserve) {
      auto it = reservations_.find(v.addr);
      if (it != reservations_.end()) {
        reserved_va_ -= it->second;
        reservations_.erase(it);
      }
    }
  }
  for (; dev_i_ < trace_.device_samples.size() && trace_.device_samples[dev_i_].seq < seq; ++dev_i_) {
    devices_[trace_.device_samples[dev_i_].device] = trace_.device_samples[dev_i_];
  }
  for (; pool_i_ < trace_.pool_samples.size() && trace_.pool_samples[pool_i_].seq < seq; ++pool_i_) {
    pools_[trace_.pool_samples[pool_i_].pool] = trace_.pool_samples[pool_i_];
  }
}

void DeviceLedger::pool_holders(std::vector<Holder>& out, uint64_t& held, uint64_t& unused) const {
  std::vector<const TracePoolSample*> sorted;
  for (const auto& [pool, p] : pools_) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->pool < b->pool; });
  for (const TracePoolSample* p : sorted) {
    char name[96];
    std::snprintf(name, sizeof name, "memory pool 0x%llx on device %u", static_cast<unsigned long long>(p->pool),
                  p->device);
    out.push_back(Holder{name, p->reserved, p->reserved > p->used ? p->reserved - p->used : 0});
    held += p->reserved;
    unused += out.back().unused;
  }
}

void DeviceLedger::fill_step(StepStats& st) const {
  uint64_t held_pools = 0, unused_pools = 0;
  pool_holders(st.device_holders, held_pools, unused_pools);
  st.held_device = held_plain_ + static_cast<int64_t>(held_pools);
  if (held_plain_ > 0) {
    st.device_holders.insert(
        st.device_holders.begin(),
        Holder{"cudaMalloc/cuMemAlloc allocations (2 MiB granularity) and VMM physical memory",
               static_cast<uint64_t>(held_plain_), static_cast<uint64_t>(std::max<int64_t>(0, held_plain_ - live_plain_))});
  }
  auto dev = devices_.begin();
  if (dev != devices_.end()) {
    st.device_free = dev->second.free;
    st.device_total = dev->second.total;
  }
  st.reserved_address_space = reserved_va_;
}

void DeviceLedger::fill_oom(OomEvent& oom) const {
  auto dev = devices_.find(static_cast<uint32_t>(oom.device));
  if (dev != devices_.end()) {
    oom.device_free = dev->second.free;
    oom.device_total = dev->second.total;
  }
  uint64_t held_pools = 0;
  pool_holders(oom.holders, held_pools, oom.held_unused);
}

HiddenAllocator find_hidden_allocator(const std::vector<ModuleInfo>& modules, const std::vector<StepStats>& steps,
                                      bool pool_allocs, bool vmm_seen) {
  HiddenAllocator out;
  std::string framework;
  for (const ModuleInfo& m : modules) {
    if (m.path.find("libtorch_cuda") != std::string::npos) framework = "PyTorch";
    if (m.path.find("libtensorflow_framework") != std::string::npos || m.path.find("_pywrap_tensorflow") != std::string::npos) framework = "TensorFlow";
    if (m.path.find("xla_extension") != std::string::npos || m.path.find("jaxlib") != std::string::npos) framework = "JAX";
  }
  bool device_seen = false;
  for (const StepStats& st : steps) device_seen = device_seen || st.live[1] != 0;
  if (framework.empty() || pool_allocs || (!device_seen && !vmm_seen)) return out;
  out.hidden = true;
  out.note = framework +
             "'s caching allocator hands tensors out of large segments: the driver sees only the "
             "segments, so sites and growth here are per segment, not per tensor. Rerun with "
             "`memledger run --leak-mode` (" +
             (framework == "PyTorch" ? std::string("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync")
              : framework == "TensorFlow" ? std::string("TF_GPU_ALLOCATOR=cuda_malloc_async")
                                          : std::string("XLA_PYTHON_CLIENT_ALLOCATOR=platform")) +
             ") to see every tensor allocation.";
  return out;
}

}  // namespace memledger::report
