#include "pressure.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "trace_format.h"

namespace memledger::report {

namespace {

namespace fmt = memledger::format;

std::string percent(double share) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", share * 100);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.1f s" : "%.0f s", s);
  return buf;
}

uint64_t page_size(const Trace& trace) {
  const uint64_t v = std::strtoull(trace.header_value("page_size", "4096").c_str(), nullptr, 10);
  return v == 0 ? 4096 : v;
}

bool has(const TracePressure& p, uint32_t bit) { return (p.present & bit) != 0; }

// Swap-in (bytes/s) and the share of time every task was stalled on memory
// between two records; -1 where a source is missing.
struct Interval {
  double swap_in = -1;
  double full_share = -1;
  bool thrashing() const { return swap_in >= kThrashSwapIn || full_share >= kThrashFullShare; }
};

Interval interval(const TracePressure& a, const TracePressure& b, uint64_t page) {
  Interval i;
  const double dt = static_cast<double>(b.ts - a.ts) / 1e9;
  if (dt <= 0) return i;
  if (has(a, fmt::kPressureVmstat) && has(b, fmt::kPressureVmstat) && b.swap_in >= a.swap_in) {
    i.swap_in = static_cast<double>(b.swap_in - a.swap_in) * static_cast<double>(page) / dt;
  }
  if (has(a, fmt::kPressurePsi) && has(b, fmt::kPressurePsi) && b.psi_full_total >= a.psi_full_total) {
    i.full_share = std::min(1.0, static_cast<double>(b.psi_full_total - a.psi_full_total) / 1e6 / dt);
  }
  return i;
}

// The trailing stretch of thrashing, as the index of the record it starts
// at (records.size(): none).
size_t thrash_start(const std::vector<TracePressure>& records, uint64_t page) {
  size_t start = records.size();
  double quiet = 0;
  for (size_t i = records.size(); i-- > 1;) {
    if (interval(records[i - 1], records[i], page).thrashing()) {
      start = i - 1;
      quiet = 0;
    } else {
      quiet += static_cast<double>(records[i].ts - records[i - 1].ts) / 1e9;
      if (quiet > kThrashGapSeconds) break;
    }
  }
  return start;
}

std::string freeze_finding(const std::vector<TracePressure>& records, size_t start, uint64_t page, double span) {
  const TracePressure& a = records[start];
  const TracePressure& b = records.back();
  const Interval avg = interval(a, b, page);
  const bool swapping = avg.swap_in >= kThrashSwapIn / 2;
  std::string text = std::string(swapping ? "the system was swapping hard" : "the system was stalled on memory") +
                     " for the last " + seconds(span) + " of the run (";
  std::vector<std::string> parts;
  if (avg.swap_in >= 0) parts.push_back("pages swapped in at " + human_bytes(avg.swap_in) + "/s");
  if (avg.full_share >= 0) parts.push_back("every task stalled on memory " + percent(avg.full_share) + " of the time");
  if (has(b, fmt::kPressureMeminfo)) {
    parts.push_back("MemAvailable " + human_bytes(double(b.mem_available)) + " of " + human_bytes(double(b.mem_total)) +
                    (b.swap_total ? ", swap " + human_bytes(double(b.swap_total - std::min(b.swap_free, b.swap_total))) +
                                        " used of " + human_bytes(double(b.swap_total))
                                  : std::string()) +
                    " at the end");
  }
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  return text +
         "): that is the freeze; the machine had too little memory for what ran on it: make the program hold less "
         "(batch size, DataLoader workers and prefetch, caches), stop what else uses memory, or run the job under a "
         "memory limit (systemd-run --scope -p MemoryMax=...) so that it is stopped instead of freezing the machine";
}

}  // namespace

HostPressure summarize_pressure(const Trace& trace) {
  HostPressure h;
  h.cgroup = trace.header_value("cgroup");
  const std::vector<TracePressure>& records = trace.pressure;
  if (records.empty()) return h;
  h.sampled = true;
  const uint64_t page = page_size(trace);
  bool first_events = true, have_mem = false;
  uint64_t first_kills = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const TracePressure& p = records[i];
    if (has(p, fmt::kPressureMeminfo)) {
      h.mem_total = p.mem_total;
      h.last_available = p.mem_available;
      if (!have_mem || p.mem_available < h.min_available) {
        have_mem = true;
        h.min_available = p.mem_available;
        h.min_available_ts = p.ts;
      }
      h.swap_total = std::max(h.swap_total, p.swap_total);
      h.max_swap_used = std::max(h.max_swap_used, p.swap_total - std::min(p.swap_free, p.swap_total));
    }
    if (has(p, fmt::kPressurePsi)) {
      h.psi = true;
      h.max_psi_some = std::max(h.max_psi_some, p.psi_some_avg10 / 100.0);
      h.max_psi_full = std::max(h.max_psi_full, p.psi_full_avg10 / 100.0);
    }
    if (has(p, fmt::kPressureVmstat)) h.swap_counters = true;
    if (has(p, fmt::kPressureCgroupEvents)) {
      if (first_events) first_kills = p.cgroup_oom_kills;
      first_events = false;
      h.cgroup_oom_kills = p.cgroup_oom_kills - std::min(first_kills, p.cgroup_oom_kills);
    }
  }
  // Swap-in is counted on the records that read /proc/vmstat (every 100 ms).
  std::vector<TracePressure> grid;
  for (const TracePressure& p : records) {
    if (has(p, fmt::kPressureVmstat)) grid.push_back(p);
  }
  if (grid.size() < 2) grid = records;
  for (size_t i = 1; i < grid.size(); ++i) h.max_swap_in = std::max(h.max_swap_in, interval(grid[i - 1], grid[i], page).swap_in);
  const size_t start = thrash_start(grid, page);
  if (start < grid.size()) {
    h.freeze_seconds = static_cast<double>(grid.back().ts - grid[start].ts) / 1e9;
    if (h.freeze_seconds >= kFreezeSeconds) h.freeze = freeze_finding(grid, start, page, h.freeze_seconds);
  }
  return h;
}

OomKillEvidence oom_kill_evidence(const Trace& trace, const KernelLog* kernel) {
  OomKillEvidence e;
  uint64_t rss = 0, limit = 0, usage = 0;
  if (!trace.samples.empty()) {
    rss = trace.samples.back().rss;
    limit = trace.samples.back().cgroup_limit;
    usage = trace.samples.back().cgroup_usage;
  }
  e.figures = "last RSS " + human_bytes(double(rss));
  if (limit != 0) {
    e.figures += ", cgroup limit " + human_bytes(double(limit)) + " (usage " + human_bytes(double(usage)) + ")";
    if (rss >= limit * 9 / 10 || usage >= limit * 95 / 100) {
      e.reasons.push_back("the cgroup was at " + percent(double(std::max(rss, usage)) / double(limit)) +
                          " of its limit");
    }
  } else {
    e.figures += ", no cgroup memory limit";
  }
  const TracePressure* last = nullptr;
  for (auto it = trace.pressure.rbegin(); it != trace.pressure.rend() && last == nullptr; ++it) {
    if (has(*it, fmt::kPressureMeminfo)) last = &*it;
  }
  if (last != nullptr && last->mem_total != 0) {
    e.figures += ", MemAvailable " + human_bytes(double(last->mem_available)) + " of " + human_bytes(double(last->mem_total));
    const double threshold = std::min(double(last->mem_total) * kExhaustedShare, double(kExhaustedBytes));
    if (double(last->mem_available) < threshold) e.reasons.push_back("the system's memory was nearly exhausted");
  }
  const int pid = trace.pid();
  if (kernel != nullptr && kernel->checked) {
    const std::string cgroup = trace.header_value("cgroup");
    auto after = kernel->cgroup_oom_kills.find(cgroup);
    const TracePressure* events = nullptr;
    for (auto it = trace.pressure.rbegin(); it != trace.pressure.rend() && events == nullptr; ++it) {
      if (has(*it, fmt::kPressureCgroupEvents)) events = &*it;
    }
    // A readable kernel log that names the OOM killer's victims, none of
    // them this process, tells whose kills the cgroup counted (another
    // process of the job that outgrew the limit later).
    const bool others_named = kernel->readable && !kernel->oom_kills.empty() && kernel->line_for(pid) == nullptr;
    if (!cgroup.empty() && after != kernel->cgroup_oom_kills.end() && events != nullptr &&
        after->second > events->cgroup_oom_kills && !others_named) {
      e.reasons.push_back("the cgroup's OOM kill count rose from " + std::to_string(events->cgroup_oom_kills) + " to " +
                          std::to_string(after->second) + " after the process's last sample");
    }
    if (const OomKillLine* line = kernel->line_for(pid); line != nullptr && pid != 0) {
      e.confirmed = true;
      e.kernel = "the kernel log says: " + line->text.substr(0, 400);
    } else if (!kernel->readable) {
      e.kernel = "the kernel log could not be read (" + kernel->why_not + ")";
    } else {
      e.kernel = "the kernel log has no OOM-killer line for pid " + std::to_string(pid);
    }
  } else {
    e.kernel = "the kernel log was not read (memledger run reads it when the command ends)";
  }
  e.likely = e.confirmed || !e.reasons.empty();
  return e;
}

void judge_pressure(const HostPressure& pressure, Verdict& verdict, std::vector<std::string>& notes) {
  if (pressure.freeze.empty()) return;
  if (verdict.kind == "killed" || verdict.kind == "host_oom_kill" || verdict.kind == "signal") {
    verdict.summary += "; " + pressure.freeze;
  } else {
    notes.push_back(pressure.freeze);
  }
}

std::string pressure_line(const HostPressure& h) {
  if (!h.sampled) return "";
  std::string line = "host memory:";
  if (h.mem_total != 0) {
    char at[32];
    std::snprintf(at, sizeof at, "%.1f s", static_cast<double>(h.min_available_ts) / 1e9);
    line += " MemAvailable lowest " + human_bytes(double(h.min_available)) + " of " + human_bytes(double(h.mem_total)) +
            " (at " + at + ");";
    line += h.swap_total == 0 ? " no swap;"
                              : " swap used up to " + human_bytes(double(h.max_swap_used)) + " of " +
                                    human_bytes(double(h.swap_total)) + ";";
  }
  if (h.swap_counters && h.swap_total != 0) line += " swap-in up to " + human_bytes(h.max_swap_in) + "/s;";
  if (h.psi) {
    char psi[96];
    std::snprintf(psi, sizeof psi, " memory pressure (PSI avg10) up to %.1f%% some, %.1f%% full;", h.max_psi_some,
                  h.max_psi_full);
    line += psi;
  } else {
    line += " no PSI (/proc/pressure/memory) in this kernel;";
  }
  if (!h.cgroup.empty()) {
    line += " cgroup " + h.cgroup;
    if (h.cgroup_oom_kills != 0) line += ", " + std::to_string(h.cgroup_oom_kills) + " OOM kills in it during the run";
    line += ";";
  }
  line.pop_back();
  return line;
}

}  // namespace memledger::report
