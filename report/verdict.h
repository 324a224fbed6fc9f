// Stage "verdict": why the process stopped (DESIGN.md, "Stop verdict").
//
// In:  how `memledger run` saw it end (waitpid), when known; the trace's
//      end records (exit status, exec, end marker, fatal signals with their
//      stack) and its last sample (RSS, cgroup limit and usage); the
//      out-of-memory failures the replay found.
// Out: one Verdict: clean exit or exit code, a signal, a crash with its
//      signal, fault address and stack, a host OOM kill (RSS against the
//      cgroup limit at the last sample), a CUDA OOM (requested, free, held
//      but unused), an exec, or a stop without warning. The crash stack
//      comes back as a stack id, named by the caller.
#pragma once

#include <cstdint>
#include <vector>

#include "analysis.h"
#include "trace_reader.h"

namespace memledger::report {

struct StopVerdict {
  Verdict verdict;  // crash_stack empty: see below
  bool has_crash_stack = false;
  uint32_t crash_stack = 0;  // interned stack of the crash signal
};

// `steps`: to name the phase of an out-of-memory failure.
StopVerdict judge_stop(const Trace& trace, const ExitInfo& exit_info, const std::vector<OomEvent>& ooms,
                       const std::vector<StepStats>& steps = {});

}  // namespace memledger::report
