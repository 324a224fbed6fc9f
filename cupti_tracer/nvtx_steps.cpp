// Step markers from NVTX ranges (`--steps nvtx:PATTERN`).
//
// NVTX hands its calls to one injection library, the one named by
// NVTX_INJECTION64_PATH. `memledger run` points it at this module only when
// NVTX steps are asked for and no other tool has set it (Nsight Systems sets
// it for itself): memledger never takes the slot from a profiler, and never
// points it at libcupti. A range whose name matches the pattern ends a step
// when it closes (nvtxRangePop, nvtxRangeEnd). This needs no GPU and no CUPTI.
#include <dlfcn.h>
#include <regex.h>
#include <sched.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <cwchar>

#include <nvtx3/nvToolsExt.h>

#include "cupti_host.h"

namespace {

const MemledgerCuptiHost* g_host = nullptr;
regex_t g_regex;
std::atomic<uint64_t> g_next_range_id{1};

class HostScope {
 public:
  HostScope() : entered_(g_host->enter()) {}
  ~HostScope() { g_host->leave(entered_); }

 private:
  int entered_;
};

// Per thread: which of the open push/pop ranges matched, as a bit stack.
// Deeper than 64 levels, ranges are not steps.
struct RangeStack {
  uint64_t matched;
  uint32_t depth;
  char label[8][128];  // names of the innermost matching ranges
};
thread_local RangeStack t_ranges;

// Start/end ranges may end on another thread: the matching ones by id.
struct OpenRange {
  std::atomic<uint64_t> id;
  char label[128];
};
OpenRange g_open[64];

void copy_message(char* out, size_t size, const nvtxEventAttributes_t* attr) {
  out[0] = '\0';
  if (attr == nullptr) return;
  if (attr->messageType == NVTX_MESSAGE_TYPE_ASCII && attr->message.ascii != nullptr) {
    snprintf(out, size, "%s", attr->message.ascii);
  } else if (attr->messageType == NVTX_MESSAGE_TYPE_UNICODE && attr->message.unicode != nullptr) {
    size_t i = 0;
    for (const wchar_t* w = attr->message.unicode; *w != 0 && i + 1 < size; ++w) {
      out[i++] = *w < 128 ? static_cast<char>(*w) : '?';
    }
    out[i] = '\0';
  }
}

bool matches(const char* name) { return name[0] != '\0' && regexec(&g_regex, name, 0, nullptr, 0) == 0; }

int push_named(const char* name) {
  HostScope scope;
  RangeStack& s = t_ranges;
  const uint32_t level = s.depth++;
  if (level < 64) {
    const bool match = matches(name);
    if (match) {
      s.matched |= uint64_t{1} << level;
      if (level < 8) snprintf(s.label[level], sizeof s.label[level], "%s", name);
    } else {
      s.matched &= ~(uint64_t{1} << level);
    }
  }
  return static_cast<int>(level);
}

int NVTX_API range_push_a(const char* message) { return push_named(message ? message : ""); }

int NVTX_API range_push_ex(const nvtxEventAttributes_t* attr) {
  char name[128];
  copy_message(name, sizeof name, attr);
  return push_named(name);
}

int NVTX_API range_push_w(const wchar_t* message) {
  nvtxEventAttributes_t attr{};
  attr.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  attr.message.unicode = message;
  return range_push_ex(&attr);
}

int NVTX_API range_pop() {
  HostScope scope;
  RangeStack& s = t_ranges;
  if (s.depth == 0) return -1;
  const uint32_t level = --s.depth;
  if (level < 64 && (s.matched >> level & 1)) {
    s.matched &= ~(uint64_t{1} << level);
    g_host->step(level < 8 ? s.label[level] : "nvtx range", MEMLEDGER_STEP_NVTX);
  }
  return static_cast<int>(level);
}

nvtxRangeId_t start_named(const char* name) {
  HostScope scope;
  const uint64_t id = g_next_range_id.fetch_add(1, std::memory_order_relaxed);
  if (!matches(name)) return id;
  for (OpenRange& r : g_open) {
    uint64_t expected = 0;
    if (r.id.load(std::memory_order_relaxed) == 0 &&
        r.id.compare_exchange_strong(expected, UINT64_MAX, std::memory_order_acq_rel)) {
      snprintf(r.label, sizeof r.label, "%s", name);
      r.id.store(id, std::memory_order_release);
      break;
    }
  }
  return id;
}

nvtxRangeId_t NVTX_API range_start_a(const char* message) { return start_named(message ? message : ""); }

nvtxRangeId_t NVTX_API range_start_ex(const nvtxEventAttributes_t* attr) {
  char name[128];
  copy_message(name, sizeof name, attr);
  return start_named(name);
}

nvtxRangeId_t NVTX_API range_start_w(const wchar_t* message) {
  nvtxEventAttributes_t attr{};
  attr.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  attr.message.unicode = message;
  return range_start_ex(&attr);
}

void NVTX_API range_end(nvtxRangeId_t id) {
  if (id == 0) return;
  for (OpenRange& r : g_open) {
    if (r.id.load(std::memory_order_acquire) != id) continue;
    HostScope scope;
    char label[128];
    memcpy(label, r.label, sizeof label);
    uint64_t expected = id;
    if (r.id.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
      g_host->step(label, MEMLEDGER_STEP_NVTX);
    }
    return;
  }
}

bool compile_pattern() {
  auto host_fn = reinterpret_cast<MemledgerCuptiHostFn>(dlsym(RTLD_DEFAULT, "memledger_cupti_host"));
  const MemledgerCuptiHost* host = host_fn != nullptr ? host_fn() : nullptr;
  if (host == nullptr || host->size < sizeof(MemledgerCuptiHost) || host->nvtx_pattern == nullptr ||
      host->nvtx_pattern[0] == '\0') {
    return false;
  }
  const int entered = host->enter();
  const int rc = regcomp(&g_regex, host->nvtx_pattern, REG_EXTENDED | REG_NOSUB);
  if (rc == 0) {
    g_host = host;
  } else {
    char why[256], text[700];
    regerror(rc, &g_regex, why, sizeof why);
    snprintf(text, sizeof text, "--steps nvtx:%s is not a valid regular expression (%s): no NVTX steps",
             host->nvtx_pattern, why);
    host->message(text);
  }
  host->leave(entered);
  return rc == 0;
}

bool install(NvtxGetExportTableFunc_t get_export_table) {
  auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->struct_size < sizeof(NvtxExportTableCallbacks)) return false;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || table == nullptr) return false;
  auto set = [&](unsigned int id, NvtxFunctionPointer fn) {
    if (id < size && table[id] != nullptr) *table[id] = fn;
  };
  set(NVTX_CBID_CORE_RangePushA, reinterpret_cast<NvtxFunctionPointer>(range_push_a));
  set(NVTX_CBID_CORE_RangePushW, reinterpret_cast<NvtxFunctionPointer>(range_push_w));
  set(NVTX_CBID_CORE_RangePushEx, reinterpret_cast<NvtxFunctionPointer>(range_push_ex));
  set(NVTX_CBID_CORE_RangePop, reinterpret_cast<NvtxFunctionPointer>(range_pop));
  set(NVTX_CBID_CORE_RangeStartA, reinterpret_cast<NvtxFunctionPointer>(range_start_a));
  set(NVTX_CBID_CORE_RangeStartW, reinterpret_cast<NvtxFunctionPointer>(range_start_w));
  set(NVTX_CBID_CORE_RangeStartEx, reinterpret_cast<NvtxFunctionPointer>(range_start_ex));
  set(NVTX_CBID_CORE_RangeEnd, reinterpret_cast<NvtxFunctionPointer>(range_end));
  return true;
}

}  // namespace

// Called by the NVTX loader of each library that uses NVTX (each copy of
// the NVTX headers initialises itself), with that copy's export table.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  // Once per process, whichever library's NVTX initialises first (NVTX
  // initialises each copy of its headers on its own, possibly on two threads).
  static std::atomic<int> state{0};  // 0 new, 1 compiling, 2 ready, 3 unusable
  int expected = 0;
  if (state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    state.store(compile_pattern() ? 2 : 3, std::memory_order_release);
  }
  while (state.load(std::memory_order_acquire) == 1) sched_yield();
  const bool ready = state.load(std::memory_order_acquire) == 2;
  // 0 tells NVTX that no tool is attached: its calls stay no-ops.
  if (!ready) return 0;
  return install(get_export_table) ? 1 : 0;
}
