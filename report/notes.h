// Stage "notes": the caveats a reader needs beside the figures, in the
// order the report prints them.
//
// In:  the trace's integrity (problems found reading it, dropped events,
//      whether stacks were asked for, the tracer's own error, the Python
//      note), the replay's counts (allocations without a stack, unknown
//      frees, failed allocations), the other stages' sentences (why growth
//      was not judged, a hidden caching allocator, automatic steps that
//      found no loop), CUPTI's comparison with the hooks and the
//      symbolizer's warnings, the host allocator (not traced, or no held
//      bytes to read from it).
// Out: the notes, one sentence each.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis.h"
#include "cupti_view.h"
#include "trace_reader.h"

namespace memledger::report {

struct HostAllocator;

struct NotesInput {
  const Trace& trace;
  bool sampled = false;
  uint64_t sample_interval = 0;
  // The replay's counts.
  uint64_t events = 0;
  uint64_t stackless = 0;
  uint64_t unknown_frees = 0;
  uint64_t failed_allocations = 0;
  uint64_t ooms = 0;
  std::string growth = {};            // Growth::note
  std::string hidden_allocator = {};  // HiddenAllocator::note
  const CuptiView& cupti;
  std::vector<std::string> symbolizer_warnings = {};
  std::string steps = {};  // StepPlan::note
  const HostAllocator* allocator = nullptr;  // the program's host allocator, when known
};

std::vector<std::string> collect_notes(const NotesInput& in);

// Resident memory that no allocation explains: RSS rising over the steps
// after the warm-up by at least kRssUnexplainedMin more than live and held
// bytes together (all kinds, mapped included), and at least twice as fast,
// said with the numbers and the usual causes. Empty when it does not.
inline constexpr double kRssUnexplainedMin = 32.0 * 1024 * 1024;
std::string rss_without_live_note(const std::vector<StepStats>& steps, int warmup_steps, double window_seconds,
                                  bool python);

// A forked child's inheritance: what it started with from its parent's
// heap and what it freed of it; or, when the parent's trace is not in the
// run, that its frees of inherited blocks are counted as unknown frees.
// Empty for a process that was not forked.
std::string inheritance_note(const Inheritance& inheritance, int parent_pid, bool sampled);

// A forked child whose private memory (kShare samples) grew much more than
// its live bytes from the fork (`live_at_fork`, the exact host bytes it
// inherited; -1: from its first step end) to its last step end: pages
// shared with the parent were copied as they were written. The note has the numbers and the
// usual cause; `copied` gets the bytes no allocation explains. Empty (and 0)
// when the growth is under kCopiedOnWriteMin or not twice the live growth.
inline constexpr double kCopiedOnWriteMin = 32.0 * 1024 * 1024;
std::string copy_on_write_note(const std::vector<TraceShare>& shares, const std::vector<StepStats>& steps,
                               int64_t live_at_fork, bool python, uint64_t* copied);

}  // namespace memledger::report
