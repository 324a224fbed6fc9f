// The simulated driver's process-wide state, and what every entry point does
// first (class Call). One mutex guards all of it: the simulator is for
// tests, where simplicity beats concurrency.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "device.h"
#include "graph.h"
#include "driver_symbols.h"
#include "internal_heap.h"
#include "mem_pool.h"
#include "virtual_memory.h"

namespace memledger::simcuda {

// Read from the environment once, at the first call that needs it.
struct Config {
  int device_count = 2;           // SIMCUDA_DEVICES
  size_t memory_bytes = 1024 * kMiB;  // SIMCUDA_MEMORY_MB, per device
  int driver_version = 13000;     // SIMCUDA_DRIVER_VERSION
  size_t context_bytes = 0;       // SIMCUDA_CONTEXT_MB: device memory each live context holds
  bool crash_in_alloc = false;    // SIMCUDA_CRASH_IN_ALLOC=1: cuMemAlloc faults (a driver bug)
};
const Config& config();

enum class BlockKind : unsigned char { kLinear, kPitch, kManaged, kPool, kGraph };

// One device allocation that cuMemFree can free: linear, pitched, managed,
// from a pool, or a graph allocation made by a launch (graph.h).
struct Block {
  size_t size;  // as requested
  size_t held;  // counted against the device (pool blocks: rounded used bytes)
  Device* device;
  Context* context;  // nullptr for pool and graph blocks: they belong to devices
  MemPool* pool;
  BlockKind kind;
  bool low32;  // from the 32-bit window of the CUDA 2.x (_v1) entry points
  Graph* graph = nullptr;  // kGraph: the graph whose allocation node made it
};

// Page-locked host memory from cuMemHostAlloc/cuMemAllocHost.
struct HostBlock {
  size_t size;
  size_t mapped;
  Context* context;
  unsigned int flags;
};

struct State {
  std::mutex mu;
  bool initialized = false;
  // In the child of a fork after cuInit: the driver cannot be used there
  // (every call, cuInit too, answers NOT_INITIALIZED, which the runtime
  // reports as cudaErrorInitializationError, as with the real driver).
  bool forked_child = false;
  int device_count = 0;
  Device devices[kMaxDevices];
  InternalSet<Context*> contexts;  // every context ever made; see Context::alive
  InternalSet<Stream*> streams;
  InternalSet<MemPool*> pools;
  InternalMap<uintptr_t, Block> blocks;
  InternalMap<uintptr_t, HostBlock> host_blocks;
  InternalMap<uintptr_t, size_t> registered;  // cuMemHostRegister ranges
  VirtualMemory vmm;
  // Host memory of CUDA 13's host (and host/no-location managed) pools: a
  // device of its own that no cuMemGetInfo reports, so that pool code needs
  // no second path. Initialised by cuInit.
  Device host;
  // Default pools other than the devices' pinned ones, made at first use:
  // [0, kMaxDevices) managed on that device, then managed on the host (or
  // no location), then pinned host memory.
  MemPool* other_default_pools[kMaxDevices + 2] = {};
  // Address window below 4 GiB for the _v1 entry points, whose CUdeviceptr
  // is 32 bits wide; reserved by cuInit.
  AddressRange low32;
  unsigned long long next_context_id = 1;
  // CUDA graphs (graph.h): made by stream capture, and their executables.
  InternalSet<Graph*> graphs;
  InternalSet<GraphExec*> execs;
  unsigned long long next_capture_id = 1;
};
State& state();

// Call counters behind simcuda_stats(); `total` counts every entry of an
// exported function, `via_proc` those that came through a pointer that
// cuGetProcAddress handed out.
struct CallCounter {
  std::atomic<unsigned long long> total{0};
  std::atomic<unsigned long long> via_proc{0};
};
CallCounter& counter(Sym sym);
extern std::atomic<unsigned long long> g_proc_address_lookups;

// Counts the call, takes the driver lock, and answers the usual checks.
class Call {
 public:
  explicit Call(Sym sym);
  State& st;
  // CUDA_ERROR_NOT_INITIALIZED before cuInit.
  CUresult initialized() const;
  // The calling thread's current context, or the error the real driver
  // gives: NOT_INITIALIZED, INVALID_CONTEXT (none), CONTEXT_IS_DESTROYED.
  CUresult current(Context** out) const;
  // The device for an ordinal, or INVALID_DEVICE.
  CUresult device(CUdevice ordinal, Device** out) const;
  // A stream handle (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or one
  // from cuStreamCreate) to its context.
  CUresult stream_context(CUstream stream, Context** out) const;
  // The stream object behind a handle from cuStreamCreate; nullptr for the
  // default streams (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD), which
  // are never captured here. Call after stream_context() succeeded.
  Stream* stream_object(CUstream stream) const;
  // A context handle (NULL meaning the current one) to a live context.
  CUresult context(CUcontext handle, Context** out) const;
  // A pool handle to a pool that is not destroyed; INVALID_VALUE otherwise.
  CUresult pool(CUmemoryPool handle, MemPool** out) const;

 private:
  std::lock_guard<std::mutex> lock_;
};

// The calling thread's context stack (cuCtxPush/PopCurrent; cuCtxSetCurrent
// replaces the top). Fixed size and trivially destructible: it lives in TLS.
Context* current_context();
void set_current_context(Context* ctx);
bool push_context(Context* ctx);
Context* pop_context();
// Drops every entry for `ctx` from the calling thread's stack.
void forget_context(Context* ctx);

// Frees everything a context owns (linear, managed and pinned allocations,
// streams): what cuCtxDestroy and the last cuDevicePrimaryCtxRelease do.
void tear_down(State& st, Context* ctx);

// Pools of a device give back memory above their release threshold, as the
// real driver does on stream and context synchronize.
void trim_pools_after_sync(State& st, Device* device);

// Frees a device block (cuMemFree and cuMemFreeAsync); INVALID_VALUE when
// `addr` is not the start of one.
CUresult free_block(State& st, uintptr_t addr);

CUcontext to_handle(Context* ctx);
CUstream to_handle(Stream* stream);
CUmemoryPool to_handle(MemPool* pool);

}  // namespace memledger::simcuda

// Declared by the exports: counts the call, for simcuda_stats().
#define SIMCUDA_COUNT(symbol) ::memledger::simcuda::counter(::memledger::simcuda::Sym::symbol).total++
