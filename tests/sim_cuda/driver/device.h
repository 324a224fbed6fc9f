// A simulated GPU and its contexts. Host memory stands in for device memory:
// each device owns a large reserved address range (PROT_NONE, so it costs
// nothing until used) that its linear allocations and pool chunks are carved
// from, which keeps device addresses unique across devices and apart from
// the host heap. What counts against the device's capacity is tracked
// separately, at the real driver's granularity.
#pragma once

#include <cuda.h>
#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "address_range.h"

namespace memledger::simcuda {

inline constexpr size_t kMiB = size_t{1} << 20;
// cuMemAlloc rounding, VMM granularity, and the unit of pool chunks.
inline constexpr size_t kGranularity = 2 * kMiB;
inline constexpr int kMaxDevices = 16;

class Device;
class MemPool;

struct Context {
  Device* device = nullptr;
  unsigned int flags = 0;
  bool primary = false;
  // A destroyed context (or a primary one released to zero references)
  // stays allocated: a thread may still have it current.
  bool alive = false;
  unsigned long long id = 0;
};

struct Graph;

struct Stream {
  Context* context = nullptr;
  unsigned int flags = 0;
  // While the stream is being captured (cuStreamBeginCapture): the graph
  // its work goes into, and the capture's id.
  Graph* capture = nullptr;
  unsigned long long capture_id = 0;
  // How it was begun, and by which thread: outside the relaxed mode only
  // that thread may end it (cuStreamEndCapture).
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  pthread_t capture_thread{};
};

class Device {
 public:
  // Reserves the address space; false when the system refuses it.
  bool init(int ordinal, size_t capacity);

  int ordinal() const { return ordinal_; }
  size_t capacity() const { return capacity_; }
  size_t held() const { return held_; }

  // Counts bytes against the capacity; false (and nothing counted) when
  // they do not fit.
  bool hold(size_t bytes);
  void unhold(size_t bytes) { held_ -= bytes; }

  // Address space for `bytes` (a multiple of kGranularity), readable and
  // writable; nullopt when the address space is exhausted. Does not count
  // against the capacity: callers hold() first.
  std::optional<uintptr_t> map_linear(size_t bytes);
  void unmap_linear(uintptr_t addr, size_t bytes);
  bool owns(uintptr_t addr) const { return linear_.contains(addr); }

  Context primary;
  int primary_refs = 0;
  MemPool* default_pool = nullptr;
  MemPool* current_pool = nullptr;
  // CUDA graph memory (cuDeviceGetGraphMemAttribute): bytes of the live
  // graph allocations, and what they hold at the granularity.
  size_t graph_used = 0;
  size_t graph_reserved = 0;
  size_t graph_used_high = 0;
  size_t graph_reserved_high = 0;

 private:
  int ordinal_ = 0;
  size_t capacity_ = 0;
  size_t held_ = 0;
  AddressRange linear_;
};

// Host pages behind a simulated allocation: made readable and writable when
// handed out, dropped (and made inaccessible again) when given back, so that
// freed device memory does not stay in the process's RSS.
bool make_accessible(uintptr_t addr, size_t bytes);
void discard_pages(uintptr_t addr, size_t bytes);
// A PROT_NONE reservation of `bytes` of address space (flags added to the
// mmap flags, e.g. MAP_32BIT); 0 on failure.
uintptr_t reserve_address_space(size_t bytes, int extra_flags = 0);
// A PROT_NONE reservation below 4 GiB, for the 32-bit CUdeviceptr of the
// CUDA 2.x (_v1) entry points: MAP_32BIT, else a few low hints (MAP_32BIT
// is x86-64 only, and valgrind ignores it). Empty when there is no room.
AddressRange reserve_low32(size_t span);

}  // namespace memledger::simcuda
