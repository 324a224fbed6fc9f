// Host memory pressure, read by the writer thread with each RSS sample: what
// the machine and the process's memory cgroup had left (MemAvailable, swap,
// the cgroup's limit and usage), how hard the kernel was working to find
// memory (swap-in, PSI), and whether its OOM killer struck in the cgroup.
// The report's stop verdict and freeze finding are made of these
// (report/pressure.h).
//
// Each file is opened once and read with pread at offset 0 (the kernel
// formats it afresh on every read); the descriptors are the tracer's own
// (OwnedFile: above the range programs close, checked before each read).
// A file that cannot be opened (no PSI in the kernel, no cgroup) is left
// out and its `present` bit stays clear: sampling never fails the program.
#pragma once

#include <cstdint>

#include "pressure_parse.h"
#include "trace_writer.h"

namespace memledger::interposer {

struct PressureReading {
  uint32_t present = 0;  // format::kPressure* bits
  Meminfo mem;
  uint64_t swap_in = 0, swap_out = 0;  // pages since boot
  Psi psi;
  uint64_t cgroup_oom_kills = 0;
};

class PressureSampler {
 public:
  // Finds the process's memory cgroup and opens every file that is there.
  void open();
  // Closes what is still ours (a forked child closes its copies).
  void close();
  // The pressure files (kPressure's fields). /proc/vmstat costs the most
  // (the kernel sums every counter of every CPU, 0.1 to 0.3 ms): read only
  // `with_vmstat`.
  void read(PressureReading* out, bool with_vmstat);
  // The cgroup's limit and usage in bytes (kSample's fields); 0: no limit,
  // or no cgroup.
  void read_cgroup(uint64_t* limit, uint64_t* usage);
  // The memory cgroup's directory ("" when none is readable).
  const char* cgroup_dir() const { return cgroup_dir_; }

 private:
  // Reads the whole file into buf_ (NUL-terminated); false when it cannot.
  bool read_file(OwnedFile& file);

  OwnedFile meminfo_, vmstat_, psi_;
  OwnedFile limit_, usage_, events_;
  char cgroup_dir_[512] = {};
  char buf_[16384] = {};
};

}  // namespace memledger::interposer
