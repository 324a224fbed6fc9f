// Stage "environment": the process's CUDA stack and frameworks, and what
// in them does not fit together (DESIGN.md, "Stop verdict").
//
// In:  the trace's kInfo facts (the preload library's CUDA stack, the
//      Python module's framework builds and the exception that ended
//      Python), its module map (build ids), the verdict so far with its
//      named crash stack.
// Out: an Environment for the report's "environment" block, its findings
//      (one sentence each, with the numbers and what to do), and the
//      verdict and notes they change: a finding that explains how the
//      process died goes into the stop verdict, the others into the notes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "analysis.h"
#include "trace_reader.h"

namespace memledger::report {

// Environment and CudaLibrary are defined in analysis.h (ProcessReport holds one).

Environment read_environment(const Trace& trace);

// Adds the findings to `env` and puts them into `verdict` (when the process
// died of one) or `notes`; names a framework's out-of-memory error in a
// CUDA OOM verdict.
void judge_environment(Environment& env, Verdict& verdict, std::vector<std::string>& notes);

// One line per fact, for the text report ("environment:" block).
std::vector<std::string> environment_lines(const Environment& env);

}  // namespace memledger::report
