#include "job_report.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

namespace memledger::report {
namespace {

// A rank as a number for ordering; ranks that are not numbers sort last.
long rank_number(const std::string& rank) {
  char* end = nullptr;
  const long v = std::strtol(rank.c_str(), &end, 10);
  return rank.empty() || *end != '\0' ? -1 : v;
}

// The verdict in a table cell: its kind, with the exit code or the signal.
std::string short_status(const Verdict& v) {
  if (v.kind == "exit") {
    if (v.summary.find("not recorded") != std::string::npos) return "exit ?";
    return "exit " + std::to_string(v.exit_code);
  }
  if (!v.signal_name.empty() && v.kind != "cuda_oom") return v.kind + " " + v.signal_name;
  return v.kind;
}

}  // namespace

std::string growth_rate_text(const ProcessRow& row, bool per_parent_step) {
  if (row.time_windows && row.parent_pid > 0 && per_parent_step) {
    return human_bytes(row.suspect_bytes_per_second) + "/s (" + human_bytes(row.suspect_bytes_per_parent_step) +
           " per step of pid " + std::to_string(row.parent_pid) + ")";
  }
  if (row.time_windows) return human_bytes(row.suspect_bytes_per_second) + "/s";
  return human_bytes(row.suspect_bytes_per_step) + "/step";
}

namespace {

// A process judged over time windows whose parent has steps (markers, a
// data loader, a found loop) while it lives: how much its suspects grew
// from the first to the last parent step that lies within its windows,
// divided by the number of those steps (each suspect's live bytes read at
// the window ends, and interpolated between them). A DataLoader worker then
// grows "per training step".
void per_parent_step(const RunReport& run, const ProcessReport& p, ProcessRow& row) {
  const ProcessReport* parent = nullptr;
  for (const ProcessReport& q : run.processes) {
    if (q.pid == p.ppid && q.start_mono_ns <= p.start_mono_ns) parent = &q;  // its latest image before the child
  }
  if (parent == nullptr || parent->window_seconds > 0 || parent->steps.size() < 3 || p.steps.size() < 2) return;
  // Times on the child's clock (ns since its trace began).
  const int64_t shift = static_cast<int64_t>(parent->start_mono_ns) - static_cast<int64_t>(p.start_mono_ns);
  const int64_t from = static_cast<int64_t>(p.steps.front().end_ns), to = static_cast<int64_t>(p.steps.back().end_ns);
  int64_t first = 0, last = 0;
  size_t count = 0;
  for (size_t k = 1; k < parent->steps.size(); ++k) {
    const int64_t begin = static_cast<int64_t>(parent->steps[k - 1].end_ns) + shift;
    const int64_t end = static_cast<int64_t>(parent->steps[k].end_ns) + shift;
    if (begin < from || end > to || end <= begin) continue;
    if (count++ == 0) first = begin;
    last = end;
  }
  if (count < 3) return;
  auto live_at = [&](const LeakSuspect& s, int64_t t) {
    size_t k = 1;
    while (k + 1 < p.steps.size() && static_cast<int64_t>(p.steps[k].end_ns) < t) ++k;
    const double t0 = static_cast<double>(p.steps[k - 1].end_ns), t1 = static_cast<double>(p.steps[k].end_ns);
    const double v0 = static_cast<double>(s.series[k - 1]), v1 = static_cast<double>(s.series[k]);
    return t1 > t0 ? v0 + (v1 - v0) * (static_cast<double>(t) - t0) / (t1 - t0) : v1;
  };
  double grown = 0;
  for (const LeakSuspect& s : p.leak_suspects) {
    if (s.series.size() != p.steps.size()) return;
    grown += live_at(s, last) - live_at(s, first);
  }
  row.parent_step_seconds = static_cast<double>(last - first) / 1e9 / static_cast<double>(count);
  row.suspect_bytes_per_parent_step = std::max(0.0, grown / static_cast<double>(count));
  row.parent_pid = parent->pid;
}

}  // namespace

JobSummary summarize_job(const RunReport& run) {
  JobSummary job;
  std::map<int, int> images_of_pid;
  for (const ProcessReport& p : run.processes) ++images_of_pid[p.pid];
  std::map<int, int> image_seen;
  for (size_t i = 0; i < run.processes.size(); ++i) {
    const ProcessReport& p = run.processes[i];
    ProcessRow row;
    row.index = i;
    row.root = i == run.root;
    row.label = p.rank.empty() ? "pid " + std::to_string(p.pid) : "rank " + p.rank + " (pid " + std::to_string(p.pid) + ")";
    const int image = ++image_seen[p.pid];  // processes are in start order
    const bool parent_traced = std::any_of(run.processes.begin(), run.processes.end(),
                                           [&](const ProcessReport& q) { return q.pid == p.ppid; });
    if (i == run.root) {
      row.role = "root";
    } else if (parent_traced) {
      row.role = "child of pid " + std::to_string(p.ppid);
    } else {
      row.role = "not a child of a traced process";
    }
    if (images_of_pid[p.pid] > 1) {
      row.role += ", image " + std::to_string(image) + " of " + std::to_string(images_of_pid[p.pid]) + " (exec)";
    }
    if (!p.rank.empty() && !p.world_size.empty()) row.role += ", rank " + p.rank + " of " + p.world_size;
    row.steps = p.steps.size();
    row.peak_bytes = p.peak.bytes;
    row.peak_step = p.peak.step;
    if (!p.steps.empty()) row.live_at_last_step = total_live(p.steps.back());
    const size_t first = static_cast<size_t>(std::max(0, p.warmup_steps));
    if (p.steps.size() >= first + 3) {
      std::vector<double> y;
      for (size_t k = first; k < p.steps.size(); ++k) y.push_back(static_cast<double>(total_live(p.steps[k])));
      row.live_growth_per_step = fit_line(y).slope;
    }
    row.python_role = p.python_role;
    row.start_method = p.start_method;
    row.kernel_id = p.kernel_id;
    row.suspects = p.leak_suspects.size();
    for (const LeakSuspect& s : p.leak_suspects) row.suspect_bytes_per_step += s.bytes_per_step;
    row.time_windows = p.window_seconds > 0;
    if (row.time_windows) {
      row.suspect_bytes_per_second = row.suspect_bytes_per_step / p.window_seconds;
    } else if (p.steps.size() >= 2 && p.steps.back().end_ns > p.steps.front().end_ns) {
      const double step_seconds =
          static_cast<double>(p.steps.back().end_ns - p.steps.front().end_ns) / 1e9 / static_cast<double>(p.steps.size() - 1);
      row.suspect_bytes_per_second = row.suspect_bytes_per_step / step_seconds;
    }
    if (row.time_windows) per_parent_step(run, p, row);
    row.copied_on_write = p.copied_on_write;
    if (!p.leak_suspects.empty()) row.top_site = site_name(p.leak_suspects.front().site);
    row.exit_leak_bytes = p.exit_leak_bytes;
    row.verdict_kind = p.verdict.kind;
    row.status = short_status(p.verdict);
    row.verdict = p.verdict.summary;
    job.rows.push_back(std::move(row));
  }
  // "DataLoader worker 1 of 2": numbered among the parent's children of
  // that role, in start order.
  for (ProcessRow& row : job.rows) {
    if (row.python_role.empty()) continue;
    if (row.python_role.starts_with("Jupyter ")) {
      // "Jupyter kernel <id> (pid 12)": a notebook's kernel is known by its
      // id; one the server restarts keeps it, in a new process.
      const std::string named = row.python_role + (row.kernel_id.empty() ? "" : " " + row.kernel_id);
      row.label = named + " (pid " + std::to_string(run.processes[row.index].pid) + ")";
      row.role = named + ", " + row.role;
      continue;
    }
    const int ppid = run.processes[row.index].ppid;
    for (const ProcessRow& other : job.rows) {
      if (other.python_role != row.python_role || run.processes[other.index].ppid != ppid) continue;
      if (other.index < row.index) ++row.role_index;
      ++row.role_count;
    }
    ++row.role_index;
    const std::string pid = std::to_string(run.processes[row.index].pid);
    std::string role = row.python_role + " " + std::to_string(row.role_index) + " of " + std::to_string(row.role_count);
    row.label = role + " (pid " + pid + ")";
    if (!row.start_method.empty()) role += " (" + row.start_method + ")";
    row.role = role + ", " + row.role;
  }
  std::stable_sort(job.rows.begin(), job.rows.end(), [&](const ProcessRow& a, const ProcessRow& b) {
    const bool a_root = a.index == run.root, b_root = b.index == run.root;
    if (a_root != b_root) return a_root;
    const long ra = rank_number(run.processes[a.index].rank), rb = rank_number(run.processes[b.index].rank);
    if ((ra >= 0) != (rb >= 0)) return ra >= 0;
    if (ra != rb) return ra < rb;
    return a.index < b.index;
  });
  for (size_t i = 0; i < job.rows.size(); ++i) {
    if (job.rows[i].suspects > 0) job.growing.push_back(i);
  }
  // Processes judged over time windows grow per second, the others per
  // step: with one of each among the growing, the order is per second.
  const bool per_second =
      std::any_of(job.growing.begin(), job.growing.end(), [&](size_t g) { return job.rows[g].time_windows; });
  std::stable_sort(job.growing.begin(), job.growing.end(), [&](size_t a, size_t b) {
    return per_second ? job.rows[a].suspect_bytes_per_second > job.rows[b].suspect_bytes_per_second
                      : job.rows[a].suspect_bytes_per_step > job.rows[b].suspect_bytes_per_step;
  });

  const size_t n = job.rows.size();
  const std::string of_n = std::to_string(n) + (n == 1 ? " process" : " processes");
  if (job.growing.empty()) {
    job.conclusion = n == 1 ? "the process does not grow: no growth suspects"
                            : "no process grows: none of the " + of_n + " has growth suspects";
  } else {
    const ProcessRow& top = job.rows[job.growing.front()];
    std::ostringstream out;
    out << top.label << " grows fastest: " << growth_rate_text(top, true) << " in "
        << top.suspects << (top.suspects == 1 ? " suspect" : " suspects") << ", top site " << top.top_site;
    if (n > 1) {
      out << "; " << job.growing.size() << " of " << of_n << (job.growing.size() == 1 ? " grows" : " grow");
      if (job.growing.size() > 1) {
        out << " (";
        for (size_t k = 1; k < job.growing.size() && k < 6; ++k) {
          const ProcessRow& r = job.rows[job.growing[k]];
          out << (k > 1 ? ", " : "") << r.label << " " << growth_rate_text(r, true);
        }
        if (job.growing.size() > 6) out << ", ...";
        out << ")";
      }
    }
    job.conclusion = out.str();
  }
  // Memory copied on write grows no site: the verdict says it beside.
  std::vector<const ProcessRow*> copied;
  for (const ProcessRow& r : job.rows) {
    if (r.copied_on_write > 0) copied.push_back(&r);
  }
  std::stable_sort(copied.begin(), copied.end(),
                   [](const ProcessRow* a, const ProcessRow* b) { return a->copied_on_write > b->copied_on_write; });
  for (size_t k = 0; k < copied.size() && k < 3; ++k) {
    job.conclusion += (k == 0 ? "; " : ", ") + copied[k]->label + " copied " +
                      human_bytes(static_cast<double>(copied[k]->copied_on_write)) +
                      (k == 0 ? " of its parent's memory on write (copy-on-write: see its notes)" : "");
  }
  if (copied.size() > 3) job.conclusion += ", ...";
  // A process killed or crashed while the job went on (a notebook's kernel
  // under a Jupyter server, a worker): the verdict names it.
  for (size_t i = 0; i < job.rows.size(); ++i) {
    const std::string& kind = job.rows[i].verdict_kind;
    if (job.rows[i].index != run.root && (kind == "killed" || kind == "host_oom_kill" || kind == "crash")) {
      job.died.push_back(i);
    }
  }
  std::stable_sort(job.died.begin(), job.died.end(), [&](size_t a, size_t b) { return job.rows[a].index < job.rows[b].index; });
  for (size_t k = 0; k < job.died.size() && k < 3; ++k) {
    const ProcessRow& r = job.rows[job.died[k]];
    job.conclusion += "; " + r.label + (r.verdict_kind == "crash" ? " " : " was ") + r.verdict;
  }
  if (job.died.size() > 3) job.conclusion += "; " + std::to_string(job.died.size() - 3) + " more processes died";
  return job;
}

nlohmann::json job_json(const JobSummary& job) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ProcessRow& r : job.rows) {
    rows.push_back({{"process", r.index},
                    {"label", r.label},
                    {"role", r.role},
                    {"python_role", r.python_role},
                    {"role_index", r.role_index},
                    {"role_count", r.role_count},
                    {"start_method", r.start_method},
                    {"kernel_id", r.kernel_id},
                    {"suspect_bytes_per_second", r.suspect_bytes_per_second},
                    {"time_windows", r.time_windows},
                    {"suspect_bytes_per_parent_step", r.suspect_bytes_per_parent_step},
                    {"parent_step_seconds", r.parent_step_seconds},
                    {"parent_pid", r.parent_pid},
                    {"copied_on_write", r.copied_on_write},
                    {"steps", r.steps},
                    {"peak_bytes", r.peak_bytes},
                    {"peak_step", r.peak_step},
                    {"live_at_last_step", r.live_at_last_step},
                    {"live_growth_per_step", r.live_growth_per_step},
                    {"suspects", r.suspects},
                    {"suspect_bytes_per_step", r.suspect_bytes_per_step},
                    {"top_site", r.top_site},
                    {"exit_leak_bytes", r.exit_leak_bytes},
                    {"verdict_kind", r.verdict_kind},
                    {"status", r.status},
                    {"verdict", r.verdict}});
  }
  nlohmann::json growing = nlohmann::json::array();
  for (size_t g : job.growing) growing.push_back(job.rows[g].index);
  nlohmann::json died = nlohmann::json::array();
  for (size_t d : job.died) died.push_back(job.rows[d].index);
  return {{"rows", rows}, {"growing", growing}, {"died", died}, {"conclusion", job.conclusion}};
}

std::string render_job_text(const JobSummary& job) {
  std::ostringstream out;
  out << "whole job: " << job.conclusion << "\n";
  // The process column is 40 wide, wider for a longer label (a Jupyter
  // kernel's id).
  int width = 40;
  for (const ProcessRow& r : job.rows) width = std::max(width, std::min(80, static_cast<int>(r.label.size())));
  out << "  " << std::string("process") + std::string(static_cast<size_t>(width) - 7, ' ')
      << "  steps   peak live       growth  suspects  exit leaks  verdict\n";
  for (const ProcessRow& r : job.rows) {
    char line[320];
    std::snprintf(line, sizeof line, "  %-*s %6zu  %10s  %11s  %8zu  %10s  ", width,
                  r.label.substr(0, static_cast<size_t>(width)).c_str(), r.steps,
                  human_bytes(double(r.peak_bytes)).c_str(), r.suspects ? growth_rate_text(r).c_str() : "-", r.suspects,
                  human_bytes(double(r.exit_leak_bytes)).c_str());
    out << line << r.status << (r.root ? " (root)" : "") << "\n";
  }
  return out.str();
}

}  // namespace memledger::report
