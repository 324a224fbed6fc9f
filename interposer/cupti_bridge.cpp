// The preload library's side of the CUPTI module (cupti_tracer/).
//
// At the first successful cuInit, the module libmemledger_cupti.so is looked
// for next to libmemledger.so and dlopen'ed; it gets the host table below,
// through which its records reach the recorder. The preload library has no
// link dependency on it, on CUDA or on CUPTI: without the module, or with
// `--cupti off`, nothing of CUPTI is loaded and a status record says why.
#include "cupti_bridge.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cupti_host.h"
#include "libc_symbols.h"
#include "recorder.h"
#include "spin_lock.h"
#include "trace_format.h"

namespace memledger::interposer {

namespace {

constexpr size_t kSettingSize = 1024;
char g_mode[16];
char g_cupti_path[kSettingSize];
char g_nvtx_pattern[kSettingSize];
char g_kernel_pattern[kSettingSize];
MemledgerCuptiHost g_host;
std::atomic<bool> g_host_ready{false};
SpinLock g_host_lock;
[[maybe_unused]] const bool g_host_lock_fork = fork_held_locks().add(&g_host_lock);
std::atomic<int> g_loaded{0};  // 0 not tried, 1 trying or done

}  // namespace

// The module's stop function, once it is loaded (also for the hooks below).
MemledgerCuptiStopFn g_stop = nullptr;

namespace {

const char* setting(const char* name, char* out, size_t size) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] == '\0') return nullptr;
  snprintf(out, size, "%s", value);
  return out;
}

int host_active() { return recorder().active() ? 1 : 0; }

int host_enter() {
  ThreadState& t = thread_state();
  if (t.in_hook) return 0;
  t.in_hook = 1;
  return 1;
}

void host_leave(int entered) {
  if (entered) thread_state().in_hook = 0;
}

void host_message(const char* text) {
  char line[2200];
  const int n = snprintf(line, sizeof line, "memledger: %s\n", text);
  if (n > 0) {
    const size_t len = static_cast<size_t>(n) < sizeof line ? static_cast<size_t>(n) : sizeof line - 1;
    ssize_t ignored = write(2, line, len);
    (void)ignored;
  }
}

// The module's callbacks run with the thread marked as inside memledger
// (its allocations are not the program's); recording needs the mark too.
template <typename F>
void with_thread(F&& f) {
  if (!recorder().active()) return;
  ThreadState& t = thread_state();
  const uint8_t saved = t.in_hook;
  t.in_hook = 1;
  f(t);
  t.in_hook = saved;
}

void host_status(int status, const char* text, const char* holder, uint32_t version) {
  with_thread([&](ThreadState& t) {
    Event e{};
    e.type = EventType::kCuptiStatus;
    e.ts = monotonic_ns();
    e.kind = static_cast<uint8_t>(status);
    e.size = version;
    e.aux = recorder().intern_string(text);
    e.stack = holder != nullptr ? recorder().intern_string(holder) : 0;
    recorder().on_external_event(t, e);
  });
}

void host_memory(const MemledgerCuptiMemory* m) {
  with_thread([&](ThreadState& t) {
    Event e{};
    e.type = EventType::kCuptiMemory;
    e.ts = m->ts_ns;
    e.addr = m->address;
    e.size = m->bytes;
    e.weight = m->pc;
    e.aux = m->device;
    e.stack = m->correlation;
    e.kind = m->kind;
    e.flags = static_cast<uint8_t>((m->release & 1) | (m->async & 1) << 1 | (m->pool_type & 3) << 2);
    e.source = m->memory_kind;
    // A module static is never stream-ordered: its stream slot carries the
    // variable's name instead.
    if (format::is_module_static(m->memory_kind)) {
      e.tid = m->name != nullptr ? recorder().intern_string(m->name) : 0;
    } else {
      e.tid = m->stream;
    }
    recorder().on_external_event(t, e);
  });
}

void host_pool(const MemledgerCuptiPool* p) {
  with_thread([&](ThreadState& t) {
    Event e{};
    e.type = EventType::kCuptiPool;
    e.ts = p->ts_ns;
    e.addr = p->address;
    e.size = p->size;
    e.weight = p->utilized;
    e.aux = p->device;
    e.kind = p->operation;
    e.flags = p->pool_type;
    e.stack = static_cast<uint32_t>(p->release_threshold);
    e.tid = static_cast<uint32_t>(p->release_threshold >> 32);
    recorder().on_external_event(t, e);
  });
}

void host_dropped(uint64_t records) {
  with_thread([&](ThreadState& t) {
    Event e{};
    e.type = EventType::kCuptiDropped;
    e.ts = monotonic_ns();
    e.size = records;
    recorder().on_external_event(t, e);
  });
}

void host_step(const char* label, int source) {
  if (!recorder().active()) return;
  // on_step takes its own guard and, for NVTX steps, samples device memory
  // from this (the program's) thread: leave the module's mark for its span.
  ThreadState& t = thread_state();
  const uint8_t saved = t.in_hook;
  t.in_hook = 0;
  recorder().on_step(label, source == MEMLEDGER_STEP_KERNEL ? format::StepSource::kKernel : format::StepSource::kNvtx);
  t.in_hook = saved;
}

const MemledgerCuptiHost* host_table() {
  if (g_host_ready.load(std::memory_order_acquire)) return &g_host;
  SpinGuard guard(g_host_lock);
  if (!g_host_ready.load(std::memory_order_relaxed)) {
    MemledgerCuptiHost& h = g_host;
    h.size = sizeof(MemledgerCuptiHost);
    h.version = MEMLEDGER_CUPTI_HOST_VERSION;
    h.active = host_active;
    h.enter = host_enter;
    h.leave = host_leave;
    h.message = host_message;
    h.status = host_status;
    h.memory = host_memory;
    h.pool = host_pool;
    h.dropped = host_dropped;
    h.step = host_step;
    h.mode = setting("MEMLEDGER_CUPTI", g_mode, sizeof g_mode);
    if (h.mode == nullptr) h.mode = "auto";
    h.cupti_path = setting("MEMLEDGER_CUPTI_PATH", g_cupti_path, sizeof g_cupti_path);
    h.nvtx_pattern = setting("MEMLEDGER_STEPS_NVTX", g_nvtx_pattern, sizeof g_nvtx_pattern);
    h.kernel_pattern = setting("MEMLEDGER_STEPS_KERNEL", g_kernel_pattern, sizeof g_kernel_pattern);
    g_host_ready.store(true, std::memory_order_release);
  }
  return &g_host;
}

// libmemledger_cupti.so: $MEMLEDGER_CUPTI_MODULE, else next to this library
// (installed), else in the build tree's cupti_tracer/ folder.
void* open_module(char* tried, size_t tried_size) {
  char candidate[4200];
  const char* forced = getenv("MEMLEDGER_CUPTI_MODULE");
  if (forced != nullptr && forced[0] != '\0') {
    snprintf(tried, tried_size, "%s", forced);
    return dlopen(forced, RTLD_NOW | RTLD_LOCAL);
  }
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&host_table), &info) == 0 || info.dli_fname == nullptr) return nullptr;
  const char* slash = strrchr(info.dli_fname, '/');
  const int dir_len = slash != nullptr ? static_cast<int>(slash - info.dli_fname) : 1;
  const char* dir = slash != nullptr ? info.dli_fname : ".";
  tried[0] = '\0';
  for (const char* relative : {"/libmemledger_cupti.so", "/../cupti_tracer/libmemledger_cupti.so"}) {
    snprintf(candidate, sizeof candidate, "%.*s%s", dir_len, dir, relative);
    const size_t used = strlen(tried);
    snprintf(tried + used, tried_size - used, "%s%s", used ? ", " : "", candidate);
    if (void* handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL)) return handle;
  }
  return nullptr;
}

}  // namespace

void cupti_on_cuda_init() {
  if (g_loaded.load(std::memory_order_acquire) != 0) return;
  int expected = 0;
  if (!g_loaded.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  if (!recorder().active()) return;
  const MemledgerCuptiHost* host = host_table();
  ThreadState& t = thread_state();
  const uint8_t saved = t.in_hook;
  t.in_hook = 1;
  if (strcmp(host->mode, "off") == 0) {
    t.in_hook = saved;
    host_status(MEMLEDGER_CUPTI_OFF, "CUPTI is off (--cupti off): device memory is seen by the CUDA hooks only",
                nullptr, 0);
    return;
  }
  char tried[8600];
  void* module = open_module(tried, sizeof tried);
  MemledgerCuptiStartFn start = nullptr;
  if (module != nullptr) {
    start = reinterpret_cast<MemledgerCuptiStartFn>(dlsym(module, "memledger_cupti_start"));
    g_stop = reinterpret_cast<MemledgerCuptiStopFn>(dlsym(module, "memledger_cupti_stop"));
  }
  if (start == nullptr) {
    const char* why = dlerror();
    char text[9000];
    snprintf(text, sizeof text,
             "CUPTI is not used: memledger's CUPTI module was not found or does not load (%s%s%s); device memory is "
             "seen by the CUDA hooks only",
             tried, why ? ": " : "", why ? why : "");
    t.in_hook = saved;
    if (strcmp(host->mode, "on") == 0) host_message(text);
    host_status(MEMLEDGER_CUPTI_UNAVAILABLE, text, nullptr, 0);
    return;
  }
  t.in_hook = saved;
  start(host);
  // A forked child inherits none of CUPTI's threads: its copy stops quietly.
  pthread_atfork(nullptr, nullptr, [] {
    if (g_stop != nullptr) g_stop(2);
  });
}

}  // namespace memledger::interposer

extern "C" __attribute__((visibility("default"))) const MemledgerCuptiHost* memledger_cupti_host() {
  return memledger::interposer::host_table();
}

// Another tool of the program (PyTorch's profiler, linked against libcupti)
// asks for the CUPTI subscriber slot that memledger holds: memledger flushes
// what it has, lets go of the slot and of its activity kinds, and the tool
// subscribes as if memledger were not there. The report says from when on
// CUPTI's view is missing. Handles and callbacks are passed through untouched.
namespace {

using SubscribeFn = int (*)(void*, void*, void*);
using SubscribeV2Fn = int (*)(void*, void*, void*, void*);
constexpr int kCuptiErrorNotInitialized = 15;

uintptr_t object_base(const void* p) {
  Dl_info info;
  return p != nullptr && dladdr(p, &info) != 0 ? reinterpret_cast<uintptr_t>(info.dli_fbase) : 0;
}

// The libcupti function `name` that the client calling from `caller` would
// reach without memledger. dlsym(RTLD_NEXT) searches the global scope only,
// which holds libcupti when the program links it. PyTorch's client (Kineto,
// in libtorch_cuda.so) comes with an extension module that Python loads
// RTLD_LOCAL: its libcupti is in the caller's own scope (its object and
// dependencies) and nowhere else. Last, any other loaded object defining it.
void* real_cupti(const char* name, const void* caller) {
  using namespace memledger::interposer;
  const uintptr_t self = object_base(reinterpret_cast<const void*>(&object_base));
  // A failing dlsym allocates its message: not the program's memory.
  HookGuard guard;
  void* anywhere = find_in_loaded_objects(name, self != 0 ? self : 1);
  if (libc_dlsym_address() == nullptr || anywhere == nullptr) return anywhere;
  auto found = [self](void* p) { return p != nullptr && object_base(p) != self; };
  void* p = libc_dlsym(RTLD_NEXT, name);
  if (!found(p)) {
    p = find_in_caller_scope(name, caller);
    if (!found(p)) p = anywhere;
    (void)dlerror();  // the failed look-ups are memledger's, not the program's
  }
  return p;
}

void hand_over_cupti() {
  if (memledger::interposer::g_stop != nullptr) memledger::interposer::g_stop(1);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int cuptiSubscribe(void* subscriber, void* callback, void* userdata) {
  auto real = reinterpret_cast<SubscribeFn>(real_cupti("cuptiSubscribe", __builtin_return_address(0)));
  if (real == nullptr) return kCuptiErrorNotInitialized;
  hand_over_cupti();
  return real(subscriber, callback, userdata);
}

extern "C" __attribute__((visibility("default"))) int cuptiSubscribe_v2(void* subscriber, void* callback,
                                                                       void* userdata, void* params) {
  auto real = reinterpret_cast<SubscribeV2Fn>(real_cupti("cuptiSubscribe_v2", __builtin_return_address(0)));
  if (real == nullptr) return kCuptiErrorNotInitialized;
  hand_over_cupti();
  return real(subscriber, callback, userdata, params);
}
