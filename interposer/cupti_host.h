// The C interface the preload library offers the CUPTI module (cupti_tracer/).
// It lives here, with the side that serves it: the module includes it, the
// preload library never includes anything of the module's.
//
// libmemledger.so never links against the module (nor CUDA, nor CUPTI): it
// dlopen's libmemledger_cupti.so at the first cuInit and calls
// memledger_cupti_start() with a MemledgerCuptiHost, the table through which
// the module hands its records to the recorder. When the CUDA driver loads the
// module itself (CUDA_INJECTION64_PATH, InitializeInjection) or NVTX does
// (NVTX_INJECTION64_PATH, InitializeInjectionNvtx2), the module asks the
// preload library for the same table with memledger_cupti_host().
//
// Plain C types only: the two sides are built separately and must agree on
// nothing but this header. `size` lets either side grow the table.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// What became of CUPTI in this process (format::CuptiStatus has the same values).
enum MemledgerCuptiStatus {
  MEMLEDGER_CUPTI_ACTIVE = 1,       // activity records are collected
  MEMLEDGER_CUPTI_OFF = 2,          // --cupti off
  MEMLEDGER_CUPTI_UNAVAILABLE = 3,  // no libcupti, wrong version, no driver or device
  MEMLEDGER_CUPTI_HELD = 4,         // another tool holds the CUPTI subscriber slot
  MEMLEDGER_CUPTI_FAILED = 5,       // a CUPTI call failed; CUPTI was turned off
  MEMLEDGER_CUPTI_STOPPED = 6,      // collection ended (exit flush, or handed to another tool)
};

// One CUPTI_ACTIVITY_KIND_MEMORY2 record, already taken apart.
struct MemledgerCuptiMemory {
  uint64_t ts_ns;        // CLOCK_MONOTONIC, as the recorder's own events
  uint64_t address;
  uint64_t bytes;
  uint64_t pc;           // program counter of the allocating call (0 = unknown)
  uint32_t correlation;  // CUPTI correlation id of the API call
  uint32_t device;
  uint32_t stream;       // CUPTI stream id; UINT32_MAX = not stream-ordered
  uint8_t kind;          // format::Kind
  uint8_t release;       // 1: memory released, 0: allocated
  uint8_t async;         // stream-ordered (cu/cudaMallocAsync and pools)
  uint8_t pool_type;     // CUpti_ActivityMemoryPoolType (0 none, 1 local, 2 imported)
  uint64_t pool_address;  // base address of the pool (0 = none)
  // Version 2. CUpti_ActivityMemoryKind as CUPTI gave it: `kind` folds the
  // module statics (DEVICE_STATIC, MANAGED_STATIC), which the driver places
  // when it loads a module and no allocation call makes, into device and managed.
  uint8_t memory_kind;
  const char* name;      // a module static's variable name (NULL = none); CUPTI's, valid for the call
};

// One CUPTI_ACTIVITY_KIND_MEMORY_POOL record.
struct MemledgerCuptiPool {
  uint64_t ts_ns;
  uint64_t address;
  uint64_t size;
  uint64_t utilized;
  uint64_t release_threshold;
  uint32_t device;
  uint8_t operation;  // CUpti_ActivityMemoryPoolOperationType: 1 created, 2 destroyed, 3 trimmed
  uint8_t pool_type;
};

// Step sources the module can report (format::StepSource values).
enum MemledgerCuptiStepSource {
  MEMLEDGER_STEP_NVTX = 2,
  MEMLEDGER_STEP_KERNEL = 3,
};

#define MEMLEDGER_CUPTI_HOST_VERSION 2

struct MemledgerCuptiHost {
  uint32_t size;     // sizeof(MemledgerCuptiHost) of the side that filled it
  uint32_t version;  // MEMLEDGER_CUPTI_HOST_VERSION
  // Non-zero while the recorder records.
  int (*active)(void);
  // Marks the calling thread as inside memledger (its mallocs are not the
  // program's) until leave(); returns 0 when it already was.
  int (*enter)(void);
  void (*leave)(int entered);
  // One line on stderr, "memledger: " + text.
  void (*message)(const char* text);
  // What became of CUPTI: a status record in the trace. `text` is the
  // sentence the report shows, `holder` the tool that holds the subscriber
  // slot (may be NULL), `version` the CUPTI API version found (0 = none).
  void (*status)(int status, const char* text, const char* holder, uint32_t version);
  void (*memory)(const struct MemledgerCuptiMemory* record);
  void (*pool)(const struct MemledgerCuptiPool* record);
  // Activity records CUPTI reported lost (cuptiActivityGetNumDroppedRecords).
  void (*dropped)(uint64_t records);
  // The end of a training step found by the module (MemledgerCuptiStepSource).
  void (*step)(const char* label, int source);
  // Settings, from `memledger run` through the environment (NULL when unset).
  const char* mode;            // "auto", "on", "off"
  const char* cupti_path;      // --cupti-path
  const char* nvtx_pattern;    // --steps nvtx:PATTERN
  const char* kernel_pattern;  // --steps kernel:PATTERN
};

// Exported by libmemledger_cupti.so. Returns the status it reached.
typedef int (*MemledgerCuptiStartFn)(const struct MemledgerCuptiHost* host);
// Exported by libmemledger_cupti.so: flush and stop (exit, fork child, handover).
typedef void (*MemledgerCuptiStopFn)(int reason);
// Exported by libmemledger.so, for a module the driver or NVTX loaded itself.
typedef const struct MemledgerCuptiHost* (*MemledgerCuptiHostFn)(void);

#ifdef __cplusplus
}
#endif
