#include "notes.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "analysis.h"

namespace memledger::report {
namespace {

// The info key memledger's Python helpers record as they start
// (tools/python/memledger/_autoload.py, HELPERS_KEY).
constexpr std::string_view kPythonHelpersKey = "python.helpers";

// A process that a signal ended within this time of its start, without an
// exit or an exec of its own, may have ended before its interpreter reached
// the helpers (a pool's worker terminated as it started).
constexpr uint64_t kHelpersStartNs = 2'000'000'000;

// Why a Python process went without memledger's Python helpers, or empty:
// they started, were turned off, or the trace cannot say (a forked child,
// whose interpreter is its parent's; a process cut short during its
// start-up; a trace from before the header said where the helpers'
// start-up hook was).
std::string python_helpers_missing(const Trace& trace) {
  if (trace.python_status == 0 || !trace.header_value("parent_trace").empty()) return {};
  // The trace's times run from its start.
  if (!trace.has_exit && trace.execs.empty() && trace.last_ts < kHelpersStartNs) return {};
  const std::string boot = trace.header_value("python_boot");
  if (boot != "on_path" && boot != "missing" && boot != "not_installed") return {};
  for (const auto& [key, value] : trace.info_strings()) {
    if (key == kPythonHelpersKey) return {};
  }
  const std::string without =
      "; without them the report has no retention paths (which object keeps a suspect's memory), no steps from "
      "DataLoader batches, and no exit status of the children the program waited for";
  // The version the interpreter's record gives ("3.8.18"), where it is one
  // before those the helpers start on (tools/python/memledger/_boot).
  int major = 0, minor = 0;
  if (sscanf(trace.python_version.c_str(), "%d.%d", &major, &minor) == 2 && (major < 3 || (major == 3 && minor < 9))) {
    return "memledger's Python helpers start on Python 3.9 and later, and this process ran Python " +
           trace.python_version + without;
  }
  if (boot == "not_installed") {
    return "memledger's Python helpers did not run in this process: memledger run found no memledger Python "
           "package beside it (python/ in its build folder, share/memledger/python where it is installed)" +
           without;
  }
  if (boot == "missing") {
    return "memledger's Python helpers did not run in this process: PYTHONPATH did not hold the folder of their "
           "start-up hook, which memledger run puts first on it (a PYTHONPATH set anew in a script or a launcher "
           "drops it: add to it, PYTHONPATH=src:$PYTHONPATH)" +
           without;
  }
  return "memledger's Python helpers did not start in this process, though the folder of their start-up hook was "
         "on PYTHONPATH: Python ran with -I, -E or -S (which leave out PYTHONPATH or the site module), or the "
         "helpers failed to import" +
         without;
}

// What the event stream lost or could not place.
void integrity_notes(const NotesInput& in, std::vector<std::string>& notes) {
  const Trace& trace = in.trace;
  if (trace.dropped) {
    notes.push_back(std::to_string(trace.dropped) +
                    " events were dropped because a thread's buffer was full: per-site figures may be low");
  }
  if (in.stackless > 0 && trace.header_value("stack_depth", "1") != "0") {
    notes.push_back(std::to_string(in.stackless) + " of " + std::to_string(in.events) +
                    " events are allocations recorded without a call stack (the tracer's table of distinct "
                    "stacks was full, or the stack was taken while a fork was under way); they are grouped "
                    "under one unnamed site");
  }
  if (in.unknown_frees && !in.sampled) {
    notes.push_back(std::to_string(in.unknown_frees) +
                    " frees of addresses the trace never saw allocated (allocated before tracing started, "
                    "or inherited from a parent process)");
  }
  if (!trace.tracer_error.empty()) notes.push_back("the tracer stopped itself: " + trace.tracer_error);
  if (!trace.python_note.empty()) notes.push_back(trace.python_note);
  if (std::string why = python_helpers_missing(trace); !why.empty()) notes.push_back(std::move(why));
}

// CUPTI beside the hooks: where they disagree, or why CUPTI is missing.
void cupti_notes(const CuptiView& cupti, std::vector<std::string>& notes) {
  if (cupti.compared) {
    if (cupti.hooks_only || cupti.cupti_only) {
      notes.push_back("CUPTI and the CUDA hooks disagree: " + std::to_string(cupti.hooks_only) +
                      " allocations seen only by the hooks (" + human_bytes(double(cupti.hooks_only_bytes)) + "), " +
                      std::to_string(cupti.cupti_only) + " seen only by CUPTI (" +
                      human_bytes(double(cupti.cupti_only_bytes)) + "); see the CUPTI section");
    }
    if (cupti.cupti_dropped) {
      notes.push_back("CUPTI lost " + std::to_string(cupti.cupti_dropped) +
                      " activity records: the comparison with the hooks is incomplete");
    }
    if (!cupti.end_message.empty() && cupti.end_message.find("handed over") != std::string::npos) {
      notes.push_back(cupti.end_message);
    }
  } else if (cupti.status != "none") {
    notes.push_back(cupti.message.empty() ? "CUPTI was not used (" + cupti.status + ")" : cupti.message);
  }
}

// What the host figures cannot say because of the program's allocator.
void allocator_notes(const HostAllocator* allocator, std::vector<std::string>& notes) {
  if (allocator == nullptr || allocator->name.empty()) return;
  const std::string who = allocator->name + (allocator->path.empty() ? "" : " (" + allocator->path + ")");
  if (!allocator->traced) {
    notes.insert(notes.begin(), "host figures are incomplete, the host heap is not traced: the program's malloc is " +
                                    who + ", which " + allocator->reached +
                                    "; host live bytes, peak, sites and growth count only the calls that still reach "
                                    "memledger (put libmemledger.so first in LD_PRELOAD, as memledger run does)");
  } else if (!allocator->held_known) {
    notes.push_back("held host bytes are unknown: " + who +
                    " offers none of the statistics memledger reads (glibc mallinfo2, jemalloc mallctl, tcmalloc "
                    "MallocExtension, mimalloc mi_process_info)");
  }
}

}  // namespace

std::string rss_without_live_note(const std::vector<StepStats>& steps, int warmup_steps, double window_seconds,
                                  bool python) {
  const size_t first = static_cast<size_t>(std::max(0, warmup_steps));
  if (steps.size() < first + 3) return {};
  std::vector<double> rss, explained;
  for (size_t k = first; k < steps.size(); ++k) {
    const StepStats& s = steps[k];
    if (s.rss == 0) return {};  // not read
    const int64_t live = total_live(s);
    rss.push_back(static_cast<double>(s.rss));
    // Live bytes, or what the allocator holds for them when it holds more.
    explained.push_back(std::max(static_cast<double>(live), static_cast<double>(s.held_host + (live - s.live[0]))));
  }
  const double rss_slope = fit_line(rss).slope;
  const double explained_slope = std::max(0.0, fit_line(explained).slope);
  const double span = static_cast<double>(rss.size() - 1);
  if ((rss_slope - explained_slope) * span < kRssUnexplainedMin || rss_slope < 2 * explained_slope) return {};
  const double per = window_seconds > 0 ? window_seconds : 1.0;
  const std::string unit = window_seconds > 0 ? "/s" : "/step";
  std::string note = "RSS grew " + human_bytes(rss_slope / per) + unit + " over " +
                     (window_seconds > 0 ? "time windows " : "steps ") + std::to_string(first + 1) + "-" +
                     std::to_string(steps.size()) + " while live and held bytes grew " +
                     human_bytes(explained_slope / per) + unit + ": " +
                     human_bytes((rss_slope - explained_slope) * span) + " of resident memory that no allocation explains";
  note += " (files or shared memory mapped into the process, address space reserved and made usable later";
  note += python ? ", thread stacks, or a native extension's own memory; CPython's small-object arenas are counted as "
                   "mapped memory)"
                 : ", thread stacks, or a library's own memory)";
  return note;
}

std::string inheritance_note(const Inheritance& inheritance, int parent_pid, bool sampled) {
  if (parent_pid <= 0) return {};
  const std::string parent = "pid " + std::to_string(parent_pid);
  if (inheritance.parent == 0) {
    return "forked from " + parent + ", whose trace is not in this run: the heap blocks it inherited are unknown " +
           "to this report, and its frees of them count as unknown frees";
  }
  std::string note = "forked from " + parent + ": it inherited " +
                     (sampled ? human_bytes(static_cast<double>(inheritance.bytes)) + " estimated"
                              : human_bytes(static_cast<double>(inheritance.bytes))) +
                     " of the parent's heap (" + std::to_string(inheritance.blocks) +
                     (sampled ? " sampled blocks" : " blocks") + ") and freed " +
                     human_bytes(static_cast<double>(inheritance.freed_bytes)) + " of it (" +
                     std::to_string(inheritance.freed_blocks) + " blocks)";
  if (inheritance.host_live_at_fork >= 0) {
    note += "; its host live bytes start from the parent's " +
            human_bytes(static_cast<double>(inheritance.host_live_at_fork)) +
            " at the fork, and its growth is measured from there";
  }
  return note;
}

std::string copy_on_write_note(const std::vector<TraceShare>& shares, const std::vector<StepStats>& steps,
                               int64_t live_at_fork, bool python, uint64_t* copied) {
  *copied = 0;
  if (shares.size() < 2 || steps.empty()) return {};
  // From the first sample (taken as the child began) to the largest private
  // figure read up to a second after its last step end (the samples come
  // once a second); the live bytes over the same span.
  const TraceShare& first = shares.front();
  const TraceShare* last = &first;
  for (const TraceShare& s : shares) {
    if (s.ts <= steps.back().end_ns + 1000000000ull && s.priv > last->priv) last = &s;
  }
  if (last == &first) return {};
  const int64_t base = live_at_fork >= 0 ? live_at_fork : total_live(steps.front());
  const double grew = static_cast<double>(last->priv) - static_cast<double>(first.priv);
  const double live = std::max(0.0, static_cast<double>(total_live(steps.back()) - base));
  if (grew - live < kCopiedOnWriteMin || grew < 2 * live) return {};
  *copied = static_cast<uint64_t>(grew - live);
  std::string note = "copy-on-write: its private memory grew " + human_bytes(grew) + " (from " +
                     human_bytes(static_cast<double>(first.priv)) + " to " + human_bytes(static_cast<double>(last->priv)) +
                     ", while what it shares fell from " + human_bytes(static_cast<double>(first.shared)) + " to " +
                     human_bytes(static_cast<double>(last->shared)) + ") and its live bytes grew " + human_bytes(live) +
                     ": pages it shared with its parent since the fork were copied as it wrote to them, " +
                     human_bytes(grew - live) + " that no allocation explains";
  note += python ? "; in Python the usual cause is reference counts: reading objects the parent made (a dataset "
                   "held as a list or dict of Python objects) writes their counts and copies their pages into each "
                   "worker; keep such data in NumPy arrays, tensors or bytes instead"
                 : "; the usual cause is writing to data the parent made before the fork";
  return note;
}

std::vector<std::string> collect_notes(const NotesInput& in) {
  std::vector<std::string> notes(in.trace.problems.begin(), in.trace.problems.end());
  allocator_notes(in.allocator, notes);
  if (in.sampled) {
    notes.push_back("sampled host mode: per-site figures are estimates from allocations sampled every " +
                    human_bytes(static_cast<double>(in.sample_interval)) +
                    " on average; totals are exact (usable bytes); run with --host full for exact sites");
  }
  if (!in.growth.empty()) notes.push_back(in.growth);
  if (in.ooms > 0) {
    notes.push_back(std::to_string(in.failed_allocations) + " allocations failed (host and device), " + std::to_string(in.ooms) +
                    " of them out of memory");
  }
  if (!in.hidden_allocator.empty()) notes.push_back(in.hidden_allocator);
  integrity_notes(in, notes);
  cupti_notes(in.cupti, notes);
  notes.insert(notes.end(), in.symbolizer_warnings.begin(), in.symbolizer_warnings.end());
  if (!in.steps.empty()) notes.push_back(in.steps);
  return notes;
}

}  // namespace memledger::report
