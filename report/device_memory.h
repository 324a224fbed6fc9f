// Stage "device": what holds device memory beyond what the program uses
// (DESIGN.md, "Held bytes", "Fragmentation").
//
// In:  the trace's side records (VMM reservations, cuMemGetInfo samples,
//      pool samples), consumed in sequence order as the replay reaches them,
//      and the replay's plain device allocations and releases.
// Out: at any moment (a step end, a failed allocation) the holders of
//      device memory: pools' reserve, the rounding of cudaMalloc to the
//      allocation granularity, VMM physical memory, with what each holds
//      unused (fragmentation = held - live); and, over the whole process,
//      whether a framework's caching allocator hides the tensors.
//
// The replay drives DeviceLedger event by event because holders are a
// picture of one moment; everything judged over the whole run (the
// caching allocator) is a classifier over the replay's output.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "analysis.h"
#include "trace_format.h"
#include "trace_reader.h"

namespace memledger::report {

// What an allocation holds from the device beyond what it asked for: plain
// device allocations are rounded to the allocation granularity; pool
// allocations are held by their pool, graph allocations by the device's
// graph memory (both sampled separately); VMM physical allocations are
// granular already.
inline constexpr uint64_t kDeviceGranularity = 2ull << 20;
inline uint64_t held_for(uint8_t kind, uint8_t flags, uint64_t size) {
  namespace fmt = memledger::format;
  if (kind == static_cast<uint8_t>(fmt::Kind::kHost) || kind == static_cast<uint8_t>(fmt::Kind::kMapped)) return 0;
  if (flags & (fmt::kAllocPool | fmt::kAllocRegistered | fmt::kAllocGraph)) return 0;
  if (flags & fmt::kAllocPhysical) return size;
  if (kind == static_cast<uint8_t>(fmt::Kind::kPinnedHost)) return 0;
  return (size + kDeviceGranularity - 1) / kDeviceGranularity * kDeviceGranularity;
}

// The device side of the replay at the moment it has reached.
class DeviceLedger {
 public:
  explicit DeviceLedger(const Trace& trace) : trace_(trace) {}

  // Takes in the side records that happened before `seq` (they are
  // complete up to there once the events before `seq` have arrived).
  void catch_up(uint64_t seq) {
    if ((vmm_i_ < trace_.vmm.size() && trace_.vmm[vmm_i_].seq < seq) ||
        (dev_i_ < trace_.device_samples.size() && trace_.device_samples[dev_i_].seq < seq) ||
        (pool_i_ < trace_.pool_samples.size() && trace_.pool_samples[pool_i_].seq < seq)) {
      absorb(seq);
    }
  }
  // A live allocation made or released (`size`: the bytes it stands for).
  void allocated(uint8_t kind, uint8_t flags, uint64_t size, uint8_t device = 0) {
    change(kind, flags, size, device, 1);
  }
  void released(uint8_t kind, uint8_t flags, uint64_t size, uint8_t device = 0) {
    change(kind, flags, size, device, -1);
  }

  // Held bytes, holders, device free/total and VMM reservations now.
  void fill_step(StepStats& st) const;
  // Free/total, pool holders and their unused bytes now, for a failed
  // allocation on `oom.device`.
  void fill_oom(OomEvent& oom) const;
  // The pools by handle, each named, with the sum of their reserve and of
  // what they hold unused.
  void pool_holders(std::vector<Holder>& out, uint64_t& held, uint64_t& unused) const;

 private:
  void absorb(uint64_t seq);
  void change(uint8_t kind, uint8_t flags, uint64_t size, uint8_t device, int sign);
  // What the hooks account for on `device`: its plain allocations' held
  // bytes, its pools' reserve and its CUDA graph memory.
  int64_t held_on(uint32_t device) const;

  const Trace& trace_;
  std::vector<int64_t> held_by_device_;  // held_plain_ of device and managed memory, by ordinal
  int64_t held_plain_ = 0;  // granularity-rounded device allocations and VMM physical memory
  int64_t live_plain_ = 0;  // what the program asked for of those
  size_t vmm_i_ = 0, dev_i_ = 0, pool_i_ = 0;
  uint64_t reserved_va_ = 0;
  absl::flat_hash_map<uint64_t, uint64_t> reservations_;
  absl::flat_hash_map<uint64_t, TracePoolSample> pools_;  // latest sample per pool
  std::map<uint32_t, TraceDeviceSample> devices_;          // latest sample per device
};

// The "device memory not allocated through hooked calls" series of each
// device, judged like a site's live bytes (find_growth): suspects named
// after the device, steepest first.
std::vector<LeakSuspect> find_not_hooked_growth(const std::vector<StepStats>& steps, int warmup_steps,
                                                size_t max_suspects);
// The name such a suspect's site carries.
std::string not_hooked_name(uint32_t device);

// A framework's caching allocator between the program and the driver: the
// driver sees its segments, not tensors.
struct HiddenAllocator {
  bool hidden = false;
  std::string note;  // what it means and the switch that shows every tensor
};
// `pool_allocs`: the program allocates from memory pools itself (then the
// tensors are visible).
HiddenAllocator find_hidden_allocator(const std::vector<ModuleInfo>& modules, const std::vector<StepStats>& steps,
                                      bool pool_allocs, bool vmm_seen);

}  // namespace memledger::report
