#include "notes.h"

#include "analysis.h"

namespace memledger::report {
namespace {

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

}  // namespace

std::vector<std::string> collect_notes(const NotesInput& in) {
  std::vector<std::string> notes(in.trace.problems.begin(), in.trace.problems.end());
  if (in.sampled) {
    notes.push_back("sampled host mode: per-site figures are estimates from allocations sampled every " +
                    human_bytes(static_cast<double>(in.sample_interval)) +
                    " on average; totals are exact (usable bytes); run with --host full for exact sites");
  }
  if (!in.growth.empty()) notes.push_back(in.growth);
  if (in.ooms > 0) {
    notes.push_back(std::to_string(in.failed_allocations) + " device allocations failed, " + std::to_string(in.ooms) +
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
