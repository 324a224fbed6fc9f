// Reads one trace file (interposer/trace_format.h) into memory, tolerating a
// torn tail and damaged frames: every frame whose checksum holds is used, the
// rest is counted and described in `problems`. Throws TraceError only when
// nothing can be read at all (not a trace, newer format version, unreadable).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stack_store.h"
#include "symbolizer.h"

namespace memledger::report {

class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class EvType : uint8_t { kAlloc = 1, kFree = 2, kStep = 3 };

// One allocation, free or step marker, in sequence order after loading.
// Kept compact (40 bytes): a full-mode trace holds millions of these.
struct TraceEvent {
  uint64_t seq = 0;
  uint64_t addr = 0;   // kStep: step index; a failed allocation: the error code
  uint64_t size = 0;   // bytes this record stands for (the estimate for a sampled
                       // allocation, the requested size otherwise); kStep: label string id
  uint64_t ts = 0;     // ns since trace start
  uint32_t stack = 0;
  EvType type = EvType::kAlloc;
  uint8_t kind = 0;
  uint8_t flags = 0;   // format::kAlloc* and kAllocByChance; kStep: source
  uint8_t device = 0;
};
static_assert(sizeof(TraceEvent) == 40);

// Set by the reader on a sampled allocation smaller than the sample interval
// (its estimate differs from its size): whether it was recorded at all was
// chance, so how often its site shows up says nothing about the program.
inline constexpr uint8_t kAllocByChance = 1u << 7;

struct TraceSample {
  uint64_t ts = 0;
  uint64_t rss = 0;
  uint64_t heap_held = 0;
  uint64_t heap_in_use = 0;
  uint64_t cgroup_limit = 0;
  uint64_t cgroup_usage = 0;
  int64_t host_live = 0;
  uint64_t host_allocs = 0;
  uint64_t host_frees = 0;
};

// Host memory pressure at one moment (kPressure, version 7): the machine's
// and the memory cgroup's. `present` (format::kPressure* bits) says which
// sources were read; the fields of the others are 0.
struct TracePressure {
  uint64_t ts = 0;
  uint32_t present = 0;
  uint64_t mem_total = 0;
  uint64_t mem_available = 0;
  uint64_t swap_total = 0;
  uint64_t swap_free = 0;
  uint64_t swap_in = 0;   // pages swapped in since boot
  uint64_t swap_out = 0;  // pages swapped out since boot
  uint32_t psi_some_avg10 = 0;  // hundredths of a percent
  uint32_t psi_full_avg10 = 0;
  uint64_t psi_some_total = 0;  // microseconds since boot
  uint64_t psi_full_total = 0;
  uint64_t cgroup_oom_kills = 0;
};

// Shared and private memory of a process that forked or was forked
// (kShare, once a second), in bytes.
struct TraceShare {
  uint64_t ts = 0;
  uint64_t rss = 0;
  uint64_t pss = 0;
  uint64_t shared = 0;
  uint64_t priv = 0;
};

// Device address space and VMM mappings (not memory by themselves).
struct TraceVmmEvent {
  enum class Type : uint8_t { kReserve, kUnreserve, kMap, kUnmap };
  uint64_t seq = 0;
  uint64_t ts = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t handle = 0;  // kMap
  uint32_t stack = 0;   // kReserve
  uint8_t device = 0;
  Type type = Type::kReserve;
};

// Device-wide free/total (cuMemGetInfo) at a step end.
struct TraceDeviceSample {
  uint64_t seq = 0;
  uint64_t ts = 0;
  uint32_t device = 0;
  uint64_t free = 0;
  uint64_t total = 0;
};

// A memory pool's reserved and used bytes at a step end.
struct TracePoolSample {
  uint64_t seq = 0;
  uint64_t ts = 0;
  uint32_t device = 0;
  uint64_t pool = 0;
  uint64_t reserved = 0;
  uint64_t used = 0;
};

// What became of CUPTI in the process (kCuptiStatus).
struct TraceCuptiStatus {
  uint64_t seq = 0;  // orders it among the hooks' events
  uint64_t ts = 0;
  uint8_t status = 0;    // format::CuptiStatus
  uint32_t version = 0;  // CUPTI API version (0 = none found)
  uint32_t text = 0;     // string ids
  uint32_t holder = 0;
};

// A CUPTI memory activity record (kCuptiMemory). Only allocations are kept:
// the cross-check compares what each side saw allocated.
struct TraceCuptiMemory {
  uint64_t ts = 0;
  uint64_t addr = 0;
  uint64_t bytes = 0;
  uint64_t pc = 0;
  uint32_t device = 0;
  uint32_t stream = 0;
  uint32_t correlation = 0;
  uint8_t kind = 0;   // format::Kind
  uint8_t flags = 0;  // bit 0 async, bits 1..2 CUPTI memory pool type
  uint8_t cupti_kind = 0;  // format::CuptiMemoryKind (version 10; 0 = unknown)
  uint32_t name = 0;       // string id of a module static's variable name (0 = none)
};

// The exact host counters (version 3), read by the marking thread at a
// step marker, and in sampled mode just after each recorded host
// allocation: live bytes, and allocations and frees modulo 2^32.
struct TraceHostTotals {
  uint64_t seq = 0;  // the step event's, or the kHostTotals record's
  int64_t host_live = 0;
  uint32_t host_allocs = 0;
  uint32_t host_frees = 0;
};

struct TraceSignal {
  uint64_t ts = 0;
  uint32_t tid = 0;
  int signo = 0;
  int code = 0;
  uint64_t fault_addr = 0;
  uint32_t stack = 0;
};

// A fact about the software stack (kInfo): string ids of key and value.
struct TraceInfo {
  uint64_t ts = 0;
  uint32_t key = 0;
  uint32_t value = 0;
};

struct Trace {
  std::string path;
  uint32_t version = 0;
  std::map<std::string, std::string> header;
  std::vector<ModuleInfo> modules;
  StackStore stacks;
  std::map<uint32_t, std::string> strings;
  // Python (kPythonCode, kPython records): the code objects Python frames
  // refer to, and the interpreter found (status 0: none seen).
  std::map<uint32_t, PythonCode> python_codes;
  uint8_t python_status = 0;  // format::PythonStatus
  std::string python_version;
  std::string python_module;
  std::string python_note;
  std::vector<TraceEvent> events;  // sorted by seq
  std::vector<TraceSample> samples;
  std::vector<TracePressure> pressure;  // sorted by ts
  std::vector<TraceShare> shares;
  std::vector<TraceHostTotals> host_totals;  // sorted by seq
  std::vector<TraceVmmEvent> vmm;
  std::vector<TraceDeviceSample> device_samples;
  std::vector<TracePoolSample> pool_samples;
  std::vector<TraceSignal> signals;
  std::vector<TraceInfo> info;  // in file order (kInfo)
  // CUPTI (cupti_tracer/): status records, memory allocation records (at
  // most kMaxCuptiRecords kept; the rest counted), pool records, drops.
  std::vector<TraceCuptiStatus> cupti_status;
  std::vector<TraceCuptiMemory> cupti_memory;
  uint64_t cupti_releases = 0;
  uint64_t cupti_pool_records = 0;
  uint64_t cupti_records_over_cap = 0;
  uint64_t cupti_dropped = 0;
  std::vector<std::string> execs;
  bool has_exit = false;
  int exit_status = 0;
  bool has_end = false;
  std::string tracer_error;
  uint64_t dropped = 0;
  uint64_t late_events = 0;  // stream_trace: events delivered after later ones (see there)
  uint64_t last_ts = 0;
  // Integrity.
  uint64_t frames_read = 0;
  uint64_t frames_damaged = 0;
  uint64_t bytes_skipped = 0;
  bool truncated = false;  // the file ends inside a frame
  uint64_t file_bytes = 0;  // the trace file's size
  // Limits that keep a hostile trace's cost bounded by its size (below).
  uint64_t strings_cut = 0;     // strings longer than kMaxTraceString, cut
  uint64_t stacks_cut = 0;      // stacks deeper than kMaxStackFrames, cut
  uint64_t bytes_inflated = 0;  // what compressed frames decompressed to
  std::vector<std::string> problems;

  int pid() const;
  std::string header_value(const std::string& key, const std::string& fallback = "") const;
  std::string command_line() const;  // arguments joined by spaces
  // The info records' keys and values as strings, in the order they were
  // written; a record whose key or value names no string is left out.
  std::vector<std::pair<std::string_view, std::string_view>> info_strings() const;
};

inline constexpr size_t kMaxCuptiRecords = size_t{4} << 20;
// kInfo records kept (a program calling memledger_note in a loop).
inline constexpr size_t kMaxInfoRecords = 4096;

// Bounds on what a trace can make the reader hold, whatever it claims. A
// string is at most a path's length (PATH_MAX; a Python line table may be
// longer), a stack at most the writer's deepest (StackTable::kMaxDepth).
// Compressed frames may decompress to kInflateRatio times the file's size
// (plus kInflateFloor): the writer's traces reach 2 to 9 to 1 (a Python
// program's, whose frames repeat most, 8.4 to 1 overall and 12.7 for its
// most repetitive frame); a few kilobytes that claim gigabytes of records
// are a decompression bomb. Past a bound the rest is cut or skipped, and
// `problems` says what.
inline constexpr size_t kMaxTraceString = 4096;
inline constexpr size_t kMaxLineTable = size_t{1} << 20;
inline constexpr uint64_t kInflateRatio = 32;
inline constexpr uint64_t kInflateFloor = uint64_t{256} << 10;

// Loads a trace. `load_events` = false reads only the header (fast listing).
Trace read_trace(const std::string& path, bool load_events = true);

// Reads the rest of a trace opened with read_trace(path, false) in one
// streaming pass, for traces too large to hold in memory (a full-mode trace
// has tens of millions of events): events go to `on_events` in sequence
// order, a batch at a time, and are not kept; every other record (samples,
// stacks, modules, strings, VMM and device records, signals, exit) is added
// to `trace` before the events that follow it are delivered. Frames are
// read, checked and decoded on a second thread.
//
// Threads take their sequence numbers before their events reach the
// writer, so a thread preempted in between can land its event a frame or
// two late; events are held back for kReorderFrames frames to restore the
// order. One later still is delivered late and counted in trace.late_events.
using EventBatchFn = std::function<void(const TraceEvent* events, size_t count)>;
inline constexpr size_t kReorderFrames = 8;
void stream_trace(Trace& trace, const EventBatchFn& on_events);

// Prints every record as one line of text (memledger dump).
void dump_trace(const std::string& path, std::FILE* out);

}  // namespace memledger::report
