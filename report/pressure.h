// Stage "pressure": the host's memory over the run, and what it says about
// how the process ended (DESIGN.md, "Stop verdict").
//
// In:  the trace's kPressure records (MemAvailable, swap, swap-in, PSI,
//      the memory cgroup's OOM kills) and its last kSample (RSS, the
//      cgroup's limit and usage); what the kernel said after the process
//      died (KernelLog: its OOM killer's line for the pid, the cgroup's OOM
//      kill count), when `memledger run` read it.
// Out: a HostPressure summary for the report; the evidence that a SIGKILL
//      came from the OOM killer, for the verdict stage; a freeze finding
//      when the run's last seconds were spent swapping or stalled on memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis.h"
#include "kernel_log.h"
#include "trace_reader.h"

namespace memledger::report {

// HostPressure is defined in analysis.h (ProcessReport holds one).

// An interval between two pressure records counts as thrashing when pages
// were swapped in at kThrashSwapIn bytes/s or more, or every task that
// wanted to run was stalled on memory (PSI "full") kThrashFullShare of the
// time or more. A trailing stretch of such intervals (pauses of up to
// kThrashGapSeconds allowed) of kFreezeSeconds or longer is a freeze.
inline constexpr double kThrashSwapIn = 4.0 * 1024 * 1024;
inline constexpr double kThrashFullShare = 0.10;
inline constexpr double kThrashGapSeconds = 1.0;
inline constexpr double kFreezeSeconds = 5.0;

// System memory counts as nearly exhausted when MemAvailable is below
// kExhaustedShare of MemTotal or below kExhaustedBytes.
inline constexpr double kExhaustedShare = 0.05;
inline constexpr uint64_t kExhaustedBytes = uint64_t{256} << 20;

HostPressure summarize_pressure(const Trace& trace);

// Why a SIGKILL (or an end without a word) was, or was not, the OOM killer.
struct OomKillEvidence {
  bool likely = false;     // near the cgroup limit, memory nearly exhausted, or an OOM kill counted
  bool confirmed = false;  // the kernel log names the pid
  std::string figures;     // "last RSS 1.9 GiB, cgroup limit 2.0 GiB (usage 2.0 GiB), MemAvailable ..."
  std::vector<std::string> reasons;  // which of the signs held, one phrase each
  std::string kernel;      // what the kernel log said, or why it was not read
};
OomKillEvidence oom_kill_evidence(const Trace& trace, const KernelLog* kernel);

// Puts the freeze finding into the verdict when the process was stopped
// from outside (a signal, SIGKILL, no word at all: the user or the kernel
// ended a frozen run), else into the notes.
void judge_pressure(const HostPressure& pressure, Verdict& verdict, std::vector<std::string>& notes);

// One line for the text report ("host memory: ..."), empty without records.
std::string pressure_line(const HostPressure& pressure);

}  // namespace memledger::report
