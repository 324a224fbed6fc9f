// cuGetProcAddress and the other look-up entry points (cuGetExportTable,
// cuGetErrorName/String), and the simulator's debug interface (simcuda.h).

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cu_result_names.h"
#include "driver_state.h"

#pragma GCC visibility push(default)
#include "../simcuda.h"
#pragma GCC visibility pop

using namespace memledger::simcuda;

namespace {

// cuGetProcAddress hands out internal functions, not the exported symbols,
// as the real driver does (its exports are trampolines): a tracer cannot
// match them against dlsym's answers, and calls through them are counted
// apart (simcuda_stats). -Bsymbolic binds the call to this library's own
// definition, never to an interposed one.
template <auto Fn, Sym S>
struct ProcThunk;
template <typename... Args, CUresult (*Fn)(Args...), Sym S>
struct ProcThunk<Fn, S> {
  static CUresult call(Args... args) {
    counter(S).via_proc++;
    return Fn(args...);
  }
};

struct Entry {
  const char* base;
  const char* symbol;
  int version;
  Variant variant;
  void* exported;
  void* thunk;
};

const Entry kEntries[] = {
#define SIMCUDA_TABLE_ENTRY(base, symbol, version, variant)                                  \
  {#base, #symbol, version, Variant::variant, reinterpret_cast<void*>(&::symbol),            \
   reinterpret_cast<void*>(&ProcThunk<&::symbol, Sym::symbol>::call)},
    SIMCUDA_DRIVER_SYMBOLS(SIMCUDA_TABLE_ENTRY)
#undef SIMCUDA_TABLE_ENTRY
};
constexpr int kEntryCount = static_cast<int>(sizeof kEntries / sizeof kEntries[0]);
static_assert(kEntryCount == static_cast<int>(Sym::kCount));

// SIMCUDA_TRACE=1 logs every look-up on stderr: which names, ABI versions
// and flags a runtime or tracer asks for.
void trace_lookup(const char* symbol, int cuda_version, cuuint64_t flags, CUresult result, const Entry* found) {
  static const bool enabled = [] {
    const char* value = std::getenv("SIMCUDA_TRACE");
    return value != nullptr && *value != '\0' && *value != '0';
  }();
  if (!enabled) return;
  std::fprintf(stderr, "simcuda: cuGetProcAddress(\"%s\", %d, flags %llu) = %d -> %s\n", symbol ? symbol : "(null)",
               cuda_version, static_cast<unsigned long long>(flags), static_cast<int>(result),
               found ? found->symbol : "NULL");
}

CUresult lookup_entry(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status, const Entry** found) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  constexpr cuuint64_t kKnownFlags = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  // Asking for an ABI newer than the driver is an error, not "not found".
  if (cuda_version > config().driver_version) return CUDA_ERROR_INVALID_VALUE;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;

  // The newest ABI not newer than cuda_version; with the per-thread flag a
  // _ptsz/_ptds variant wins over the legacy one, which is the fallback.
  const Entry* best = nullptr;
  bool known = false;
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    known = true;
    if (e.version > cuda_version || (e.variant == Variant::kPerThread && !per_thread)) continue;
    if (best == nullptr || (e.variant == Variant::kPerThread) > (best->variant == Variant::kPerThread) ||
        ((e.variant == best->variant) && e.version > best->version)) {
      best = &e;
    }
  }
  if (best == nullptr) {
    // Success with a NULL function: what the real driver answers for a name
    // it does not have or an ABI older than the symbol.
    if (status) *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
  }
  // Asked for itself, cuGetProcAddress answers with its exported self, so
  // that a caller holding it sees the same function.
  const bool self = std::strcmp(symbol, "cuGetProcAddress") == 0;
  *pfn = self ? best->exported : best->thunk;
  *found = best;
  g_proc_address_lookups++;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

CUresult lookup(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  const Entry* found = nullptr;
  const CUresult result = lookup_entry(symbol, pfn, cuda_version, flags, status, &found);
  trace_lookup(symbol, cuda_version, flags, result, found);
  return result;
}

struct ErrorText {
  CUresult code;
  const char* name;
  char description[64];
};

ErrorText g_errors[] = {
#define SIMCUDA_ERROR_ENTRY(name) {name, #name, {}},
    SIMCUDA_CURESULTS(SIMCUDA_ERROR_ENTRY)
#undef SIMCUDA_ERROR_ENTRY
};

const ErrorText* find_error(CUresult code) {
  static std::once_flag described;
  std::call_once(described, [] {
    for (ErrorText& e : g_errors) {
      // "CUDA_ERROR_OUT_OF_MEMORY" -> "out of memory"
      const char* words = std::strncmp(e.name, "CUDA_ERROR_", 11) == 0 ? e.name + 11 : "no error";
      size_t i = 0;
      for (; words[i] != '\0' && i + 1 < sizeof e.description; ++i) {
        const char c = words[i];
        e.description[i] = c == '_' ? ' ' : (c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
      }
      e.description[i] = '\0';
    }
  });
  for (const ErrorText& e : g_errors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  SIMCUDA_COUNT(cuGetProcAddress_v2);
  return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

// CUDA 11.3 - 11.8 ABI: no status argument.
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  SIMCUDA_COUNT(cuGetProcAddress);
  return lookup(symbol, pfn, cudaVersion, flags, nullptr);
}

// The real cudart needs private tables from here; the simulated one does not.
CUresult cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) {
  SIMCUDA_COUNT(cuGetExportTable);
  if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ppExportTable = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGetErrorName(CUresult error, const char** pStr) {
  SIMCUDA_COUNT(cuGetErrorName);
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *pStr = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** pStr) {
  SIMCUDA_COUNT(cuGetErrorString);
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *pStr = e ? e->description : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

simcuda_stats_t simcuda_stats(void) {
  simcuda_stats_t stats{};
  stats.proc_address_lookups = g_proc_address_lookups.load();
  for (int i = 0; i < kEntryCount; ++i) {
    const CallCounter& c = counter(static_cast<Sym>(i));
    const unsigned long long total = c.total.load();
    const unsigned long long via_proc = c.via_proc.load();
    stats.calls_via_proc_address += via_proc;
    stats.calls_direct += total - via_proc;
  }
  return stats;
}

int simcuda_symbol_calls(const char* symbol, unsigned long long* direct, unsigned long long* via_proc_address) {
  if (symbol == nullptr) return -1;
  for (int i = 0; i < kEntryCount; ++i) {
    if (std::strcmp(kEntries[i].symbol, symbol) != 0) continue;
    const CallCounter& c = counter(static_cast<Sym>(i));
    const unsigned long long via_proc = c.via_proc.load();
    if (direct) *direct = c.total.load() - via_proc;
    if (via_proc_address) *via_proc_address = via_proc;
    return 0;
  }
  return -1;
}

int simcuda_symbols(simcuda_symbol_t* out, int capacity) {
  for (int i = 0; i < kEntryCount && i < capacity && out != nullptr; ++i) {
    const Entry& e = kEntries[i];
    out[i] = {e.base, e.symbol, e.version, e.variant == Variant::kPerThread ? 1 : 0};
  }
  return kEntryCount;
}

long long simcuda_device_held(int device) {
  State& st = state();
  std::lock_guard lock(st.mu);
  if (!st.initialized || device < 0 || device >= st.device_count) return -1;
  return static_cast<long long>(st.devices[device].held());
}
