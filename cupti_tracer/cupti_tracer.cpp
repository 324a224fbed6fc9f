#include "cupti_tracer.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "trace_format.h"

namespace memledger::cupti {

namespace {

CuptiTracer g_tracer;

// The recursion guard of the preload library, for the span of a callback:
// what CUPTI and libc allocate on our behalf is not the program's memory.
class HostScope {
 public:
  explicit HostScope(const MemledgerCuptiHost* host) : host_(host), entered_(host ? host->enter() : 0) {}
  ~HostScope() {
    if (host_ != nullptr) host_->leave(entered_);
  }

 private:
  const MemledgerCuptiHost* host_;
  int entered_;
};

uint64_t CUPTIAPI monotonic_timestamp() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  g_tracer.buffer_requested(buffer, size, max_records);
}

void CUPTIAPI on_buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  g_tracer.buffer_completed(context, stream, buffer, size, valid);
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || data == nullptr) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite == CUPTI_API_ENTER) g_tracer.on_launch(cb->symbolName);
}

// The kernel launch entry points of the driver (the runtime's launches end
// in them, so a launch is seen once).
constexpr CUpti_CallbackId kLaunchCallbacks[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
};

static_assert(static_cast<uint8_t>(format::CuptiMemoryKind::kDeviceStatic) == CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC);
static_assert(static_cast<uint8_t>(format::CuptiMemoryKind::kManagedStatic) == CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC);

// The trace's kind of a record. The module statics (DEVICE_STATIC,
// MANAGED_STATIC) count as device and managed memory here; the record keeps
// CUPTI's own kind beside it, which tells them apart.
uint8_t memory_kind(CUpti_ActivityMemoryKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED:
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC:
      return static_cast<uint8_t>(format::Kind::kManaged);
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED:
      return static_cast<uint8_t>(format::Kind::kPinnedHost);
    default:
      return static_cast<uint8_t>(format::Kind::kDevice);
  }
}

void exit_flush() { g_tracer.stop(kStopExit); }

// The CUDA driver the process loaded, for messages ("" when none is).
int find_driver(dl_phdr_info* info, size_t, void* data) {
  const char* name = info->dlpi_name;
  const char* base = name ? strrchr(name, '/') : nullptr;
  base = base ? base + 1 : name;
  if (base == nullptr || strncmp(base, "libcuda.so", 10) != 0) return 0;
  snprintf(static_cast<char*>(data), 512, "%s", name);
  return 1;
}

}  // namespace

CuptiTracer& tracer() { return g_tracer; }

int CuptiTracer::fail(int status, bool loud, const char* text, const char* holder) {
  status_ = status;
  if (loud) host_->message(text);
  host_->status(status, text, holder, lib_.version());
  state_.store(kDone, std::memory_order_release);
  return status;
}

int CuptiTracer::start(const MemledgerCuptiHost* host) {
  int expected = kIdle;
  if (!state_.compare_exchange_strong(expected, kStarting, std::memory_order_acq_rel)) return status_;
  if (host == nullptr || host->size < sizeof(MemledgerCuptiHost) || host->version != MEMLEDGER_CUPTI_HOST_VERSION) {
    state_.store(kDone, std::memory_order_release);
    return status_ = MEMLEDGER_CUPTI_FAILED;
  }
  host_ = host;
  HostScope scope(host);
  const char* mode = host->mode ? host->mode : "auto";
  const bool required = strcmp(mode, "on") == 0;
  if (strcmp(mode, "off") == 0) {
    return fail(MEMLEDGER_CUPTI_OFF, false, "CUPTI is off (--cupti off): device memory is seen by the CUDA hooks only");
  }

  char text[2048];
  char error[1536];
  const bool explicit_path = host->cupti_path != nullptr && host->cupti_path[0] != '\0';
  if (!lib_.load(host->cupti_path, error, sizeof error)) {
    snprintf(text, sizeof text, "CUPTI is not used: %s; device memory is seen by the CUDA hooks only", error);
    // auto: a machine without any CUPTI is not worth a line on stderr.
    const bool none_found = strncmp(error, "no libcupti found", 17) == 0;
    return fail(MEMLEDGER_CUPTI_UNAVAILABLE, required || explicit_path || !none_found, text);
  }

  if (host->kernel_pattern != nullptr && host->kernel_pattern[0] != '\0') {
    const int rc = regcomp(&kernel_regex_, host->kernel_pattern, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
      char why[256];
      regerror(rc, &kernel_regex_, why, sizeof why);
      snprintf(text, sizeof text, "--steps kernel:%s is not a valid regular expression (%s): no kernel steps",
               host->kernel_pattern, why);
      host->message(text);
    } else {
      kernel_steps_ = true;
    }
  }

  // The subscriber slot first: if another tool has it, nothing else of
  // CUPTI is touched (activity callbacks are process-wide as well).
  char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 1] = {};
  CUptiResult r;
  if (lib_.cuptiSubscribe_v2 != nullptr) {
    CUpti_SubscriberParams params{};
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "memledger";
    params.oldSubscriberName = holder;
    params.oldSubscriberSize = CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN;
    r = lib_.cuptiSubscribe_v2(&subscriber_, on_callback, nullptr, &params);
  } else {
    r = lib_.cuptiSubscribe(&subscriber_, on_callback, nullptr);
  }
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    const char* who = holder[0] != '\0' ? holder : "another tool (its name was not reported)";
    snprintf(text, sizeof text,
             "CUPTI is held by %s: memledger leaves it alone and goes on with its CUDA hooks only "
             "(no CUPTI cross-check%s)",
             who, kernel_steps_ ? ", no kernel steps" : "");
    return fail(MEMLEDGER_CUPTI_HELD, true, text, holder[0] != '\0' ? holder : nullptr);
  }
  if (r != CUPTI_SUCCESS) {
    subscriber_ = nullptr;
    const bool no_device = r == CUPTI_ERROR_NOT_INITIALIZED ||
                           r == CUPTI_ERROR_INVALID_DEVICE || r == CUPTI_ERROR_NOT_COMPATIBLE;
    char driver[512] = {};
    dl_iterate_phdr(find_driver, driver);
    snprintf(text, sizeof text,
             "CUPTI is not used: cuptiSubscribe failed with %s (%d)%s (CUPTI %s, CUDA driver %s); "
             "device memory is seen by the CUDA hooks only",
             lib_.result_name(r), static_cast<int>(r), no_device ? ": no usable CUDA driver or device" : "",
             lib_.path(), driver[0] ? driver : "not loaded");
    return fail(no_device ? MEMLEDGER_CUPTI_UNAVAILABLE : MEMLEDGER_CUPTI_FAILED, true, text);
  }

  const char* failed_call = nullptr;
  if (!pool_.init()) {
    failed_call = "mmap of the activity buffers";
    r = CUPTI_SUCCESS;
  }
  if (failed_call == nullptr && lib_.cuptiActivityRegisterTimestampCallback != nullptr) {
    // Records carry CLOCK_MONOTONIC, the clock of every other trace event.
    r = lib_.cuptiActivityRegisterTimestampCallback(monotonic_timestamp);
    if (r != CUPTI_SUCCESS) failed_call = "cuptiActivityRegisterTimestampCallback";
  }
  if (failed_call == nullptr) {
    r = lib_.cuptiActivityRegisterCallbacks(on_buffer_requested, on_buffer_completed);
    if (r != CUPTI_SUCCESS) failed_call = "cuptiActivityRegisterCallbacks";
  }
  bool memory_enabled = false, pool_enabled = false;
  if (failed_call == nullptr) {
    r = lib_.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY2);
    if (r != CUPTI_SUCCESS) failed_call = "cuptiActivityEnable(MEMORY2)";
    memory_enabled = r == CUPTI_SUCCESS;
  }
  if (failed_call == nullptr) {
    r = lib_.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY_POOL);
    if (r != CUPTI_SUCCESS) failed_call = "cuptiActivityEnable(MEMORY_POOL)";
    pool_enabled = r == CUPTI_SUCCESS;
  }
  if (failed_call == nullptr && kernel_steps_) {
    for (CUpti_CallbackId id : kLaunchCallbacks) {
      r = lib_.cuptiEnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API, id);
      if (r != CUPTI_SUCCESS) {
        failed_call = "cuptiEnableCallback(kernel launches)";
        break;
      }
    }
  }
  if (failed_call != nullptr) {
    if (r == CUPTI_SUCCESS) {
      snprintf(text, sizeof text, "CUPTI is not used: %s failed; device memory is seen by the CUDA hooks only",
               failed_call);
    } else {
      snprintf(text, sizeof text,
               "CUPTI is not used: %s failed with %s (%d); device memory is seen by the CUDA hooks only", failed_call,
               lib_.result_name(r), static_cast<int>(r));
    }
    if (memory_enabled) lib_.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMORY2);
    if (pool_enabled) lib_.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMORY_POOL);
    lib_.cuptiUnsubscribe(subscriber_);
    subscriber_ = nullptr;
    return fail(MEMLEDGER_CUPTI_FAILED, true, text);
  }

  // Before the preload library's exit handler (registered earlier, run
  // later): the last records reach the trace before its final flush.
  atexit(exit_flush);
  status_ = MEMLEDGER_CUPTI_ACTIVE;
  snprintf(text, sizeof text, "CUPTI %u from %s: memory activity records%s", lib_.version(), lib_.path(),
           kernel_steps_ ? " and kernel-launch steps" : "");
  host->status(MEMLEDGER_CUPTI_ACTIVE, text, nullptr, lib_.version());
  state_.store(kActive, std::memory_order_release);
  return status_;
}

void CuptiTracer::stop(int reason) {
  int expected = kActive;
  if (!state_.compare_exchange_strong(expected, kDone, std::memory_order_acq_rel)) return;
  if (reason == kStopForkChild) return;  // the parent's CUPTI state: nothing to call here
  HostScope scope(host_);
  // Everything CUPTI still holds is delivered (buffer_completed) before the
  // status record that ends the collection.
  const CUptiResult r = lib_.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  char text[512];
  if (reason == kStopHandover) {
    lib_.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMORY2);
    lib_.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMORY_POOL);
    lib_.cuptiUnsubscribe(subscriber_);
    subscriber_ = nullptr;
    snprintf(text, sizeof text,
             "CUPTI was handed over to another tool that asked for it; from here on device memory is seen by the "
             "CUDA hooks only");
  } else if (r != CUPTI_SUCCESS) {
    snprintf(text, sizeof text, "the final CUPTI flush failed with %s (%d): the last activity records may be missing",
             lib_.result_name(r), static_cast<int>(r));
  } else {
    snprintf(text, sizeof text, "CUPTI collection ended at exit");
  }
  const uint64_t exhausted = pool_.exhausted();
  if (exhausted != 0) {
    char more[160];
    snprintf(more, sizeof more, "; %llu buffer requests found the pool empty (records lost, counted as dropped)",
             static_cast<unsigned long long>(exhausted));
    strncat(text, more, sizeof text - strlen(text) - 1);
  }
  host_->status(MEMLEDGER_CUPTI_STOPPED, text, nullptr, lib_.version());
}

void CuptiTracer::buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = pool_.take();
  *size = *buffer != nullptr ? BufferPool::kBufferSize : 0;
  *max_records = 0;
}

void CuptiTracer::buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  if (buffer == nullptr) return;
  if (!pool_.owns(buffer)) return;  // not ours: never touch another tool's buffer
  HostScope scope(host_);
  CUpti_Activity* record = nullptr;
  while (lib_.cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMORY2) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemory4*>(record);
      MemledgerCuptiMemory out{};
      out.ts_ns = m->timestamp;
      out.address = m->address;
      out.bytes = m->bytes;
      out.pc = m->PC;
      out.correlation = m->correlationId;
      out.device = m->deviceId;
      out.stream = m->streamId;
      out.kind = memory_kind(m->memoryKind);
      out.release = m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE ? 1 : 0;
      out.async = m->isAsync ? 1 : 0;
      out.pool_type = static_cast<uint8_t>(m->memoryPoolConfig.memoryPoolType);
      out.pool_address = m->memoryPoolConfig.address;
      out.memory_kind = static_cast<uint8_t>(m->memoryKind);
      out.name = m->name;
      host_->memory(&out);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMORY_POOL) {
      const auto* p = reinterpret_cast<const CUpti_ActivityMemoryPool3*>(record);
      MemledgerCuptiPool out{};
      out.ts_ns = p->timestamp;
      out.address = p->address;
      out.size = p->size;
      out.utilized = p->utilizedSize;
      out.release_threshold = p->releaseThreshold;
      out.device = p->deviceId;
      out.operation = static_cast<uint8_t>(p->memoryPoolOperationType);
      out.pool_type = static_cast<uint8_t>(p->memoryPoolType);
      host_->pool(&out);
    }
    records_.fetch_add(1, std::memory_order_relaxed);
  }
  size_t dropped = 0;
  if (lib_.cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS && dropped != 0) {
    host_->dropped(dropped);
  }
  pool_.give_back(buffer);
}

bool CuptiTracer::kernel_matches(const char* name) {
  // A short table of recent answers: a training step launches the same few
  // hundred kernels over and over, and regexec is the costly part.
  // Each slot packs the name's address (user space: below 2^47) and the
  // answer in one word, so a reader never pairs one name with another's answer.
  static std::atomic<uint64_t> answers[1024];
  const uint64_t key = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(name)) << 1;
  std::atomic<uint64_t>& slot = answers[(key >> 5) % 1024];
  const uint64_t seen = slot.load(std::memory_order_relaxed);
  if ((seen & ~uint64_t{1}) == key) return (seen & 1) != 0;
  const bool match = regexec(&kernel_regex_, name, 0, nullptr, 0) == 0;
  slot.store(key | (match ? 1 : 0), std::memory_order_relaxed);
  return match;
}

void CuptiTracer::on_launch(const char* kernel) {
  if (!kernel_steps_ || kernel == nullptr || state_.load(std::memory_order_acquire) != kActive) return;
  HostScope scope(host_);
  if (!kernel_matches(kernel)) {
    in_matching_run_.store(false, std::memory_order_relaxed);
    return;
  }
  // An optimizer launches its kernel once per parameter group or chunk: a
  // run of matching launches ends one step, not several.
  if (in_matching_run_.exchange(true, std::memory_order_relaxed)) return;
  host_->step(kernel, MEMLEDGER_STEP_KERNEL);
}

}  // namespace memledger::cupti

using memledger::cupti::tracer;

extern "C" __attribute__((visibility("default"))) int memledger_cupti_start(const MemledgerCuptiHost* host) {
  return tracer().start(host);
}

extern "C" __attribute__((visibility("default"))) void memledger_cupti_stop(int reason) { tracer().stop(reason); }

// CUDA_INJECTION64_PATH: the driver loads this module during cuInit and calls
// InitializeInjection. The preload library (when present) provides the host.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  auto host_fn = reinterpret_cast<MemledgerCuptiHostFn>(dlsym(RTLD_DEFAULT, "memledger_cupti_host"));
  const MemledgerCuptiHost* host = host_fn != nullptr ? host_fn() : nullptr;
  // Without an active recorder (a process the preload library does not
  // trace) CUPTI is not touched at all.
  if (host != nullptr && host->size >= sizeof(MemledgerCuptiHost) && host->active()) tracer().start(host);
  return 1;
}
