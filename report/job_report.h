// The whole job at a glance: one row per traced process image (DataLoader
// workers, subprocesses, one process per rank under torchrun/mpirun/srun)
// and which of them grows. Every renderer shows the same table.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_report.h"

namespace memledger::report {

struct ProcessRow {
  size_t index = 0;     // into RunReport::processes
  bool root = false;    // RunReport::root
  std::string label;    // "rank 3" when the launcher set a rank, else "pid 1234"
  std::string role;     // "root", "child of pid 1234", "not a child of a traced process",
                        // then ", image 2 of 2 (exec)" for a pid with several images, ", rank 1 of 8"
  size_t steps = 0;
  int64_t peak_bytes = 0;
  uint64_t peak_step = 0;
  int64_t live_at_last_step = 0;  // all kinds, at the last step end
  // Least-squares slope of the total live bytes (all kinds) at the step ends
  // after the warm-up; 0 with fewer than 3 steps after it.
  double live_growth_per_step = 0;
  // The Python framework role ("DataLoader worker"), its index among the
  // parent's children of that role in start order, and how many there are;
  // and how multiprocessing started it ("spawn", "forkserver"; empty: fork
  // or not multiprocessing).
  std::string python_role;
  int role_index = -1;
  int role_count = 0;
  std::string start_method;
  std::string kernel_id;  // a Jupyter kernel's id (ProcessReport::kernel_id)
  size_t suspects = 0;
  double suspect_bytes_per_step = 0;  // sum over the growth suspects
  // The same per second: over time windows (a process without steps), or
  // over the mean step time; 0 when the steps have no duration.
  double suspect_bytes_per_second = 0;
  bool time_windows = false;  // steps are time windows (source "time")
  // Over time windows, when the parent has steps of its own during this
  // process's life: the suspects' growth per parent step over the parent's
  // steps within its windows, and the parent's mean step time then
  // (parent_step_seconds); 0 otherwise.
  double suspect_bytes_per_parent_step = 0;
  double parent_step_seconds = 0;
  int parent_pid = 0;
  uint64_t copied_on_write = 0;  // ProcessReport::copied_on_write
  std::string top_site;               // the first suspect's site
  int64_t exit_leak_bytes = 0;
  std::string verdict_kind;
  std::string status;  // the verdict in short: "exit 4", "signal SIGTERM", "exec"
  std::string verdict;
};

// A row's suspects' growth: "1.2 MiB/step", or "1.2 MiB/s" over time windows,
// with "(96.0 KiB per step of pid 12)" when the parent has steps.
std::string growth_rate_text(const ProcessRow& row, bool per_parent_step = false);

struct JobSummary {
  std::vector<ProcessRow> rows;  // root first, then by rank, then in start order
  std::vector<size_t> growing;   // indices into rows of the processes with growth suspects, fastest first
  // Indices into rows of the processes other than the root that were killed
  // (SIGKILL, the OOM killer) or crashed, in start order.
  std::vector<size_t> died;
  std::string conclusion;        // one sentence: which process or rank grows, then which died
};

JobSummary summarize_job(const RunReport& run);
nlohmann::json job_json(const JobSummary& job);
std::string render_job_text(const JobSummary& job);

}  // namespace memledger::report
