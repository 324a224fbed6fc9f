#include "device_memory.h"

#include <algorithm>
#include <cstdio>

#include "growth.h"

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

void DeviceLedger::change(uint8_t kind, uint8_t flags, uint64_t size, uint8_t device, int sign) {
  const uint64_t h = held_for(kind, flags, size);
  if (h == 0) return;
  held_plain_ += sign * static_cast<int64_t>(h);
  live_plain_ += sign * static_cast<int64_t>(size);
  namespace fmt = memledger::format;
  if (kind == static_cast<uint8_t>(fmt::Kind::kDevice) || kind == static_cast<uint8_t>(fmt::Kind::kManaged)) {
    if (held_by_device_.size() <= device) held_by_device_.resize(device + 1u, 0);
    held_by_device_[device] += sign * static_cast<int64_t>(h);
  }
}

int64_t DeviceLedger::held_on(uint32_t device) const {
  int64_t held = device < held_by_device_.size() ? held_by_device_[device] : 0;
  for (const auto& [pool, p] : pools_) {
    if (p.device == device) held += static_cast<int64_t>(p.reserved);
  }
  return held;
}

void DeviceLedger::pool_holders(std::vector<Holder>& out, uint64_t& held, uint64_t& unused) const {
  std::vector<const TracePoolSample*> sorted;
  for (const auto& [pool, p] : pools_) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->pool < b->pool; });
  for (const TracePoolSample* p : sorted) {
    char name[96];
    if (p->pool == memledger::format::kGraphMemoryPool) {
      std::snprintf(name, sizeof name, "CUDA graph memory on device %u", p->device);
    } else {
      std::snprintf(name, sizeof name, "memory pool 0x%llx on device %u", static_cast<unsigned long long>(p->pool),
                    p->device);
    }
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
  for (const auto& [device, sample] : devices_) {
    const int64_t used = static_cast<int64_t>(sample.total) - static_cast<int64_t>(sample.free);
    st.not_hooked_by_device.emplace_back(device, used - held_on(device));
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

std::string not_hooked_name(uint32_t device) {
  return "device memory not allocated through hooked calls (device " + std::to_string(device) + ")";
}

std::vector<LeakSuspect> find_not_hooked_growth(const std::vector<StepStats>& steps, int warmup_steps,
                                                size_t max_suspects) {
  // One pseudo-site per device (stack = ordinal + 1), its series at every
  // step end where it was sampled.
  SiteAccs series;
  for (const StepStats& st : steps) {
    for (const auto& [device, bytes] : st.not_hooked_by_device) {
      if (series.size() <= device) series.resize(device + 1u);
      SiteAcc& acc = series[device];
      acc.stack = device + 1;
      acc.kind = static_cast<uint8_t>(memledger::format::Kind::kDevice);
      if (acc.changes.empty() || acc.changes.back().live != bytes) {
        acc.changes.push_back(SeriesPoint{static_cast<uint32_t>(st.index), bytes, 0, 0});
      }
      acc.live = bytes;
    }
  }
  std::erase_if(series, [](const SiteAcc& acc) { return acc.stack == 0; });
  Growth growth = find_growth(series, steps.size(), GrowthOptions{warmup_steps, max_suspects, false, 0});
  for (LeakSuspect& s : growth.suspects) {
    const uint32_t device = s.site.stack - 1;
    s.site.stack = 0;
    Frame frame;
    frame.function = not_hooked_name(device);
    s.site.frames = {frame};
    s.allocations_per_step = 0;
  }
  return std::move(growth.suspects);
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
             (framework == "PyTorch" ? std::string("PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync")
              : framework == "TensorFlow"
                  ? std::string("TF_GPU_ALLOCATOR=cuda_malloc_async")
                  : std::string("XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async, or platform on a JAX that does not accept "
                                "it; platform falls back to BFC on those that do")) +
             ") to see every tensor allocation.";
  return out;
}

}  // namespace memledger::report
