#include "driver_state.h"

#include <pthread.h>
#include <sys/mman.h>

#include <cstdlib>
#include <iterator>

namespace memledger::simcuda {
namespace {

long env_number(const char* name, long fallback, long min, long max) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < min || value > max) return fallback;
  return value;
}

CallCounter g_counters[static_cast<int>(Sym::kCount)];

// The per-thread context stack.
constexpr int kStackDepth = 32;
struct ContextStack {
  Context* entries[kStackDepth];
  int depth;
};
thread_local ContextStack t_stack = {};

}  // namespace

std::atomic<unsigned long long> g_proc_address_lookups{0};

const Config& config() {
  static const Config instance = [] {
    Config c;
    c.device_count = static_cast<int>(env_number("SIMCUDA_DEVICES", c.device_count, 0, kMaxDevices));
    // At least one granule; at most 1 TiB so that 4x of it stays mappable.
    c.memory_bytes = static_cast<size_t>(env_number("SIMCUDA_MEMORY_MB", 1024, 2, 1 << 20)) * kMiB;
    c.driver_version = static_cast<int>(env_number("SIMCUDA_DRIVER_VERSION", c.driver_version, 1000, 99990));
    c.context_bytes = static_cast<size_t>(env_number("SIMCUDA_CONTEXT_MB", 0, 0, 1 << 20)) * kMiB;
    c.crash_in_alloc = env_number("SIMCUDA_CRASH_IN_ALLOC", 0, 0, 1) != 0;
    return c;
  }();
  return instance;
}

namespace {

// Around fork the driver lock is held, so that the child never inherits it
// locked by a thread that does not exist there.
void lock_before_fork() { state().mu.lock(); }
void unlock_in_parent() { state().mu.unlock(); }
void unlock_in_child() {
  State& st = state();
  st.forked_child = st.initialized;
  st.initialized = false;
  st.mu.unlock();
}

}  // namespace

State& state() {
  // Never destroyed: programs (and tracers) may still call the driver from
  // atexit handlers and static destructors.
  static State* instance = [] {
    State* st = internal_new<State>();
    pthread_atfork(lock_before_fork, unlock_in_parent, unlock_in_child);
    return st;
  }();
  return *instance;
}

CallCounter& counter(Sym sym) { return g_counters[static_cast<int>(sym)]; }

Call::Call(Sym sym) : st(state()), lock_(st.mu) { counter(sym).total++; }

CUresult Call::initialized() const { return st.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

CUresult Call::current(Context** out) const {
  if (!st.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Context* ctx = current_context();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = ctx;
  return CUDA_SUCCESS;
}

CUresult Call::device(CUdevice ordinal, Device** out) const {
  if (!st.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= st.device_count) return CUDA_ERROR_INVALID_DEVICE;
  *out = &st.devices[ordinal];
  return CUDA_SUCCESS;
}

CUresult Call::stream_context(CUstream stream, Context** out) const {
  if (!st.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return current(out);
  auto* s = reinterpret_cast<Stream*>(stream);
  if (st.streams.count(s) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (!s->context->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = s->context;
  return CUDA_SUCCESS;
}

Stream* Call::stream_object(CUstream stream) const {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return nullptr;
  auto* s = reinterpret_cast<Stream*>(stream);
  return st.streams.count(s) != 0 ? s : nullptr;
}

CUresult Call::context(CUcontext handle, Context** out) const {
  if (!st.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr) return current(out);
  auto* ctx = reinterpret_cast<Context*>(handle);
  if (st.contexts.count(ctx) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = ctx;
  return CUDA_SUCCESS;
}

CUresult Call::pool(CUmemoryPool handle, MemPool** out) const {
  if (!st.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  auto* pool = reinterpret_cast<MemPool*>(handle);
  if (pool == nullptr || st.pools.count(pool) == 0 || pool->destroyed) return CUDA_ERROR_INVALID_VALUE;
  *out = pool;
  return CUDA_SUCCESS;
}

Context* current_context() { return t_stack.depth > 0 ? t_stack.entries[t_stack.depth - 1] : nullptr; }

void set_current_context(Context* ctx) {
  if (t_stack.depth == 0) {
    if (ctx == nullptr) return;
    t_stack.depth = 1;
  }
  t_stack.entries[t_stack.depth - 1] = ctx;
  // cuCtxSetCurrent(NULL) leaves nothing current: drop the empty top.
  if (ctx == nullptr) --t_stack.depth;
}

bool push_context(Context* ctx) {
  if (t_stack.depth == kStackDepth) return false;
  t_stack.entries[t_stack.depth++] = ctx;
  return true;
}

Context* pop_context() { return t_stack.depth > 0 ? t_stack.entries[--t_stack.depth] : nullptr; }

void forget_context(Context* ctx) {
  int kept = 0;
  for (int i = 0; i < t_stack.depth; ++i) {
    if (t_stack.entries[i] != ctx) t_stack.entries[kept++] = t_stack.entries[i];
  }
  t_stack.depth = kept;
}

CUresult free_block(State& st, uintptr_t addr) {
  auto it = st.blocks.find(addr);
  if (it == st.blocks.end()) return CUDA_ERROR_INVALID_VALUE;
  const Block block = it->second;
  st.blocks.erase(it);
  if (block.kind == BlockKind::kGraph) {
    free_graph_block(st, addr, block);
    return CUDA_SUCCESS;
  }
  if (block.kind == BlockKind::kPool) {
    MemPool* pool = block.pool;
    pool->release_block(addr, block.held);
    if (pool->destroyed && pool->live_blocks() == 0) {
      st.pools.erase(pool);
      internal_delete(pool);
    }
    return CUDA_SUCCESS;
  }
  block.device->unhold(block.held);
  if (block.low32) {
    discard_pages(addr, block.held);
    st.low32.release(addr, block.held);
  } else {
    block.device->unmap_linear(addr, block.held);
  }
  return CUDA_SUCCESS;
}

void tear_down(State& st, Context* ctx) {
  for (auto it = st.blocks.begin(); it != st.blocks.end();) {
    const uintptr_t addr = it->first;
    const bool owned = it->second.context == ctx;
    ++it;  // free_block erases addr
    if (owned) free_block(st, addr);
  }
  for (auto it = st.host_blocks.begin(); it != st.host_blocks.end();) {
    if (it->second.context == ctx) {
      munmap(reinterpret_cast<void*>(it->first), it->second.mapped);
      it = st.host_blocks.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = st.streams.begin(); it != st.streams.end();) {
    if ((*it)->context == ctx) {
      end_capture(st, *it);
      internal_delete(*it);
      it = st.streams.erase(it);
    } else {
      ++it;
    }
  }
  if (ctx->alive) ctx->device->unhold(config().context_bytes);
  ctx->alive = false;
}

void trim_pools_after_sync(State& st, Device* device) {
  for (MemPool* pool : st.pools) {
    if (&pool->device() == device) pool->trim_after_sync();
  }
}

CUcontext to_handle(Context* ctx) { return reinterpret_cast<CUcontext>(ctx); }
CUstream to_handle(Stream* stream) { return reinterpret_cast<CUstream>(stream); }
CUmemoryPool to_handle(MemPool* pool) { return reinterpret_cast<CUmemoryPool>(pool); }

}  // namespace memledger::simcuda
