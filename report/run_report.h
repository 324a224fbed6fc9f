// A whole run: every trace in a run folder (one per process image), analysed,
// with the root process identified, and the renderers (text and JSON).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "analysis.h"
#include "kernel_log.h"

namespace memledger::report {

inline constexpr int kReportSchemaVersion = 1;

struct RunReport {
  std::string run_dir;
  std::vector<std::string> command;  // from run.json, when `memledger run` wrote one
  std::vector<ProcessReport> processes;
  size_t root = 0;  // index into processes
  std::vector<std::string> problems;  // trace files that could not be read, and why
};

// What `memledger run` knows of the run first-hand, whether or not run.json
// could be written (a full disk): the root's pid and its waitpid status,
// and what the kernel said once it had ended.
struct RunOutcome {
  int root_pid = 0;
  ExitInfo exit;
  KernelLog kernel;
};

// Loads RUN_DIR (every trace.*.mlt in it, plus run.json) or a single trace
// file. Throws TraceError when nothing at all can be reported. `outcome`,
// when given, is taken over run.json.
RunReport load_run(const std::string& path, const AnalysisOptions& options, const RunOutcome* outcome = nullptr);

// The JSON report holds at most this many step rows per process: a longer
// run's rows are thinned (render_json's step_rows), so that the report's
// size does not grow with the run's length.
inline constexpr size_t kMaxStepRows = 1000;

// `full_stacks`: every frame of a stack; else runs of library frames are
// folded into one line each (stack_fold.h).
std::string render_text(const RunReport& run, bool full_stacks = false);
// max_step_rows: 0 keeps every step's row (what `memledger check` reads from
// traces, judging every step).
nlohmann::json render_json(const RunReport& run, size_t max_step_rows = kMaxStepRows);

// A site by the frame that is the user's code: "FUNCTION at FILE:LINE".
std::string site_name(const Site& site);
// One frame as the text report prints it.
std::string frame_text(const Frame& f);

// A suspect's bytes and allocations per step: "64.0 KiB/step", or in
// sampled mode "64 ± 12 KiB/step estimated" (one standard deviation).
std::string suspect_rate_text(const LeakSuspect& s);
std::string suspect_count_text(const LeakSuspect& s);
// Bytes as the exit-leak lists print them: "1.4 MiB", or in sampled mode
// "1.4 ± 0.2 MiB estimated".
std::string leak_bytes_text(double bytes, bool estimated, double error);

// The growth of all live bytes per step (what `check` gates on) with the
// window fitted, next to the top suspect's rate.
std::string total_growth_text(const ProcessReport& p);

// One line, for the end of `memledger run`.
std::string render_summary_line(const RunReport& run);

// Text for a terminal: control characters that came from the traced process
// (an escape sequence in its command line or a file name would retitle or
// repaint the terminal) are written out as \xNN. Newlines and tabs are kept;
// C1 controls encoded in UTF-8 (U+0080..U+009F) are escaped too.
std::string escape_terminal(std::string_view text);

}  // namespace memledger::report
