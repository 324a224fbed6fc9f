// A stand-in libcupti for tests without a GPU, built against the real CUPTI
// headers so that its records have the real layout. FAKE_CUPTI picks what it
// does:
//   version=N    cuptiGetVersion reports API version N (another CUDA major)
//   held=NAME    another tool holds the subscriber slot; cuptiSubscribe_v2 names it
//                (as in every mode, one subscriber at a time: a second one gets
//                CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED until the first
//                unsubscribes)
//   fail=CALL    CALL (cuptiActivityEnable, cuptiActivityRegisterCallbacks,
//                cuptiEnableCallback) fails with CUPTI_ERROR_NOT_SUPPORTED
//   driver=needed  cuptiGetVersion faults (SIGSEGV) in a process that has no
//                libcuda.so.1 loaded, as pip's CUPTI 13.2 does on a machine without
//                the NVIDIA driver (its lazy start-up fails and calls itself
//                until the stack overflows)
//   active       (default) every call succeeds; each forced flush delivers one
//                device allocation at 0xdead00000 (1 MiB) that no hook saw, its
//                release, a module static (DEVICE_STATIC, 2304 bytes at
//                0xdead80000, named, no program counter: the driver placed it
//                at module load, as the real CUPTI reports a module's
//                __device__ variables), one memory pool record, and reports 3
//                records lost
#include <cupti.h>
#include <dlfcn.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

CUpti_BuffersCallbackRequestFunc g_request = nullptr;
CUpti_BuffersCallbackCompleteFunc g_complete = nullptr;
CUpti_TimestampCallbackFunc g_timestamp = nullptr;
bool g_memory_enabled = false;
bool g_subscribed = false;
char g_subscriber_name[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN] = "CUPTI";
int g_dropped_reports = 0;

const char* setting(const char* key) {
  const char* mode = getenv("FAKE_CUPTI");
  if (mode == nullptr) return nullptr;
  const size_t n = strlen(key);
  return strncmp(mode, key, n) == 0 && mode[n] == '=' ? mode + n + 1 : nullptr;
}

bool fails(const char* call) {
  const char* which = setting("fail");
  return which != nullptr && strcmp(which, call) == 0;
}

size_t record_size(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_MEMORY2: return sizeof(CUpti_ActivityMemory4);
    case CUPTI_ACTIVITY_KIND_MEMORY_POOL: return sizeof(CUpti_ActivityMemoryPool3);
    default: return 0;
  }
}

}  // namespace

extern "C" {

CUptiResult cuptiGetVersion(uint32_t* version) {
  const char* driver = setting("driver");
  if (driver != nullptr && strcmp(driver, "needed") == 0 && dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) == nullptr) {
    raise(SIGSEGV);
  }
  const char* v = setting("version");
  *version = v != nullptr ? static_cast<uint32_t>(strtoul(v, nullptr, 10)) : CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiGetResultString(CUptiResult result, const char** str) {
  switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_NOT_SUPPORTED: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; break;
  }
  return CUPTI_SUCCESS;
}

// Both entry points, without a call through the PLT from one to the other
// (which a preloaded library defining cuptiSubscribe_v2 would receive).
static CUptiResult subscribe(CUpti_SubscriberHandle* subscriber, CUpti_SubscriberParams* params) {
  if (subscriber == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  const char* holder = setting("held");
  if (holder == nullptr && g_subscribed) holder = g_subscriber_name;
  if (holder != nullptr) {
    if (params != nullptr && params->oldSubscriberName != nullptr && params->oldSubscriberSize > 0) {
      strncpy(params->oldSubscriberName, holder, params->oldSubscriberSize - 1);
      params->oldSubscriberName[params->oldSubscriberSize - 1] = '\0';
    }
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  g_subscribed = true;
  snprintf(g_subscriber_name, sizeof g_subscriber_name, "CUPTI for %s",
           params != nullptr && params->subscriberName != nullptr ? params->subscriberName : "an unnamed client");
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(&g_subscribed);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc, void*,
                              CUpti_SubscriberParams* params) {
  return subscribe(subscriber, params);
}

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc, void*) {
  return subscribe(subscriber, nullptr);
}

CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle) {
  g_subscribed = false;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableCallback(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId) {
  return fails("cuptiEnableCallback") ? CUPTI_ERROR_NOT_SUPPORTED : CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  if (fails("cuptiActivityEnable")) return CUPTI_ERROR_NOT_SUPPORTED;
  if (kind == CUPTI_ACTIVITY_KIND_MEMORY2) g_memory_enabled = true;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  if (kind == CUPTI_ACTIVITY_KIND_MEMORY2) g_memory_enabled = false;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                           CUpti_BuffersCallbackCompleteFunc complete) {
  if (fails("cuptiActivityRegisterCallbacks")) return CUPTI_ERROR_NOT_SUPPORTED;
  g_request = request;
  g_complete = complete;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc callback) {
  g_timestamp = callback;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, CUpti_Activity** record) {
  size_t offset = 0;
  if (*record != nullptr) {
    offset = static_cast<size_t>(reinterpret_cast<uint8_t*>(*record) - buffer) + record_size((*record)->kind);
  }
  if (offset >= valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(buffer + offset);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext, uint32_t, size_t* dropped) {
  *dropped = g_dropped_reports++ == 0 ? 3 : 0;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityFlushAll(uint32_t) {
  if (!g_memory_enabled || g_request == nullptr || g_complete == nullptr) return CUPTI_SUCCESS;
  uint8_t* buffer = nullptr;
  size_t size = 0, max_records = 0;
  g_request(&buffer, &size, &max_records);
  if (buffer == nullptr || size < 3 * sizeof(CUpti_ActivityMemory4) + sizeof(CUpti_ActivityMemoryPool3)) {
    return CUPTI_SUCCESS;
  }
  const uint64_t now = g_timestamp != nullptr ? g_timestamp() : 0;
  size_t used = 0;
  for (int op = 0; op < 2; ++op) {
    CUpti_ActivityMemory4 m{};
    m.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
    m.memoryOperationType =
        op == 0 ? CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION : CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
    m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
    m.correlationId = 7;
    m.address = 0xdead00000ull;
    m.bytes = 1 << 20;
    m.timestamp = now;
    m.PC = 0x1234;
    m.deviceId = 0;
    m.streamId = CUPTI_INVALID_STREAM_ID;
    memcpy(buffer + used, &m, sizeof m);
    used += sizeof m;
  }
  CUpti_ActivityMemory4 global{};
  global.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
  global.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
  global.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC;
  global.address = 0xdead80000ull;
  global.bytes = 2304;
  global.timestamp = now;
  global.streamId = CUPTI_INVALID_STREAM_ID;
  global.name = "fake_module_table";
  memcpy(buffer + used, &global, sizeof global);
  used += sizeof global;
  CUpti_ActivityMemoryPool3 p{};
  p.kind = CUPTI_ACTIVITY_KIND_MEMORY_POOL;
  p.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED;
  p.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  p.address = 0xbeef00000ull;
  p.size = 2 << 20;
  p.releaseThreshold = ~uint64_t{0};
  p.timestamp = now;
  memcpy(buffer + used, &p, sizeof p);
  used += sizeof p;
  g_complete(nullptr, 0, buffer, size, used);
  return CUPTI_SUCCESS;
}

}  // extern "C"
