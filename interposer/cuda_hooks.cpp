// Hooks for the CUDA driver and runtime allocation APIs, and the ways
// programs reach them without a PLT call:
//  - exported symbols (a program linked against libcuda / libcudart);
//  - dlsym()/dlvsym() on a libcuda or libcudart handle (TensorFlow/XLA,
//    PyTorch, and cudart itself, which dlopens libcuda);
//  - cuGetProcAddress (how cudart 11.3+ reaches every driver function, also
//    when linked statically, nvcc's default) and cudaGetDriverEntryPoint.
// Each hooked function is listed once in MEMLEDGER_CUDA_DRIVER_HOOKS or
// MEMLEDGER_CUDA_RUNTIME_HOOKS; the same lists answer the look-ups.
//
// The preload library never links against CUDA: real functions are found in
// the already-loaded libcuda/libcudart (RTLD_NOLOAD), or captured when the
// program itself looks them up. One user call is one event: a runtime hook
// marks its thread so that the driver call it makes is not recorded again.

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>

#include "cuda_abi.h"
#include "cuda_stack.h"
#include "cupti_bridge.h"
#include "library_hooks.h"
#include "graph_ledger.h"
#include "live_ledger.h"
#include "recorder.h"
#include "spin_lock.h"
#include "vmm_ledger.h"

#include "libc_symbols.h"

// libc's own dlsym and dlvsym (see libc_symbols.h for why not by name).
using memledger::interposer::find_in_caller_scope;
using memledger::interposer::libc_dlsym;
using memledger::interposer::find_in_loaded_library;
using memledger::interposer::libc_dlvsym;

extern "C" __attribute__((visibility("hidden"), used)) void* memledger_libc_dlsym_address() {
  return memledger::interposer::libc_dlsym_address();
}
extern "C" __attribute__((visibility("hidden"), used)) void* memledger_libc_dlvsym_address() {
  return memledger::interposer::libc_dlvsym_address();
}

using namespace memledger::cuda;
using memledger::format::Kind;
using memledger::interposer::EventType;
using memledger::interposer::GraphLedger;
using memledger::interposer::graph_ledger;
using memledger::interposer::HookGuard;
using memledger::interposer::recorder;
using memledger::interposer::ThreadState;
using memledger::interposer::VmmLedger;
using memledger::interposer::vmm_ledger;
namespace fmt = memledger::format;

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

// Driver hooks: X(exported name, base name for cuGetProcAddress, first CUDA
// version with this ABI, per-thread default stream variant).
// cuGraphInstantiate_v2 (the CUDA 11.0 ABI) is matched by its exported name
// only: since CUDA 12 the name "cuGraphInstantiate" means
// cuGraphInstantiateWithFlags (cuda.h), another prototype, so a look-up by
// that base name is handed through unwrapped rather than risk the wrong one.
#define MEMLEDGER_CUDA_DRIVER_HOOKS(X)                                   \
  X(cuInit, "cuInit", 2000, false)                                       \
  X(cuMemAlloc_v2, "cuMemAlloc", 3020, false)                            \
  X(cuMemFree_v2, "cuMemFree", 3020, false)                              \
  X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, false)                  \
  X(cuMemAllocManaged, "cuMemAllocManaged", 6000, false)                 \
  X(cuMemAllocHost_v2, "cuMemAllocHost", 3020, false)                    \
  X(cuMemHostAlloc, "cuMemHostAlloc", 2020, false)                       \
  X(cuMemFreeHost, "cuMemFreeHost", 2000, false)                         \
  X(cuMemHostRegister_v2, "cuMemHostRegister", 6050, false)              \
  X(cuMemHostUnregister, "cuMemHostUnregister", 4000, false)             \
  X(cuMemAllocAsync, "cuMemAllocAsync", 11020, false)                    \
  X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, true)                \
  X(cuMemFreeAsync, "cuMemFreeAsync", 11020, false)                      \
  X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, true)                  \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, false)    \
  X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, true) \
  X(cuMemPoolCreate, "cuMemPoolCreate", 11020, false)                    \
  X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, false)                  \
  X(cuDeviceSetMemPool, "cuDeviceSetMemPool", 11020, false)              \
  X(cuMemSetMemPool, "cuMemSetMemPool", 13000, false)                    \
  X(cuStreamDestroy, "cuStreamDestroy", 2000, false)                     \
  X(cuStreamDestroy_v2, "cuStreamDestroy", 4000, false)                  \
  X(cuCtxDestroy, "cuCtxDestroy", 2000, false)                           \
  X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, false)                        \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, false) \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, false) \
  X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, false)     \
  X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, false) \
  X(cuGreenCtxDestroy, "cuGreenCtxDestroy", 12040, false)                \
  X(cuMemCreate, "cuMemCreate", 10020, false)                            \
  X(cuMemRelease, "cuMemRelease", 10020, false)                          \
  X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, false) \
  X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, false) \
  X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, false) \
  X(cuMulticastCreate, "cuMulticastCreate", 12010, false)                \
  X(cuMemMap, "cuMemMap", 10020, false)                                  \
  X(cuMemUnmap, "cuMemUnmap", 10020, false)                              \
  X(cuMemAddressReserve, "cuMemAddressReserve", 10020, false)            \
  X(cuMemAddressFree, "cuMemAddressFree", 10020, false)                  \
  X(cuStreamBeginCapture, "cuStreamBeginCapture", 10000, false)          \
  X(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, true)      \
  X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, false)       \
  X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, true)   \
  X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, false) \
  X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, true) \
  X(cuStreamEndCapture, "cuStreamEndCapture", 10000, false)              \
  X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, true)          \
  X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, false) \
  X(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 12000, false) \
  X(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 12000, true) \
  X(cuGraphInstantiate_v2, "cuGraphInstantiate_v2", 11000, false)        \
  X(cuGraphLaunch, "cuGraphLaunch", 10000, false)                        \
  X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, true)                    \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, false)              \
  X(cuGraphDestroy, "cuGraphDestroy", 10000, false)                      \
  X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, false)               \
  X(cuGetProcAddress, "cuGetProcAddress", 11030, false)

// Runtime hooks: X(exported name).
#define MEMLEDGER_CUDA_RUNTIME_HOOKS(X)  \
  X(cudaMalloc)                          \
  X(cudaFree)                            \
  X(cudaMallocAsync)                     \
  X(cudaMallocAsync_ptsz)                \
  X(cudaFreeAsync)                       \
  X(cudaFreeAsync_ptsz)                  \
  X(cudaMallocFromPoolAsync)             \
  X(cudaMallocFromPoolAsync_ptsz)        \
  X(cudaMallocManaged)                   \
  X(cudaMallocHost)                      \
  X(cudaHostAlloc)                       \
  X(cudaFreeHost)                        \
  X(cudaHostRegister)                    \
  X(cudaHostUnregister)                  \
  X(cudaMallocPitch)                     \
  X(cudaMalloc3D)                        \
  X(cudaGetDriverEntryPoint)             \
  X(cudaGetDriverEntryPointByVersion)    \
  X(cudaGetDeviceCount)

namespace {

// Real function pointers, one slot per hooked symbol.
#define MEMLEDGER_DECLARE_SLOT(name, ...) std::atomic<void*> real_##name{nullptr};
MEMLEDGER_CUDA_DRIVER_HOOKS(MEMLEDGER_DECLARE_SLOT)
MEMLEDGER_CUDA_RUNTIME_HOOKS(MEMLEDGER_DECLARE_SLOT)
// Driver functions memledger calls itself but does not hook.
std::atomic<void*> real_cuCtxGetDevice{nullptr};
std::atomic<void*> real_cuMemGetInfo_v2{nullptr};
std::atomic<void*> real_cuMemPoolGetAttribute{nullptr};
std::atomic<void*> real_cuDeviceGetDefaultMemPool{nullptr};
std::atomic<void*> real_cuDeviceGetMemPool{nullptr};
std::atomic<void*> real_cuMemGetDefaultMemPool{nullptr};
std::atomic<void*> real_cuCtxGetCurrent{nullptr};
std::atomic<void*> real_cuDeviceGetCount{nullptr};
std::atomic<void*> real_cuDevicePrimaryCtxGetState{nullptr};
std::atomic<void*> real_cuDevicePrimaryCtxRetain{nullptr};
std::atomic<void*> real_cuCtxPushCurrent_v2{nullptr};
std::atomic<void*> real_cuCtxPopCurrent_v2{nullptr};
std::atomic<void*> real_cuDeviceGetGraphMemAttribute{nullptr};
std::atomic<void*> real_cuStreamGetDevice{nullptr};
std::atomic<void*> real_cuStreamGetCtx{nullptr};
std::atomic<void*> real_cuCtxGetDevice_v2{nullptr};
std::atomic<void*> real_cuStreamGetCaptureInfo_v3{nullptr};
std::atomic<void*> real_cuStreamGetCaptureInfo_v2{nullptr};
std::atomic<void*> real_cudaGetDevice{nullptr};

std::atomic<bool> g_cuda_used{false};
std::atomic<bool> g_stack_noted{false};

// The CUDA stack is noted after the program's first CUDA call returned
// (cuda_stack.h), and again after any call that failed for the driver's
// version; later, at step ends.
void note_first_call(const char* call, int result) {
  // A load first: the allocation hooks of every thread pass here.
  const bool first = !g_stack_noted.load(std::memory_order_relaxed) &&
                     !g_stack_noted.exchange(true, std::memory_order_relaxed);
  if (first || result == 35 || result == 222 || result == 803 || result == 804) {
    g_cuda_used.store(true, std::memory_order_relaxed);  // step ends note the stack again (new libraries)
    memledger::interposer::note_cuda_stack(call, result);
  }
}

struct HookEntry {
  const char* name;
  const char* base;  // driver: name for cuGetProcAddress; runtime: nullptr
  int version;
  bool per_thread;
  void* wrapper;
  std::atomic<void*>* real;
};

}  // namespace

// Forward declarations of every wrapper, so the tables can name them.
extern "C" {
CUresult cuInit(unsigned int);
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr*, size_t, unsigned int);
CUresult cuMemAllocHost_v2(void**, size_t);
CUresult cuMemHostAlloc(void**, size_t, unsigned int);
CUresult cuMemFreeHost(void*);
CUresult cuMemHostRegister_v2(void*, size_t, unsigned int);
CUresult cuMemHostUnregister(void*);
CUresult cuMemAllocAsync(CUdeviceptr*, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr*, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool*, const void*);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuDeviceSetMemPool(CUdevice, CUmemoryPool);
CUresult cuMemSetMemPool(void*, int, CUmemoryPool);
CUresult cuStreamDestroy(CUstream);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuCtxDestroy(CUcontext);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuDevicePrimaryCtxRelease(CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDevicePrimaryCtxReset(CUdevice);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuGreenCtxDestroy(void*);
CUresult cuMemCreate(CUmemGenericAllocationHandle*, size_t, const void*, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle*, void*);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle*, void*, int);
CUresult cuMemExportToShareableHandle(void*, CUmemGenericAllocationHandle, int, unsigned long long);
CUresult cuMulticastCreate(CUmemGenericAllocationHandle*, const void*);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemAddressReserve(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuStreamBeginCapture(CUstream);
CUresult cuStreamBeginCapture_ptsz(CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, int);
CUresult cuStreamBeginCaptureToGraph(CUstream, CUgraph, const CUgraphNode*, const void*, size_t, int);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream, CUgraph, const CUgraphNode*, const void*, size_t, int);
CUresult cuStreamEndCapture(CUstream, CUgraph*);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph*);
CUresult cuGraphInstantiateWithFlags(CUgraphExec*, CUgraph, unsigned long long);
CUresult cuGraphInstantiateWithParams(CUgraphExec*, CUgraph, void*);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec*, CUgraph, void*);
CUresult cuGraphInstantiate_v2(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, int*);
CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t);
cudaError_t cudaMalloc(void**, size_t);
cudaError_t cudaFree(void*);
cudaError_t cudaMallocAsync(void**, size_t, cudaStream_t);
cudaError_t cudaMallocAsync_ptsz(void**, size_t, cudaStream_t);
cudaError_t cudaFreeAsync(void*, cudaStream_t);
cudaError_t cudaFreeAsync_ptsz(void*, cudaStream_t);
cudaError_t cudaMallocFromPoolAsync(void**, size_t, cudaMemPool_t, cudaStream_t);
cudaError_t cudaMallocFromPoolAsync_ptsz(void**, size_t, cudaMemPool_t, cudaStream_t);
cudaError_t cudaMallocManaged(void**, size_t, unsigned int);
cudaError_t cudaMallocHost(void**, size_t);
cudaError_t cudaHostAlloc(void**, size_t, unsigned int);
cudaError_t cudaFreeHost(void*);
cudaError_t cudaHostRegister(void*, size_t, unsigned int);
cudaError_t cudaHostUnregister(void*);
cudaError_t cudaMallocPitch(void**, size_t*, size_t, size_t);
cudaError_t cudaMalloc3D(PitchedPtr*, Extent);
cudaError_t cudaGetDriverEntryPoint(const char*, void**, unsigned long long, int*);
cudaError_t cudaGetDriverEntryPointByVersion(const char*, void**, unsigned int, unsigned long long, int*);
cudaError_t cudaGetDeviceCount(int*);
}

namespace {

#define MEMLEDGER_DRIVER_ENTRY(name, base, version, per_thread) \
  {#name, base, version, per_thread, reinterpret_cast<void*>(&::name), &real_##name},
const HookEntry kDriverHooks[] = {MEMLEDGER_CUDA_DRIVER_HOOKS(MEMLEDGER_DRIVER_ENTRY)};
#define MEMLEDGER_RUNTIME_ENTRY(name) {#name, nullptr, 0, false, reinterpret_cast<void*>(&::name), &real_##name},
const HookEntry kRuntimeHooks[] = {MEMLEDGER_CUDA_RUNTIME_HOOKS(MEMLEDGER_RUNTIME_ENTRY)};

template <size_t N>
const HookEntry* find_by_name(const HookEntry (&table)[N], const char* name) {
  for (const HookEntry& e : table) {
    if (strcmp(e.name, name) == 0) return &e;
  }
  return nullptr;
}

bool is_wrapper(void* p) {
  for (const HookEntry& e : kDriverHooks) {
    if (e.wrapper == p) return true;
  }
  for (const HookEntry& e : kRuntimeHooks) {
    if (e.wrapper == p) return true;
  }
  return false;
}

// The shared object `p` lives in, by file name.
bool lives_in(void* p, const char* library) {
  Dl_info info;
  if (dladdr(p, &info) == 0 || info.dli_fname == nullptr) return false;
  return strstr(info.dli_fname, library) != nullptr;
}

void* find_real(std::atomic<void*>& slot, const char* name, bool runtime) {
  void* p = slot.load(std::memory_order_acquire);
  if (p != nullptr) return p;
  if (runtime) {
    // The next definition after memledger in the lookup order: libcudart.
    p = libc_dlsym(RTLD_NEXT, name);
  } else {
    // Found among the loaded objects: where no driver is loaded (a CUDA
    // build of a framework on a machine without a GPU, whose step ends
    // still look here), a dlopen(RTLD_NOLOAD) would fail and leave the
    // thread's dlerror state in a block the C library frees later for the
    // program: a free the trace never saw allocated.
    p = find_in_loaded_library(name, "libcuda");
  }
  if (p != nullptr && is_wrapper(p)) p = nullptr;
  if (p != nullptr) slot.store(p, std::memory_order_release);
  return p;
}

// Runtime functions found outside the global scope, by the caller's object:
// two runtimes may be loaded side by side (PyTorch's and the JAX plugin's),
// each caller gets the one it linked.
struct ScopedRuntime {
  memledger::interposer::SpinLock lock;
  struct Entry {
    const void* caller_base;
    const std::atomic<void*>* slot;
    void* fn;
  };
  Entry entries[64] = {};
  int count = 0;
};
ScopedRuntime g_scoped_runtime;
[[maybe_unused]] const bool g_scoped_runtime_fork = memledger::interposer::fork_held_locks().add(&g_scoped_runtime.lock);

void* scoped_runtime_lookup(const void* caller_base, const std::atomic<void*>* slot) {
  memledger::interposer::SpinGuard guard(g_scoped_runtime.lock);
  for (int i = 0; i < g_scoped_runtime.count; ++i) {
    const ScopedRuntime::Entry& e = g_scoped_runtime.entries[i];
    if (e.caller_base == caller_base && e.slot == slot) return e.fn;
  }
  return nullptr;
}

void scoped_runtime_store(const void* caller_base, const std::atomic<void*>* slot, void* fn) {
  memledger::interposer::SpinGuard guard(g_scoped_runtime.lock);
  const int n = g_scoped_runtime.count;
  // Full: the oldest entries make room (a look-up again costs only time).
  const int i = n < 64 ? n : static_cast<int>(reinterpret_cast<uintptr_t>(fn) >> 4) % 64;
  g_scoped_runtime.entries[i] = {caller_base, slot, fn};
  if (n < 64) g_scoped_runtime.count = n + 1;
}

// The real runtime function for a hook called from `caller`: the next
// definition after memledger in the global scope (cached for everyone), or
// else the runtime the caller's own object linked, as a library loaded
// RTLD_LOCAL sees it (cached per calling object, checked to be still loaded).
void* find_real_runtime(std::atomic<void*>& slot, const char* name, const void* caller) {
  void* p = slot.load(std::memory_order_acquire);
  if (p != nullptr) return p;
  Dl_info info;
  const void* caller_base = nullptr;
  if (caller != nullptr && dladdr(caller, &info) != 0) caller_base = info.dli_fbase;
  if (caller_base != nullptr) {
    p = scoped_runtime_lookup(caller_base, &slot);
    if (p != nullptr && lives_in(p, "libcudart")) return p;
  }
  p = find_real(slot, name, true);
  if (p != nullptr) return p;
  p = find_in_caller_scope(name, caller);
  if (p == nullptr) {
    // Any loaded libcudart: the last resort for a caller whose scope does
    // not hold the runtime (a function pointer handed around).
    p = find_in_loaded_library(name, "libcudart");
  }
  if (p == nullptr || is_wrapper(p)) return nullptr;
  if (caller_base != nullptr) scoped_runtime_store(caller_base, &slot, p);
  return p;
}

template <typename Fn>
Fn real_driver(std::atomic<void*>& slot, const char* name) {
  return reinterpret_cast<Fn>(find_real(slot, name, false));
}
template <typename Fn>
Fn real_runtime(std::atomic<void*>& slot, const char* name, const void* caller) {
  return reinterpret_cast<Fn>(find_real_runtime(slot, name, caller));
}

#define REAL_DRIVER(name) real_driver<decltype(&::name)>(real_##name, #name)
// In an exported hook: the caller's return address picks the runtime it linked.
#define REAL_RUNTIME(name) real_runtime<decltype(&::name)>(real_##name, #name, __builtin_return_address(0))

// Hands back memledger's wrapper for a real driver function obtained through
// cuGetProcAddress or cudaGetDriverEntryPoint. The exported name found by
// dladdr decides which ABI variant it is; failing that, the requested base
// name, CUDA version and per-thread flag do.
void* wrap_driver_pointer(const char* symbol, void* p, int version, cuuint64_t flags) {
  if (p == nullptr || is_wrapper(p)) return p;
  const HookEntry* entry = nullptr;
  Dl_info info;
  if (dladdr(p, &info) != 0 && info.dli_saddr == p && info.dli_sname != nullptr) {
    entry = find_by_name(kDriverHooks, info.dli_sname);
  }
  if (entry == nullptr && symbol != nullptr) {
    const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    for (const HookEntry& e : kDriverHooks) {
      if (strcmp(e.base, symbol) != 0 || e.version > version) continue;
      if (e.per_thread && !per_thread) continue;
      if (entry == nullptr || e.version > entry->version || (e.per_thread && !entry->per_thread)) entry = &e;
    }
  }
  if (entry == nullptr) return p;
  void* expected = nullptr;
  entry->real->compare_exchange_strong(expected, p, std::memory_order_acq_rel);
  return entry->wrapper;
}

// dlsym()/dlvsym() results for a hooked name inside libcuda or libcudart.
void* wrap_looked_up(const char* name, void* p) {
  if (p == nullptr || name == nullptr || name[0] != 'c' || is_wrapper(p)) return p;
  const HookEntry* entry = nullptr;
  if (name[2] == 'd') {
    entry = find_by_name(kRuntimeHooks, name);
    if (entry != nullptr && !lives_in(p, "libcudart")) entry = nullptr;
  } else {
    entry = find_by_name(kDriverHooks, name);
    if (entry != nullptr && !lives_in(p, "libcuda.so")) entry = nullptr;
  }
  if (entry == nullptr) return p;
  void* expected = nullptr;
  entry->real->compare_exchange_strong(expected, p, std::memory_order_acq_rel);
  return entry->wrapper;
}

// The device of the calling thread's current context (driver level).
int current_device() {
  using Fn = CUresult (*)(CUdevice*);
  auto fn = reinterpret_cast<Fn>(find_real(real_cuCtxGetDevice, "cuCtxGetDevice", false));
  CUdevice dev = 0;
  if (fn == nullptr || fn(&dev) != CUDA_SUCCESS) return 0;
  return dev;
}

int runtime_device() {
  using Fn = cudaError_t (*)(int*);
  auto fn = reinterpret_cast<Fn>(find_real(real_cudaGetDevice, "cudaGetDevice", true));
  int dev = 0;
  if (fn == nullptr || fn(&dev) != cudaSuccess) return current_device();
  return dev;
}

// What a pool's allocations are: its location and allocation type decide
// (CUDA 13 has host, NUMA and managed pools beside the devices' ones), never
// the device current when it is used.
struct PoolLabel {
  Kind kind;
  int device;  // -1: a host location, or managed memory without one
};

// Pools seen, with their label, for the allocations' labels and the
// step-time samples.
struct PoolTable {
  memledger::interposer::SpinLock lock;
  CUmemoryPool pools[64] = {};
  PoolLabel labels[64] = {};
  int count = 0;
  uint64_t devices_seen = 0;  // bit per device ordinal
};
PoolTable g_pools;
[[maybe_unused]] const bool g_pools_fork = memledger::interposer::fork_held_locks().add(&g_pools.lock);

void note_device(int device) {
  if (device >= 0 && device < 64) {
    __atomic_fetch_or(&g_pools.devices_seen, uint64_t{1} << device, __ATOMIC_RELAXED);
  }
}

void note_pool(CUmemoryPool pool, PoolLabel label) {
  if (pool == nullptr) return;
  memledger::interposer::SpinGuard guard(g_pools.lock);
  for (int i = 0; i < g_pools.count; ++i) {
    if (g_pools.pools[i] == pool) return;
  }
  if (g_pools.count < 64) {
    g_pools.pools[g_pools.count] = pool;
    g_pools.labels[g_pools.count] = label;
    ++g_pools.count;
  }
}

bool known_pool(CUmemoryPool pool, PoolLabel* label) {
  memledger::interposer::SpinGuard guard(g_pools.lock);
  for (int i = 0; i < g_pools.count; ++i) {
    if (g_pools.pools[i] == pool) {
      *label = g_pools.labels[i];
      return true;
    }
  }
  return false;
}

void forget_pool(CUmemoryPool pool) {
  memledger::interposer::SpinGuard guard(g_pools.lock);
  for (int i = 0; i < g_pools.count; ++i) {
    if (g_pools.pools[i] == pool) {
      g_pools.pools[i] = g_pools.pools[g_pools.count - 1];
      g_pools.labels[i] = g_pools.labels[g_pools.count - 1];
      --g_pools.count;
      return;
    }
  }
}

// CUmemPoolProps (and CUmemAllocationProp) start with the allocation type,
// the handle types, then the location.
PoolLabel label_from_props(const void* props) {
  if (props == nullptr) return {Kind::kDevice, 0};
  PropsPrefix prefix;
  memcpy(&prefix, props, sizeof prefix);
  const int device = prefix.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prefix.location.id : -1;
  if (prefix.type == CU_MEM_ALLOCATION_TYPE_MANAGED) return {Kind::kManaged, device};
  return {device >= 0 ? Kind::kDevice : Kind::kPinnedHost, device};
}

// A pool memledger did not see created: one of the default pools (found by
// asking the driver for each location's), else one created before
// memledger started, taken for the current device's.
PoolLabel discover_pool(CUmemoryPool pool) {
  using DevicePool = CUresult (*)(CUmemoryPool*, CUdevice);
  using LocationPool = CUresult (*)(CUmemoryPool*, MemLocation*, int);
  auto device_pool = reinterpret_cast<DevicePool>(find_real(real_cuDeviceGetMemPool, "cuDeviceGetMemPool", false));
  auto default_pool =
      reinterpret_cast<DevicePool>(find_real(real_cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", false));
  auto location_pool =
      reinterpret_cast<LocationPool>(find_real(real_cuMemGetDefaultMemPool, "cuMemGetDefaultMemPool", false));
  for (int dev = 0; dev < 64; ++dev) {
    CUmemoryPool p = nullptr, q = nullptr;
    const bool exists = default_pool != nullptr && default_pool(&p, dev) == CUDA_SUCCESS;
    if (exists && p == pool) return {Kind::kDevice, dev};
    if (device_pool != nullptr && device_pool(&q, dev) == CUDA_SUCCESS && q == pool) return {Kind::kDevice, dev};
    if (!exists) break;
    MemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, dev};
    if (location_pool != nullptr && location_pool(&p, &loc, CU_MEM_ALLOCATION_TYPE_MANAGED) == CUDA_SUCCESS &&
        p == pool) {
      return {Kind::kManaged, dev};
    }
  }
  if (location_pool != nullptr) {
    const struct {
      MemLocation loc;
      int type;
      PoolLabel label;
    } others[] = {
        {{CU_MEM_LOCATION_TYPE_HOST, 0}, CU_MEM_ALLOCATION_TYPE_PINNED, {Kind::kPinnedHost, -1}},
        {{CU_MEM_LOCATION_TYPE_HOST, 0}, CU_MEM_ALLOCATION_TYPE_MANAGED, {Kind::kManaged, -1}},
        {{CU_MEM_LOCATION_TYPE_NONE, 0}, CU_MEM_ALLOCATION_TYPE_MANAGED, {Kind::kManaged, -1}},
    };
    for (const auto& o : others) {
      MemLocation loc = o.loc;
      CUmemoryPool p = nullptr;
      if (location_pool(&p, &loc, o.type) == CUDA_SUCCESS && p == pool) return o.label;
    }
  }
  return {Kind::kDevice, current_device()};
}

PoolLabel pool_label(CUmemoryPool pool) {
  PoolLabel label;
  if (known_pool(pool, &label)) return label;
  label = discover_pool(pool);
  note_pool(pool, label);
  return label;
}

// What the allocation hooks ask the driver about a stream's device and a
// device's current pool is kept: each changes only through a call hooked
// here. A stream's device is fixed for its life, and its handle can name
// another stream only after cuStreamDestroy or the end of its context
// (cuCtxDestroy, cuDevicePrimaryCtxRelease/Reset, cuGreenCtxDestroy); a
// device's current pool changes by cuDeviceSetMemPool, cuMemSetMemPool or
// cuMemPoolDestroy of that pool. Each of those calls moves the generation
// on before and after its real call, and what was kept under an older
// generation is asked again.
std::atomic<uint64_t> g_device_generation{1};

void device_state_changes() { g_device_generation.fetch_add(1, std::memory_order_acq_rel); }

// The calling thread's last streams and their devices.
struct KnownStream {
  CUstream stream;
  uint64_t generation;
  int device;
};
constexpr int kKnownStreams = 4;
__thread KnownStream tls_streams[kKnownStreams] __attribute__((tls_model("initial-exec")));

int ask_stream_device(CUstream stream);

// The device a stream belongs to. The default streams (NULL, legacy,
// per-thread) are the current context's.
int stream_device(CUstream stream) {
  if (stream == nullptr || stream == kStreamLegacy || stream == kStreamPerThread) return current_device();
  const uint64_t generation = g_device_generation.load(std::memory_order_acquire);
  KnownStream& known = tls_streams[(reinterpret_cast<uintptr_t>(stream) >> 4) % kKnownStreams];
  if (known.stream == stream && known.generation == generation) return known.device;
  const int device = ask_stream_device(stream);
  known = {stream, generation, device};
  return device;
}

// The device a stream belongs to, asked without touching the calling
// thread's current context: cuStreamGetDevice (drivers from 12.8), else the
// stream's context (cuStreamGetCtx) and that context's device
// (cuCtxGetDevice_v2, CUDA 13), else the current context's.
int ask_stream_device(CUstream stream) {
  using GetDevice = CUresult (*)(CUstream, CUdevice*);
  using GetCtx = CUresult (*)(CUstream, CUcontext*);
  using CtxDevice = CUresult (*)(CUdevice*, CUcontext);
  CUdevice dev = 0;
  auto get_device = reinterpret_cast<GetDevice>(find_real(real_cuStreamGetDevice, "cuStreamGetDevice", false));
  if (get_device != nullptr && get_device(stream, &dev) == CUDA_SUCCESS) return dev;
  auto get_ctx = reinterpret_cast<GetCtx>(find_real(real_cuStreamGetCtx, "cuStreamGetCtx", false));
  auto ctx_device = reinterpret_cast<CtxDevice>(find_real(real_cuCtxGetDevice_v2, "cuCtxGetDevice_v2", false));
  CUcontext ctx = nullptr;
  if (get_ctx != nullptr && ctx_device != nullptr && get_ctx(stream, &ctx) == CUDA_SUCCESS && ctx != nullptr &&
      ctx_device(&dev, ctx) == CUDA_SUCCESS) {
    return dev;
  }
  return current_device();
}

// Each device's current pool's label, kept (see g_device_generation): the
// generation it was asked under (bits 24..63, 0: nothing kept), the kind
// (bits 16..23) and the device + 1 (bits 0..15).
constexpr int kKnownPoolDevices = 64;
std::atomic<uint64_t> g_known_pools[kKnownPoolDevices];

// What cuMemAllocAsync on a stream of `device` allocates: memory of the pool
// current to that device (cuDeviceSetMemPool may have replaced the default
// one), labelled by the pool's location and allocation type.
PoolLabel device_pool_label(int device) {
  const uint64_t generation = g_device_generation.load(std::memory_order_acquire) & ((uint64_t{1} << 40) - 1);
  std::atomic<uint64_t>* known = device >= 0 && device < kKnownPoolDevices ? &g_known_pools[device] : nullptr;
  if (known != nullptr) {
    const uint64_t word = known->load(std::memory_order_acquire);
    if (word >> 24 == generation) {
      return {static_cast<Kind>((word >> 16) & 0xff), static_cast<int>(word & 0xffff) - 1};
    }
  }
  using DevicePool = CUresult (*)(CUmemoryPool*, CUdevice);
  auto device_pool = reinterpret_cast<DevicePool>(find_real(real_cuDeviceGetMemPool, "cuDeviceGetMemPool", false));
  CUmemoryPool pool = nullptr;
  if (device_pool == nullptr || device_pool(&pool, device) != CUDA_SUCCESS || pool == nullptr) {
    return {Kind::kDevice, device};
  }
  const PoolLabel label = pool_label(pool);
  if (known != nullptr && label.device >= -1 && label.device < 0xffff) {
    known->store(generation << 24 | uint64_t{static_cast<uint8_t>(label.kind)} << 16 |
                     static_cast<uint64_t>(label.device + 1),
                 std::memory_order_release);
  }
  return label;
}

// Whether `stream` is being captured into a graph (cuStreamGetCaptureInfo,
// which stream capture allows at any time): the capture status, and the
// graph in *graph. A _ptsz call's NULL stream is the per-thread one; the
// legacy stream is never captured and is not asked about.
int capture_status(CUstream stream, bool per_thread, uint64_t* graph) {
  *graph = 0;
  if (stream == nullptr && per_thread) stream = kStreamPerThread;
  if (stream == nullptr || stream == kStreamLegacy) return 0;
  using InfoV3 = CUresult (*)(CUstream, int*, cuuint64_t*, CUgraph*, const void**, const void**, size_t*);
  using InfoV2 = CUresult (*)(CUstream, int*, cuuint64_t*, CUgraph*, const void**, size_t*);
  int status = 0;
  CUgraph g = nullptr;
  if (auto v3 = reinterpret_cast<InfoV3>(
          find_real(real_cuStreamGetCaptureInfo_v3, "cuStreamGetCaptureInfo_v3", false))) {
    if (v3(stream, &status, nullptr, &g, nullptr, nullptr, nullptr) != CUDA_SUCCESS) return 0;
  } else if (auto v2 = reinterpret_cast<InfoV2>(
                 find_real(real_cuStreamGetCaptureInfo_v2, "cuStreamGetCaptureInfo_v2", false))) {
    if (v2(stream, &status, nullptr, &g, nullptr, nullptr) != CUDA_SUCCESS) return 0;
  } else {
    return 0;
  }
  *graph = reinterpret_cast<uint64_t>(g);
  return status;
}

// Stream captures begun and not yet seen to end, in the whole process
// (cuStreamBeginCapture*, cuStreamEndCapture*: every way a capture starts
// or ends). While there are none, no stream is being captured, and an
// allocation need not ask the driver. Counted up before a begin and down
// only once the stream is seen to have left capture, so the count is never
// below the captures under way.
std::atomic<int64_t> g_captures{0};

// The graph `stream` is actively being captured into, or 0.
uint64_t capturing_graph(CUstream stream, bool per_thread) {
  if (g_captures.load(std::memory_order_acquire) <= 0) return 0;
  uint64_t graph = 0;
  return capture_status(stream, per_thread, &graph) == CU_STREAM_CAPTURE_STATUS_ACTIVE ? graph : 0;
}

// The driver calls the step-end samples make, resolved once.
struct SampleCalls {
  CUresult (*get_info)(size_t*, size_t*);
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*device_count)(int*);
  CUresult (*primary_state)(CUdevice, unsigned int*, int*);
  CUresult (*primary_retain)(CUcontext*, CUdevice);
  CUresult (*primary_release)(CUdevice);
  CUresult (*push)(CUcontext);
  CUresult (*pop)(CUcontext*);
  CUresult (*graph_attr)(CUdevice, int, void*);
};

SampleCalls sample_calls() {
  SampleCalls c{};
#define MEMLEDGER_SAMPLE_CALL(field, slot, name) \
  c.field = reinterpret_cast<decltype(c.field)>(find_real(slot, name, false))
  MEMLEDGER_SAMPLE_CALL(get_info, real_cuMemGetInfo_v2, "cuMemGetInfo_v2");
  MEMLEDGER_SAMPLE_CALL(ctx_get_current, real_cuCtxGetCurrent, "cuCtxGetCurrent");
  MEMLEDGER_SAMPLE_CALL(device_count, real_cuDeviceGetCount, "cuDeviceGetCount");
  MEMLEDGER_SAMPLE_CALL(primary_state, real_cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
  MEMLEDGER_SAMPLE_CALL(primary_retain, real_cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  MEMLEDGER_SAMPLE_CALL(primary_release, real_cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2");
  MEMLEDGER_SAMPLE_CALL(push, real_cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2");
  MEMLEDGER_SAMPLE_CALL(pop, real_cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2");
  MEMLEDGER_SAMPLE_CALL(graph_attr, real_cuDeviceGetGraphMemAttribute, "cuDeviceGetGraphMemAttribute");
#undef MEMLEDGER_SAMPLE_CALL
  return c;
}

// Devices whose graph memory was last sampled non-zero (bit per ordinal):
// a drop to zero is sampled too.
uint64_t g_graph_memory_seen = 0;

// One device's free/total and CUDA graph memory (reserved, used), with a
// context of that device current.
void sample_one_device(ThreadState& t, const SampleCalls& c, int device) {
  size_t free_bytes = 0, total_bytes = 0;
  if (c.get_info != nullptr && c.get_info(&free_bytes, &total_bytes) == CUDA_SUCCESS) {
    recorder().on_device_event(t, EventType::kDeviceSample, device, free_bytes, total_bytes, 0);
  }
  uint64_t reserved = 0, used = 0;
  if (c.graph_attr == nullptr || device < 0 || device >= 64 ||
      c.graph_attr(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS ||
      c.graph_attr(device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS) {
    return;
  }
  const uint64_t bit = uint64_t{1} << device;
  const bool nonzero = reserved != 0 || used != 0;
  const uint64_t before = nonzero ? __atomic_fetch_or(&g_graph_memory_seen, bit, __ATOMIC_RELAXED)
                                  : __atomic_fetch_and(&g_graph_memory_seen, ~bit, __ATOMIC_RELAXED);
  if (!nonzero && (before & bit) == 0) return;
  recorder().on_device_event(t, EventType::kPoolSample, device, fmt::kGraphMemoryPool, reserved, used);
}

// Device-wide memory of every device the program uses: the calling
// thread's current context's device, then each device whose primary
// context is active, made current for the query and put back. The sampling
// thread needs no context of its own, and no device is initialised here
// (an inactive primary context is skipped, never created).
void sample_device_memory(ThreadState& t) {
  const SampleCalls c = sample_calls();
  uint64_t sampled = 0;
  CUcontext current = nullptr;
  if (c.ctx_get_current != nullptr && c.ctx_get_current(&current) == CUDA_SUCCESS && current != nullptr) {
    const int device = current_device();
    sample_one_device(t, c, device);
    if (device >= 0 && device < 64) sampled |= uint64_t{1} << device;
  }
  int count = 0;
  if (c.device_count == nullptr || c.primary_state == nullptr || c.primary_retain == nullptr ||
      c.primary_release == nullptr || c.push == nullptr || c.pop == nullptr || c.device_count(&count) != CUDA_SUCCESS) {
    return;
  }
  for (int device = 0; device < count && device < 64; ++device) {
    unsigned int flags = 0;
    int active = 0;
    if ((sampled >> device & 1) || c.primary_state(device, &flags, &active) != CUDA_SUCCESS || !active) continue;
    CUcontext ctx = nullptr;
    if (c.primary_retain(&ctx, device) != CUDA_SUCCESS) continue;
    if (c.push(ctx) == CUDA_SUCCESS) {
      sample_one_device(t, c, device);
      CUcontext popped = nullptr;
      c.pop(&popped);
    }
    c.primary_release(device);
  }
}

// At every step end, from the program's own thread (never at exit): device
// memory of every device in use (sample_device_memory) and reserved/used
// bytes of every pool.
void sample_devices() {
  if (!g_cuda_used.load(std::memory_order_relaxed)) return;
  memledger::interposer::note_cuda_stack(nullptr, 0);
  HookGuard guard;
  if (!guard.entered()) return;
  ThreadState& t = guard.thread();
  using PoolAttr = CUresult (*)(CUmemoryPool, int, void*);
  using DefaultPool = CUresult (*)(CUmemoryPool*, CUdevice);
  auto pool_attr = reinterpret_cast<PoolAttr>(find_real(real_cuMemPoolGetAttribute, "cuMemPoolGetAttribute", false));
  auto default_pool =
      reinterpret_cast<DefaultPool>(find_real(real_cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", false));
  sample_device_memory(t);
  if (default_pool != nullptr) {
    uint64_t seen = __atomic_load_n(&g_pools.devices_seen, __ATOMIC_RELAXED);
    for (int dev = 0; dev < 64; ++dev) {
      CUmemoryPool pool = nullptr;
      if ((seen >> dev & 1) && default_pool(&pool, dev) == CUDA_SUCCESS) note_pool(pool, {Kind::kDevice, dev});
    }
  }
  if (pool_attr == nullptr) return;
  CUmemoryPool pools[64];
  PoolLabel labels[64];
  int count;
  {
    memledger::interposer::SpinGuard lock(g_pools.lock);
    count = g_pools.count;
    memcpy(pools, g_pools.pools, sizeof(CUmemoryPool) * static_cast<size_t>(count));
    memcpy(labels, g_pools.labels, sizeof(PoolLabel) * static_cast<size_t>(count));
  }
  for (int i = 0; i < count; ++i) {
    // Pool samples are device memory held (the report's held device bytes):
    // host and managed pools' reserves are not.
    if (labels[i].kind != Kind::kDevice) continue;
    uint64_t reserved = 0, used = 0;
    if (pool_attr(pools[i], CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == CUDA_SUCCESS &&
        pool_attr(pools[i], CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) == CUDA_SUCCESS) {
      recorder().on_device_event(t, EventType::kPoolSample, labels[i].device, reinterpret_cast<uint64_t>(pools[i]),
                                 reserved, used);
    }
  }
}

// Guard for a driver-level hook: records only when the thread is not inside
// memledger and not inside a hooked runtime call (which records for it).
class DriverScope {
 public:
  DriverScope() : guard_() {
    g_cuda_used.store(true, std::memory_order_relaxed);
    record_ = guard_.entered() && guard_.thread().cuda_depth == 0 && recorder().active();
  }
  bool record() const { return record_; }
  // Also inside a hooked runtime call: for the ledger's frees of handles
  // recorded at the driver level.
  bool may_record() const { return guard_.entered() && recorder().active(); }
  ThreadState& thread() { return guard_.thread(); }

 private:
  HookGuard guard_;
  bool record_;
};

// Guard for a runtime-level hook: records, and hides the driver call below.
class RuntimeScope {
 public:
  RuntimeScope() : t_(memledger::interposer::thread_state()) {
    g_cuda_used.store(true, std::memory_order_relaxed);
    record_ = t_.in_hook == 0 && t_.cuda_depth == 0 && recorder().active();
    ++t_.cuda_depth;
  }
  ~RuntimeScope() { --t_.cuda_depth; }
  bool record() const { return record_; }
  // Records with the recursion flag set (stack capture, ring push).
  template <typename F>
  void with_guard(F&& f) {
    HookGuard guard;
    if (guard.entered()) f(guard.thread());
  }

 private:
  ThreadState& t_;
  bool record_;
};

void driver_alloc(DriverScope& s, Kind kind, int device, uint64_t addr, uint64_t size, uint32_t flags,
                  CUresult r) {
  if (!s.record()) return;
  note_device(device);
  recorder().on_device_alloc(s.thread(), kind, device, addr, size, flags, r);
  note_first_call("a driver allocation", r);
}

// A free-type call: numbered before the real call (so that an allocation
// reusing the address on another thread comes after it), recorded only when
// the real call succeeded.
template <typename Call>
CUresult driver_free(DriverScope& s, Kind kind, uint64_t addr, uint32_t flags, Call&& call) {
  const uint64_t seq = s.record() && addr != 0 ? recorder().next_seq() : 0;
  const CUresult r = call();
  if (seq != 0 && r == CUDA_SUCCESS) recorder().on_device_free(s.thread(), kind, addr, flags, seq);
  return r;
}

void runtime_alloc(RuntimeScope& s, Kind kind, int device, uint64_t addr, uint64_t size, uint32_t flags,
                   cudaError_t r) {
  if (!s.record()) return;
  note_device(device);
  s.with_guard([&](ThreadState& t) { recorder().on_device_alloc(t, kind, device, addr, size, flags, r); });
  note_first_call("a runtime allocation", r);
}

template <typename Call>
cudaError_t runtime_free(RuntimeScope& s, Kind kind, uint64_t addr, uint32_t flags, Call&& call) {
  const uint64_t seq = s.record() && addr != 0 ? recorder().next_seq() : 0;
  const cudaError_t r = call();
  if (seq != 0 && r == cudaSuccess) {
    s.with_guard([&](ThreadState& t) { recorder().on_device_free(t, kind, addr, flags, seq); });
  }
  return r;
}

int location_device(const void* props) {
  if (props == nullptr) return 0;
  MemLocation loc;
  memcpy(&loc, static_cast<const char*>(props) + kPropsLocationOffset, sizeof loc);
  return loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1;
}

__attribute__((constructor(102))) void install_step_hook() { recorder().set_step_hook(sample_devices); }

}  // namespace

// ---------------------------------------------------------------------------
// Driver API

// The CUPTI module starts here: after the driver is up, before the program
// can have allocated anything through it.
MEMLEDGER_EXPORT CUresult cuInit(unsigned int flags) {
  auto real = REAL_DRIVER(cuInit);
  if (real == nullptr) return 3;
  CUresult r = real(flags);
  if (r == CUDA_SUCCESS) memledger::interposer::cupti_on_cuda_init();
  note_first_call("cuInit", r);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemAlloc_v2);
  if (real == nullptr) return 3;  // CUDA_ERROR_NOT_INITIALIZED
  CUresult r = real(dptr, bytesize);
  driver_alloc(s, Kind::kDevice, current_device(), r == CUDA_SUCCESS ? *dptr : 0, bytesize, 0, r);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemFree_v2);
  if (real == nullptr) return 3;
  return driver_free(s, Kind::kDevice, dptr, 0, [&] { return real(dptr); });
}

MEMLEDGER_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                             unsigned int element_size) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemAllocPitch_v2);
  if (real == nullptr) return 3;
  CUresult r = real(dptr, pitch, width, height, element_size);
  const uint64_t bytes = r == CUDA_SUCCESS && pitch ? *pitch * height : width * height;
  driver_alloc(s, Kind::kDevice, current_device(), r == CUDA_SUCCESS ? *dptr : 0, bytes, 0, r);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemAllocManaged);
  if (real == nullptr) return 3;
  CUresult r = real(dptr, bytesize, flags);
  driver_alloc(s, Kind::kManaged, current_device(), r == CUDA_SUCCESS ? *dptr : 0, bytesize, 0, r);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemAllocHost_v2);
  if (real == nullptr) return 3;
  CUresult r = real(pp, bytesize);
  driver_alloc(s, Kind::kPinnedHost, -1, r == CUDA_SUCCESS ? reinterpret_cast<uint64_t>(*pp) : 0, bytesize, 0, r);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemHostAlloc);
  if (real == nullptr) return 3;
  CUresult r = real(pp, bytesize, flags);
  driver_alloc(s, Kind::kPinnedHost, -1, r == CUDA_SUCCESS ? reinterpret_cast<uint64_t>(*pp) : 0, bytesize, 0, r);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemFreeHost(void* p) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemFreeHost);
  if (real == nullptr) return 3;
  return driver_free(s, Kind::kPinnedHost, reinterpret_cast<uint64_t>(p), 0, [&] { return real(p); });
}

MEMLEDGER_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemHostRegister_v2);
  if (real == nullptr) return 3;
  CUresult r = real(p, bytesize, flags);
  driver_alloc(s, Kind::kPinnedHost, -1, reinterpret_cast<uint64_t>(p), bytesize, fmt::kAllocRegistered, r);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemHostUnregister(void* p) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemHostUnregister);
  if (real == nullptr) return 3;
  return driver_free(s, Kind::kPinnedHost, reinterpret_cast<uint64_t>(p), fmt::kAllocRegistered,
                     [&] { return real(p); });
}

namespace {

// An allocation made while its stream is captured is an allocation node of
// the graph (graph_ledger.h): nothing is allocated now; each launch of the
// graph records it, with this stack.
void note_captured_alloc(ThreadState&, uint64_t graph, const PoolLabel& label, uint64_t addr, uint64_t size) {
  note_device(label.device);
  graph_ledger().captured_alloc(graph, label.kind, label.device, addr, size, recorder().capture_stack());
}

template <typename Fn>
CUresult alloc_async(Fn real, CUdeviceptr* dptr, size_t bytesize, CUstream stream, bool per_thread) {
  DriverScope s;
  if (real == nullptr) return 3;
  CUresult r = real(dptr, bytesize, stream);
  if (!s.record()) return r;
  const PoolLabel label = device_pool_label(stream_device(stream));
  if (const uint64_t graph = r == CUDA_SUCCESS ? capturing_graph(stream, per_thread) : 0) {
    note_captured_alloc(s.thread(), graph, label, *dptr, bytesize);
    return r;
  }
  driver_alloc(s, label.kind, label.device, r == CUDA_SUCCESS ? *dptr : 0, bytesize,
               fmt::kAllocAsync | fmt::kAllocPool, r);
  return r;
}

// A free captured into a graph frees nothing now: each launch does.
template <typename Fn>
CUresult free_async(Fn real, CUdeviceptr dptr, CUstream stream, bool per_thread) {
  DriverScope s;
  if (real == nullptr) return 3;
  if (const uint64_t graph = s.record() ? capturing_graph(stream, per_thread) : 0) {
    const CUresult r = real(dptr, stream);
    if (r == CUDA_SUCCESS) graph_ledger().captured_free(graph, dptr);
    return r;
  }
  return driver_free(s, Kind::kDevice, dptr, fmt::kAllocAsync, [&] { return real(dptr, stream); });
}

template <typename Fn>
CUresult alloc_from_pool(Fn real, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream,
                         bool per_thread) {
  DriverScope s;
  if (real == nullptr) return 3;
  CUresult r = real(dptr, bytesize, pool, stream);
  if (!s.record()) return r;
  const PoolLabel label = pool_label(pool);
  if (const uint64_t graph = r == CUDA_SUCCESS ? capturing_graph(stream, per_thread) : 0) {
    note_captured_alloc(s.thread(), graph, label, *dptr, bytesize);
    return r;
  }
  driver_alloc(s, label.kind, label.device, r == CUDA_SUCCESS ? *dptr : 0, bytesize,
               fmt::kAllocAsync | fmt::kAllocPool, r);
  return r;
}

}  // namespace

MEMLEDGER_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return alloc_async(REAL_DRIVER(cuMemAllocAsync), dptr, bytesize, stream, false);
}
MEMLEDGER_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return alloc_async(REAL_DRIVER(cuMemAllocAsync_ptsz), dptr, bytesize, stream, true);
}
MEMLEDGER_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return free_async(REAL_DRIVER(cuMemFreeAsync), dptr, stream, false);
}
MEMLEDGER_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return free_async(REAL_DRIVER(cuMemFreeAsync_ptsz), dptr, stream, true);
}
MEMLEDGER_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                  CUstream stream) {
  return alloc_from_pool(REAL_DRIVER(cuMemAllocFromPoolAsync), dptr, bytesize, pool, stream, false);
}
MEMLEDGER_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                       CUstream stream) {
  return alloc_from_pool(REAL_DRIVER(cuMemAllocFromPoolAsync_ptsz), dptr, bytesize, pool, stream, true);
}

// ---------------------------------------------------------------------------
// Stream capture and CUDA graphs (graph_ledger.h)

namespace {

template <typename Fn, typename... Args>
CUresult begin_capture(Fn real, Args... args) {
  DriverScope s;
  if (real == nullptr) return 3;
  g_captures.fetch_add(1, std::memory_order_acq_rel);
  const CUresult r = real(args...);
  if (r != CUDA_SUCCESS) g_captures.fetch_sub(1, std::memory_order_acq_rel);
  return r;
}

// A capture that failed (invalidated) leaves no graph: its nodes go. The
// capture count goes down when the stream was captured before the call and
// is not after it (an end from the wrong thread, or on a stream that only
// joined the capture, leaves it under way).
template <typename Fn>
CUresult end_capture(Fn real, CUstream stream, CUgraph* graph, bool per_thread) {
  DriverScope s;
  if (real == nullptr) return 3;
  uint64_t captured = 0, after = 0;
  const int before = capture_status(stream, per_thread, &captured);
  const CUresult r = real(stream, graph);
  if (before != 0 && capture_status(stream, per_thread, &after) == 0) {
    g_captures.fetch_sub(1, std::memory_order_acq_rel);
  }
  if (r != CUDA_SUCCESS && captured != 0 && s.may_record()) graph_ledger().graph_destroyed(captured);
  return r;
}

void note_instantiated(DriverScope& s, CUresult r, CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  if (r != CUDA_SUCCESS || exec == nullptr || !s.may_record()) return;
  graph_ledger().instantiated(reinterpret_cast<uint64_t>(*exec), reinterpret_cast<uint64_t>(graph),
                              (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0);
}

template <typename Fn>
CUresult instantiate_with_params(Fn real, CUgraphExec* exec, CUgraph graph, void* params) {
  DriverScope s;
  if (real == nullptr) return 3;
  const CUresult r = real(exec, graph, params);
  // CUDA_GRAPH_INSTANTIATE_PARAMS starts with the flags (cuuint64_t).
  cuuint64_t flags = 0;
  if (params != nullptr) memcpy(&flags, params, sizeof flags);
  note_instantiated(s, r, exec, graph, flags);
  return r;
}

struct GraphLaunch {
  DriverScope* scope;
};

// Auto-free on launch: the previous launch's allocations that the graph
// does not free itself and that are still live are freed first.
void record_auto_free(void* context, const GraphLedger::Node& n, bool auto_free) {
  auto* launch = static_cast<GraphLaunch*>(context);
  if (!auto_free || !n.is_alloc || n.freed_in_graph) return;
  if (!memledger::interposer::live_ledger().contains(0, n.addr)) return;
  recorder().on_device_free(launch->scope->thread(), static_cast<Kind>(n.kind), n.addr,
                            fmt::kAllocAsync | fmt::kAllocGraph);
}

// The launch's allocations and frees, in capture order; the allocations
// carry their capture site's stack.
void record_graph_node(void* context, const GraphLedger::Node& n, bool) {
  auto* launch = static_cast<GraphLaunch*>(context);
  ThreadState& t = launch->scope->thread();
  if (n.is_alloc) {
    recorder().on_device_alloc(t, static_cast<Kind>(n.kind), n.device, n.addr, n.size,
                               fmt::kAllocAsync | fmt::kAllocGraph, 0, n.stack);
  } else {
    recorder().on_device_free(t, static_cast<Kind>(n.kind), n.addr, fmt::kAllocAsync | fmt::kAllocGraph);
  }
}

// A launch into a stream that is itself being captured runs nothing now
// (it becomes a node of the outer graph).
template <typename Fn>
CUresult graph_launch(Fn real, CUgraphExec exec, CUstream stream, bool per_thread) {
  DriverScope s;
  if (real == nullptr) return 3;
  const CUresult r = real(exec, stream);
  if (r != CUDA_SUCCESS || !s.record() || capturing_graph(stream, per_thread) != 0) return r;
  GraphLaunch launch{&s};
  const uint64_t key = reinterpret_cast<uint64_t>(exec);
  graph_ledger().launch(key, record_auto_free, &launch);
  graph_ledger().launch(key, record_graph_node, &launch);
  return r;
}

}  // namespace

MEMLEDGER_EXPORT CUresult cuStreamBeginCapture(CUstream stream) {
  return begin_capture(REAL_DRIVER(cuStreamBeginCapture), stream);
}
MEMLEDGER_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
  return begin_capture(REAL_DRIVER(cuStreamBeginCapture_ptsz), stream);
}
MEMLEDGER_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
  return begin_capture(REAL_DRIVER(cuStreamBeginCapture_v2), stream, mode);
}
MEMLEDGER_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode) {
  return begin_capture(REAL_DRIVER(cuStreamBeginCapture_v2_ptsz), stream, mode);
}
MEMLEDGER_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                                      const void* edges, size_t count, int mode) {
  return begin_capture(REAL_DRIVER(cuStreamBeginCaptureToGraph), stream, graph, deps, edges, count, mode);
}
MEMLEDGER_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                                           const void* edges, size_t count, int mode) {
  return begin_capture(REAL_DRIVER(cuStreamBeginCaptureToGraph_ptsz), stream, graph, deps, edges, count, mode);
}
MEMLEDGER_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return end_capture(REAL_DRIVER(cuStreamEndCapture), stream, graph, false);
}
MEMLEDGER_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return end_capture(REAL_DRIVER(cuStreamEndCapture_ptsz), stream, graph, true);
}

MEMLEDGER_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  DriverScope s;
  auto real = REAL_DRIVER(cuGraphInstantiateWithFlags);
  if (real == nullptr) return 3;
  const CUresult r = real(exec, graph, flags);
  note_instantiated(s, r, exec, graph, flags);
  return r;
}
MEMLEDGER_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph, void* params) {
  return instantiate_with_params(REAL_DRIVER(cuGraphInstantiateWithParams), exec, graph, params);
}
MEMLEDGER_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph, void* params) {
  return instantiate_with_params(REAL_DRIVER(cuGraphInstantiateWithParams_ptsz), exec, graph, params);
}
MEMLEDGER_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node, char* log,
                                                size_t log_size) {
  DriverScope s;
  auto real = REAL_DRIVER(cuGraphInstantiate_v2);
  if (real == nullptr) return 3;
  const CUresult r = real(exec, graph, error_node, log, log_size);
  note_instantiated(s, r, exec, graph, 0);
  return r;
}

MEMLEDGER_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return graph_launch(REAL_DRIVER(cuGraphLaunch), exec, stream, false);
}
MEMLEDGER_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return graph_launch(REAL_DRIVER(cuGraphLaunch_ptsz), exec, stream, true);
}

MEMLEDGER_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  DriverScope s;
  auto real = REAL_DRIVER(cuGraphExecDestroy);
  if (real == nullptr) return 3;
  const CUresult r = real(exec);
  if (r == CUDA_SUCCESS && s.may_record()) graph_ledger().exec_destroyed(reinterpret_cast<uint64_t>(exec));
  return r;
}

// Destroying a graph frees none of its live allocations (they are freed
// by cuMemFreeAsync, cuMemFree or another graph's free node).
MEMLEDGER_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
  DriverScope s;
  auto real = REAL_DRIVER(cuGraphDestroy);
  if (real == nullptr) return 3;
  const CUresult r = real(graph);
  if (r == CUDA_SUCCESS && s.may_record()) graph_ledger().graph_destroyed(reinterpret_cast<uint64_t>(graph));
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const void* props) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemPoolCreate);
  if (real == nullptr) return 3;
  CUresult r = real(pool, props);
  if (r == CUDA_SUCCESS && pool != nullptr) note_pool(*pool, label_from_props(props));
  return r;
}

namespace {

// A call that may change a stream's device or a device's current pool
// (g_device_generation).
template <typename Fn, typename... Args>
CUresult changing_device_state(Fn real, Args... args) {
  DriverScope s;
  if (real == nullptr) return 3;
  device_state_changes();
  const CUresult r = real(args...);
  device_state_changes();
  return r;
}

}  // namespace

MEMLEDGER_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  auto real = REAL_DRIVER(cuMemPoolDestroy);
  if (real != nullptr) forget_pool(pool);
  return changing_device_state(real, pool);
}
MEMLEDGER_EXPORT CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool) {
  return changing_device_state(REAL_DRIVER(cuDeviceSetMemPool), device, pool);
}
MEMLEDGER_EXPORT CUresult cuMemSetMemPool(void* location, int type, CUmemoryPool pool) {
  return changing_device_state(REAL_DRIVER(cuMemSetMemPool), location, type, pool);
}
MEMLEDGER_EXPORT CUresult cuStreamDestroy(CUstream stream) {
  return changing_device_state(REAL_DRIVER(cuStreamDestroy), stream);
}
MEMLEDGER_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
  return changing_device_state(REAL_DRIVER(cuStreamDestroy_v2), stream);
}
MEMLEDGER_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return changing_device_state(REAL_DRIVER(cuCtxDestroy), ctx); }
MEMLEDGER_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  return changing_device_state(REAL_DRIVER(cuCtxDestroy_v2), ctx);
}
MEMLEDGER_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  return changing_device_state(REAL_DRIVER(cuDevicePrimaryCtxRelease), device);
}
MEMLEDGER_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  return changing_device_state(REAL_DRIVER(cuDevicePrimaryCtxRelease_v2), device);
}
MEMLEDGER_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice device) {
  return changing_device_state(REAL_DRIVER(cuDevicePrimaryCtxReset), device);
}
MEMLEDGER_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  return changing_device_state(REAL_DRIVER(cuDevicePrimaryCtxReset_v2), device);
}
MEMLEDGER_EXPORT CUresult cuGreenCtxDestroy(void* ctx) {
  return changing_device_state(REAL_DRIVER(cuGreenCtxDestroy), ctx);
}

MEMLEDGER_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const void* prop,
                                      unsigned long long flags) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemCreate);
  if (real == nullptr) return 3;
  CUresult r = real(handle, size, prop, flags);
  // Physical memory is counted here, by handle; a host (NUMA) location is
  // pinned host memory, not a device. Its free is decided by the ledger.
  const int device = location_device(prop);
  const Kind kind = device >= 0 ? Kind::kDevice : Kind::kPinnedHost;
  if (r == CUDA_SUCCESS && handle != nullptr && s.record()) vmm_ledger().created(*handle, kind, true);
  driver_alloc(s, kind, device, r == CUDA_SUCCESS && handle ? *handle : 0, size, fmt::kAllocPhysical, r);
  return r;
}

namespace {

void record_physical_free(DriverScope& s, Kind kind, uint64_t handle, uint64_t seq) {
  if (s.may_record()) recorder().on_device_free(s.thread(), kind, handle, fmt::kAllocPhysical, seq);
}

}  // namespace

// Drops one handle reference; the memory is freed only by the last one once
// nothing maps it (VmmLedger). Unknown handles (made before memledger
// started, or past the ledger's capacity) count as freed here.
MEMLEDGER_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemRelease);
  if (real == nullptr) return 3;
  const uint64_t seq = s.may_record() ? recorder().next_seq() : 0;
  const CUresult r = real(handle);
  if (r != CUDA_SUCCESS) return r;
  Kind kind = Kind::kDevice;
  switch (vmm_ledger().released(handle, &kind)) {
    case VmmLedger::Release::kFreed:
      record_physical_free(s, kind, handle, seq);
      break;
    case VmmLedger::Release::kUnknown:
      if (s.record()) record_physical_free(s, kind, handle, seq);
      break;
    case VmmLedger::Release::kKept:
      break;
  }
  return r;
}

// Takes a reference on the handle mapped at `addr` (NCCL frees its buffers
// so: retain, release, unmap, release).
MEMLEDGER_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemRetainAllocationHandle);
  if (real == nullptr) return 3;
  const CUresult r = real(handle, addr);
  if (r == CUDA_SUCCESS && handle != nullptr) vmm_ledger().retained(*handle);
  return r;
}

// Another reference to memory that some process made: to this process's
// own handle (a reference more), or to another's, which is tracked only so
// that its release is no free of this process's memory (DESIGN.md:
// imported handles are not the process's own allocations).
MEMLEDGER_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                                         int handle_type) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemImportFromShareableHandle);
  if (real == nullptr) return 3;
  const CUresult r = real(handle, os_handle, handle_type);
  if (r == CUDA_SUCCESS && handle != nullptr && !vmm_ledger().retained(*handle)) {
    vmm_ledger().created(*handle, Kind::kDevice, false);
  }
  return r;
}

// Exporting takes no reference (cuda.h: the memory is released once every
// shareable handle is closed *and* the allocation released; another
// process's reference keeps it on the device, not in this process's
// ledger). Hooked so that the handle is known as shared: its free is still
// decided by this process's own references.
MEMLEDGER_EXPORT CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                                       int handle_type, unsigned long long flags) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemExportToShareableHandle);
  if (real == nullptr) return 3;
  return real(shareable, handle, handle_type, flags);
}

// A multicast object is a handle without memory of its own (the memory
// bound to it is counted where it was created): tracked so that its
// cuMemRelease is not taken for a free.
MEMLEDGER_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle* handle, const void* prop) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMulticastCreate);
  if (real == nullptr) return 3;
  const CUresult r = real(handle, prop);
  if (r == CUDA_SUCCESS && handle != nullptr) vmm_ledger().created(*handle, Kind::kDevice, false);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                   unsigned long long flags) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemMap);
  if (real == nullptr) return 3;
  CUresult r = real(ptr, size, offset, handle, flags);
  if (r == CUDA_SUCCESS) vmm_ledger().mapped(ptr, size, handle);
  if (r == CUDA_SUCCESS && s.record()) {
    recorder().on_device_event(s.thread(), EventType::kMap, current_device(), ptr, size, handle);
  }
  return r;
}

namespace {

// Numbers taken before cuMemUnmap for the frees it may cause (see
// driver_free); more frees than this in one call are numbered after it.
constexpr uint64_t kUnmapNumbers = 8;

struct UnmapFrees {
  DriverScope* scope;
  uint64_t next_seq;
  uint64_t end_seq;
};

void record_unmap_free(void* context, const VmmLedger::Freed& freed) {
  auto* u = static_cast<UnmapFrees*>(context);
  const uint64_t seq = u->next_seq < u->end_seq ? u->next_seq++ : 0;
  record_physical_free(*u->scope, freed.kind, freed.handle, seq);
}

}  // namespace

MEMLEDGER_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemUnmap);
  if (real == nullptr) return 3;
  const uint64_t seq = s.may_record() ? recorder().next_seqs(1 + kUnmapNumbers) : 0;
  const CUresult r = real(ptr, size);
  if (r != CUDA_SUCCESS) return r;
  if (s.record()) recorder().on_device_event(s.thread(), EventType::kUnmap, 0, ptr, size, 0, seq);
  UnmapFrees frees{&s, seq != 0 ? seq + 1 : 0, seq != 0 ? seq + 1 + kUnmapNumbers : 0};
  vmm_ledger().unmapped(ptr, size, record_unmap_free, &frees);
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                              unsigned long long flags) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemAddressReserve);
  if (real == nullptr) return 3;
  CUresult r = real(ptr, size, alignment, addr, flags);
  if (r == CUDA_SUCCESS && ptr != nullptr && s.record()) {
    recorder().on_device_event(s.thread(), EventType::kReserve, current_device(), *ptr, size, 0);
  }
  return r;
}

MEMLEDGER_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  DriverScope s;
  auto real = REAL_DRIVER(cuMemAddressFree);
  if (real == nullptr) return 3;
  const uint64_t seq = s.record() ? recorder().next_seq() : 0;
  const CUresult r = real(ptr, size);
  if (seq != 0 && r == CUDA_SUCCESS) recorder().on_device_event(s.thread(), EventType::kUnreserve, 0, ptr, size, 0, seq);
  return r;
}

MEMLEDGER_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                              int* status) {
  auto real = REAL_DRIVER(cuGetProcAddress_v2);
  if (real == nullptr) return 3;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn != nullptr) {
    HookGuard guard;
    *pfn = wrap_driver_pointer(symbol, *pfn, version, flags);
  }
  return r;
}

MEMLEDGER_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  auto real = REAL_DRIVER(cuGetProcAddress);
  if (real == nullptr) return 3;
  CUresult r = real(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr) {
    HookGuard guard;
    *pfn = wrap_driver_pointer(symbol, *pfn, version, flags);
  }
  return r;
}

// ---------------------------------------------------------------------------
// Runtime API

MEMLEDGER_EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaMalloc);
  if (real == nullptr) return 35;  // cudaErrorInsufficientDriver
  cudaError_t r = real(ptr, size);
  runtime_alloc(s, Kind::kDevice, runtime_device(), r == cudaSuccess ? reinterpret_cast<uint64_t>(*ptr) : 0, size, 0,
                r);
  return r;
}

MEMLEDGER_EXPORT cudaError_t cudaFree(void* ptr) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaFree);
  if (real == nullptr) return 35;
  return runtime_free(s, Kind::kDevice, reinterpret_cast<uint64_t>(ptr), 0, [&] { return real(ptr); });
}

namespace {

template <typename Fn>
cudaError_t runtime_alloc_async(Fn real, void** ptr, size_t size, cudaStream_t stream, bool per_thread) {
  RuntimeScope s;
  if (real == nullptr) return 35;
  cudaError_t r = real(ptr, size, stream);
  if (!s.record()) return r;
  // The runtime's default streams are its current device's.
  const bool default_stream = stream == nullptr || stream == kStreamLegacy || stream == kStreamPerThread;
  PoolLabel label{Kind::kDevice, 0};
  uint64_t graph = 0;
  s.with_guard([&](ThreadState& t) {
    label = device_pool_label(default_stream ? runtime_device() : stream_device(stream));
    graph = r == cudaSuccess ? capturing_graph(stream, per_thread) : 0;
    if (graph != 0) note_captured_alloc(t, graph, label, reinterpret_cast<uint64_t>(*ptr), size);
  });
  if (graph != 0) return r;
  runtime_alloc(s, label.kind, label.device, r == cudaSuccess ? reinterpret_cast<uint64_t>(*ptr) : 0, size,
                fmt::kAllocAsync | fmt::kAllocPool, r);
  return r;
}

template <typename Fn>
cudaError_t runtime_free_async(Fn real, void* ptr, cudaStream_t stream, bool per_thread) {
  RuntimeScope s;
  if (real == nullptr) return 35;
  uint64_t graph = 0;
  if (s.record()) s.with_guard([&](ThreadState&) { graph = capturing_graph(stream, per_thread); });
  if (graph != 0) {
    const cudaError_t r = real(ptr, stream);
    if (r == cudaSuccess) graph_ledger().captured_free(graph, reinterpret_cast<uint64_t>(ptr));
    return r;
  }
  return runtime_free(s, Kind::kDevice, reinterpret_cast<uint64_t>(ptr), fmt::kAllocAsync,
                      [&] { return real(ptr, stream); });
}

template <typename Fn>
cudaError_t runtime_alloc_from_pool(Fn real, void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream,
                                    bool per_thread) {
  RuntimeScope s;
  if (real == nullptr) return 35;
  cudaError_t r = real(ptr, size, pool, stream);
  if (!s.record()) return r;
  PoolLabel label{Kind::kDevice, 0};
  uint64_t graph = 0;
  s.with_guard([&](ThreadState& t) {
    label = pool_label(pool);
    graph = r == cudaSuccess ? capturing_graph(stream, per_thread) : 0;
    if (graph != 0) note_captured_alloc(t, graph, label, reinterpret_cast<uint64_t>(*ptr), size);
  });
  if (graph != 0) return r;
  runtime_alloc(s, label.kind, label.device, r == cudaSuccess ? reinterpret_cast<uint64_t>(*ptr) : 0, size,
                fmt::kAllocAsync | fmt::kAllocPool, r);
  return r;
}

}  // namespace

MEMLEDGER_EXPORT cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  return runtime_alloc_async(REAL_RUNTIME(cudaMallocAsync), ptr, size, stream, false);
}
MEMLEDGER_EXPORT cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream) {
  return runtime_alloc_async(REAL_RUNTIME(cudaMallocAsync_ptsz), ptr, size, stream, true);
}
MEMLEDGER_EXPORT cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  return runtime_free_async(REAL_RUNTIME(cudaFreeAsync), ptr, stream, false);
}
MEMLEDGER_EXPORT cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream) {
  return runtime_free_async(REAL_RUNTIME(cudaFreeAsync_ptsz), ptr, stream, true);
}
MEMLEDGER_EXPORT cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool,
                                                     cudaStream_t stream) {
  return runtime_alloc_from_pool(REAL_RUNTIME(cudaMallocFromPoolAsync), ptr, size, pool, stream, false);
}
MEMLEDGER_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t pool,
                                                          cudaStream_t stream) {
  return runtime_alloc_from_pool(REAL_RUNTIME(cudaMallocFromPoolAsync_ptsz), ptr, size, pool, stream, true);
}

MEMLEDGER_EXPORT cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int flags) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaMallocManaged);
  if (real == nullptr) return 35;
  cudaError_t r = real(ptr, size, flags);
  runtime_alloc(s, Kind::kManaged, runtime_device(), r == cudaSuccess ? reinterpret_cast<uint64_t>(*ptr) : 0, size, 0,
                r);
  return r;
}

MEMLEDGER_EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaMallocHost);
  if (real == nullptr) return 35;
  cudaError_t r = real(ptr, size);
  runtime_alloc(s, Kind::kPinnedHost, -1, r == cudaSuccess ? reinterpret_cast<uint64_t>(*ptr) : 0, size, 0, r);
  return r;
}

MEMLEDGER_EXPORT cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaHostAlloc);
  if (real == nullptr) return 35;
  cudaError_t r = real(ptr, size, flags);
  runtime_alloc(s, Kind::kPinnedHost, -1, r == cudaSuccess ? reinterpret_cast<uint64_t>(*ptr) : 0, size, 0, r);
  return r;
}

MEMLEDGER_EXPORT cudaError_t cudaFreeHost(void* ptr) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaFreeHost);
  if (real == nullptr) return 35;
  return runtime_free(s, Kind::kPinnedHost, reinterpret_cast<uint64_t>(ptr), 0, [&] { return real(ptr); });
}

MEMLEDGER_EXPORT cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaHostRegister);
  if (real == nullptr) return 35;
  cudaError_t r = real(ptr, size, flags);
  runtime_alloc(s, Kind::kPinnedHost, -1, reinterpret_cast<uint64_t>(ptr), size, fmt::kAllocRegistered, r);
  return r;
}

MEMLEDGER_EXPORT cudaError_t cudaHostUnregister(void* ptr) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaHostUnregister);
  if (real == nullptr) return 35;
  return runtime_free(s, Kind::kPinnedHost, reinterpret_cast<uint64_t>(ptr), fmt::kAllocRegistered,
                      [&] { return real(ptr); });
}

MEMLEDGER_EXPORT cudaError_t cudaMallocPitch(void** ptr, size_t* pitch, size_t width, size_t height) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaMallocPitch);
  if (real == nullptr) return 35;
  cudaError_t r = real(ptr, pitch, width, height);
  const uint64_t bytes = r == cudaSuccess && pitch ? *pitch * height : width * height;
  runtime_alloc(s, Kind::kDevice, runtime_device(), r == cudaSuccess ? reinterpret_cast<uint64_t>(*ptr) : 0, bytes, 0,
                r);
  return r;
}

MEMLEDGER_EXPORT cudaError_t cudaMalloc3D(PitchedPtr* pitched, Extent extent) {
  RuntimeScope s;
  auto real = REAL_RUNTIME(cudaMalloc3D);
  if (real == nullptr) return 35;
  cudaError_t r = real(pitched, extent);
  const uint64_t bytes =
      (r == cudaSuccess && pitched ? pitched->pitch : extent.width) * extent.height * (extent.depth ? extent.depth : 1);
  runtime_alloc(s, Kind::kDevice, runtime_device(),
                r == cudaSuccess && pitched ? reinterpret_cast<uint64_t>(pitched->ptr) : 0, bytes, 0, r);
  return r;
}

MEMLEDGER_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                                     int* status) {
  auto real = REAL_RUNTIME(cudaGetDriverEntryPoint);
  if (real == nullptr) return 35;
  cudaError_t r = real(symbol, fn, flags, status);
  if (r == cudaSuccess && fn != nullptr) {
    HookGuard guard;
    *fn = wrap_driver_pointer(symbol, *fn, 1 << 30, flags);
  }
  return r;
}

MEMLEDGER_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                                              unsigned long long flags, int* status) {
  auto real = REAL_RUNTIME(cudaGetDriverEntryPointByVersion);
  if (real == nullptr) return 35;
  cudaError_t r = real(symbol, fn, version, flags, status);
  if (r == cudaSuccess && fn != nullptr) {
    HookGuard guard;
    *fn = wrap_driver_pointer(symbol, *fn, static_cast<int>(version), flags);
  }
  return r;
}

// Often the program's first CUDA call (torch.cuda.is_available(), a
// runtime program's first check): where a runtime refuses an older driver.
MEMLEDGER_EXPORT cudaError_t cudaGetDeviceCount(int* count) {
  auto real = REAL_RUNTIME(cudaGetDeviceCount);
  if (real == nullptr) return 35;
  const cudaError_t r = real(count);
  note_first_call("cudaGetDeviceCount", r);
  return r;
}

// ---------------------------------------------------------------------------
// dlsym / dlvsym
//
// RTLD_NEXT look-ups are resolved relative to the caller's object, which
// glibc finds from the return address: those calls jump straight to libc's
// function (a tail jump keeps the caller's return address), so another
// interposer's dlsym(RTLD_NEXT, ...) still finds what lies after *it*.

//
// RTLD_DEFAULT look-ups are also resolved from the caller's scope: called
// from here, libc would search only the global scope (libmemledger's), and a
// library loaded RTLD_LOCAL would no longer find its own dependencies. The
// global scope is searched first, then the caller's object and its
// dependencies, which is the order of such a library's scopes. The other
// handles name their object and need no caller.

namespace {

void* default_scope_lookup(const char* name, const char* version, const void* caller) {
  void* p = version == nullptr ? libc_dlsym(RTLD_DEFAULT, name)
                               : libc_dlvsym(RTLD_DEFAULT, name, version);
  if (p != nullptr || name == nullptr) return p;
  p = find_in_caller_scope(name, caller, version);
  // The failed search sets the error dlerror() reports, as libc's would have.
  if (p == nullptr) (void)libc_dlsym(RTLD_DEFAULT, name);
  return p;
}

}  // namespace

extern "C" __attribute__((visibility("hidden"), used)) void* memledger_dlsym_impl(void* handle, const char* name) {
  // Reached by a tail jump from dlsym: the return address is the caller's.
  void* p = handle == RTLD_DEFAULT ? default_scope_lookup(name, nullptr, __builtin_return_address(0))
                                   : libc_dlsym(handle, name);
  if (p == nullptr || name == nullptr || name[0] != 'c') return p;
  HookGuard guard;
  return wrap_looked_up(name, memledger::interposer::wrap_library_lookup(name, p));
}

extern "C" __attribute__((visibility("hidden"), used)) void* memledger_dlvsym_impl(void* handle, const char* name,
                                                                            const char* version) {
  void* p = handle == RTLD_DEFAULT ? default_scope_lookup(name, version, __builtin_return_address(0))
                                   : libc_dlvsym(handle, name, version);
  if (p == nullptr || name == nullptr || name[0] != 'c') return p;
  HookGuard guard;
  return wrap_looked_up(name, memledger::interposer::wrap_library_lookup(name, p));
}

__asm__(
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym, @function\n"
    "dlsym:\n"
    "  cmpq $-1, %rdi\n"
    "  jne memledger_dlsym_impl\n"
    "  pushq %rdi\n"
    "  pushq %rsi\n"
    "  pushq %rdx\n"
    "  call memledger_libc_dlsym_address\n"
    "  popq %rdx\n"
    "  popq %rsi\n"
    "  popq %rdi\n"
    "  jmp *%rax\n"
    ".size dlsym, .-dlsym\n"
    ".globl dlvsym\n"
    ".type dlvsym, @function\n"
    "dlvsym:\n"
    "  cmpq $-1, %rdi\n"
    "  jne memledger_dlvsym_impl\n"
    "  pushq %rdi\n"
    "  pushq %rsi\n"
    "  pushq %rdx\n"
    "  call memledger_libc_dlvsym_address\n"
    "  popq %rdx\n"
    "  popq %rsi\n"
    "  popq %rdi\n"
    "  jmp *%rax\n"
    ".size dlvsym, .-dlvsym\n");

// The hook lists as data, for the test that checks every hook is exported.
#define MEMLEDGER_DRIVER_NAME(name, ...) #name,
#define MEMLEDGER_RUNTIME_NAME(name) #name,
extern "C" __attribute__((visibility("default"))) const char* const memledger_cuda_hook_names[] = {
    MEMLEDGER_CUDA_DRIVER_HOOKS(MEMLEDGER_DRIVER_NAME) MEMLEDGER_CUDA_RUNTIME_HOOKS(MEMLEDGER_RUNTIME_NAME) nullptr};
