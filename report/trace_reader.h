// Reads one trace file (interposer/trace_format.h) into memory, tolerating a
// torn tail and damaged frames: every frame whose checksum holds is used, the
// rest is counted and described in `problems`. Throws TraceError only when
// nothing can be read at all (not a trace, newer format version, unreadable).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

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
  uint8_t flags = 0;   // format::kAlloc* ; kStep: source
  uint8_t device = 0;
};
static_assert(sizeof(TraceEvent) == 40);

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

struct TraceSignal {
  uint64_t ts = 0;
  uint32_t tid = 0;
  int signo = 0;
  int code = 0;
  uint64_t fault_addr = 0;
  uint32_t stack = 0;
};

struct Trace {
  std::string path;
  uint32_t version = 0;
  std::map<std::string, std::string> header;
  std::vector<ModuleInfo> modules;
  std::map<uint32_t, std::vector<uint64_t>> stacks;
  std::map<uint32_t, std::string> strings;
  std::vector<TraceEvent> events;  // sorted by seq
  std::vector<TraceSample> samples;
  std::vector<TraceVmmEvent> vmm;
  std::vector<TraceDeviceSample> device_samples;
  std::vector<TracePoolSample> pool_samples;
  std::vector<TraceSignal> signals;
  std::vector<std::string> execs;
  bool has_exit = false;
  int exit_status = 0;
  bool has_end = false;
  std::string tracer_error;
  uint64_t dropped = 0;
  uint64_t last_ts = 0;
  // Integrity.
  uint64_t frames_read = 0;
  uint64_t frames_damaged = 0;
  uint64_t bytes_skipped = 0;
  bool truncated = false;  // the file ends inside a frame
  std::vector<std::string> problems;

  int pid() const;
  std::string header_value(const std::string& key, const std::string& fallback = "") const;
  std::string command_line() const;  // arguments joined by spaces
};

// Loads a trace. `load_events` = false reads only the header (fast listing).
Trace read_trace(const std::string& path, bool load_events = true);

// Prints every record as one line of text (memledger dump).
void dump_trace(const std::string& path, std::FILE* out);

}  // namespace memledger::report
