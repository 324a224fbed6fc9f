// `memledger check` and `memledger diff` on top of the report: the figures a
// CI job judges (growth per step from a fit, peaks, held bytes,
// fragmentation, exit leaks, suspects, OOMs), judged against a policy's limits
// and against a baseline run, and the outputs CI systems read (text, JUnit
// XML, a JSON verdict, Markdown). Everything works from the JSON report
// (schema memledger-report), so a run folder and a saved report.json are
// read the same way.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "policy.h"
#include "symbolizer.h"

namespace memledger::report {

inline constexpr int kCheckSchemaVersion = 1;
inline constexpr int kDiffSchemaVersion = 1;
// The memory kinds of a report's per-step live bytes, in trace_format.h's order.
inline constexpr int kKinds = 5;

// An input that cannot be judged (missing, not a report, a newer schema):
// `memledger check` and `diff` exit 2 with this message.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One traced process, as read from the report.
struct ProcessData {
  int pid = 0;
  std::string rank;
  std::string command;
  int report_warmup = 0;  // the warm-up the report's suspects were judged with
  std::vector<std::array<double, kKinds>> live;  // per step, per kind (host, device, managed, pinned_host, mapped)
  // Per step, per role (role_rules.h), from steps[].roles; empty in a
  // report made before roles were.
  std::vector<std::array<double, kRoleCount>> roles;
  std::vector<double> held_host;            // per step
  std::vector<double> held_device;          // per step
  std::vector<double> device_share;         // per step: the report's device fragmentation share (-1: none)
  // The step (0-based) of each of the report's step rows, when the report
  // thinned them (step_rows.positions); empty when it holds one per step.
  // The series above have a value per step all the same (filled in
  // between rows).
  std::vector<size_t> rows;
  double peak = 0;                          // the report's peak live total
  std::string peak_kind;
  // The report's `allocator`: the host heap bypassed memledger (traced
  // false), or its held bytes could not be read (held_source null).
  std::string allocator;
  bool host_traced = true;
  bool host_held_known = true;
};

// A run to judge or compare: its JSON report and what check reads from it.
struct RunData {
  std::string path;                  // as given
  std::string source;                // "traces" or "report JSON"
  nlohmann::json report;             // schema memledger-report
  std::vector<std::string> command;  // run_command (run.json), or the root's command line split at spaces
  std::vector<ProcessData> processes;
  size_t root = 0;
  size_t main = 0;  // the root when it has steps, else the process with the most steps
};

struct LoadOptions {
  int warmup_steps = -1;  // -1: the report's own (a tenth of the steps, 1 to 10)
  std::vector<RoleRule> role_rules;  // a policy file's [roles], for runs analysed from their traces
  SymbolizerOptions symbolizer;
};

// RUN_DIR (its traces, or its report.json when the traces are gone), a
// trace file, or a report JSON file. Throws InputError.
RunData load_run_data(const std::string& path, const LoadOptions& options);
// From a report already in memory (tests, and the loader above).
RunData run_data_from_json(nlohmann::json report, const std::string& path, const std::string& source);

// "leak_steps 30 4096": the command line, for messages.
std::string command_text(const std::vector<std::string>& command);
// Same program (compared by file name) and the same arguments.
bool same_command(const std::vector<std::string>& a, const std::vector<std::string>& b);
// Where two command lines part: "argument 2 is '1153434' here and '1048576'
// in the baseline" (a: this run, b: the baseline); empty when the same.
std::string command_difference(const std::vector<std::string>& a, const std::vector<std::string>& b);

// One figure of a run: the worst process's value.
struct Figure {
  bool judged = true;
  std::string why_not;  // when not judged
  double value = 0;
  int pid = 0;
  std::string rank;
  bool several_processes = false;  // more than one process was judged (messages then name the pid)
  std::string site;       // what to look at: a suspect, an exit-leak site, an OOM site, a holder
  std::string site_role;  // "top suspect", "largest exit leak", ...
  // Growth only: the fit.
  double r_squared = 0;
  bool flat = false;
  uint64_t first_step = 0;
  uint64_t last_step = 0;
  bool plateau = false;  // the last half of the window grew less than the whole (the smaller slope was used)
  // A role's growth in sampled host mode that the report judged sampling
  // noise (no growth suspect of that role): `value` is 0, `estimate` the
  // slope of the estimated series.
  bool sampling_noise = false;
  double estimate = 0;
};

// The figure of `metric` over `scope`; warmup_steps < 0 takes each process's
// report warm-up.
Figure compute_figure(const RunData& run, Metric metric, Scope scope, int warmup_steps);

// Growth per step of one series: the Theil-Sen slope (median of the pairwise
// slopes) over the steps after warm-up, or over the last half of that window
// when it is smaller (a plateau). Not judged with fewer than 3 steps after
// warm-up. R² is the least-squares fit's over the same steps, for the reader.
struct GrowthFit {
  bool judged = false;
  double slope = 0;
  double r_squared = 0;
  bool flat = false;  // every step of the window ended with the same live bytes
  uint64_t first_step = 0;  // 1-based, the window
  uint64_t last_step = 0;
  bool plateau = false;
};
GrowthFit fit_growth(const std::vector<double>& series, int warmup_steps);

struct CheckItem {
  Metric metric = Metric::kGrowthPerStep;
  Scope scope = Scope::kTotal;
  bool vs_baseline = false;
  Figure figure;
  Figure base;           // vs_baseline only
  double limit = 0;      // the bound the figure was held to
  std::string limit_origin;
  double tolerance = 0;  // vs_baseline only
  double floor = 0;      // vs_baseline only
  bool passed = true;

  std::string id() const;    // "growth_per_step.host" or "growth_per_step.host.baseline"
  std::string name() const;  // "growth per step (host)", "... vs baseline"
  // "64.0 KiB/step > limit 16.0 KiB/step; top suspect: record_history at train_leak.cpp:34"
  std::string message() const;
};

struct RunSummary {
  std::string path;
  std::string source;
  std::vector<std::string> command;
  size_t steps = 0;  // of the main process
  int warmup_steps = 0;
  size_t processes = 0;
  std::string verdict;
};

struct CheckOutcome {
  RunSummary run;
  std::optional<RunSummary> baseline;
  std::optional<double> tolerance;
  std::vector<CheckItem> items;
  std::vector<std::string> notes;
  size_t failures() const;
  bool passed() const { return failures() == 0; }
};

// Judges `run` by the policy's limits, and against `baseline` when given
// (growth, peak, held and exit leak with tolerance and floor, OOM count).
// The caller checks the command lines.
CheckOutcome run_check(const RunData& run, const RunData* baseline, const Policy& policy);

std::string render_check_text(const CheckOutcome& outcome, bool failures_only);
// JUnit XML as Jenkins, GitLab and GitHub test reporters read it: one
// <testsuite name="memledger">, one <testcase> per judged limit.
std::string render_check_junit(const CheckOutcome& outcome, const std::string& timestamp,
                               const std::string& hostname, double seconds);
nlohmann::json render_check_json(const CheckOutcome& outcome);
std::string render_check_markdown(const CheckOutcome& outcome);

// `memledger diff A B`: per-step live series side by side (per kind), the
// change in the headline figures, and the sites whose growth or exit leak
// changed most, matched by site name (function at file:line).
nlohmann::json diff_runs(const RunData& a, const RunData& b, int warmup_steps, size_t max_sites);
std::string render_diff_text(const nlohmann::json& diff, size_t max_rows);

// XML text and attribute escaping (also drops characters XML 1.0 forbids).
std::string xml_escape(const std::string& text);

}  // namespace memledger::report
