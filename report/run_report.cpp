#include "run_report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <sys/wait.h>

#include "environment.h"
#include "pressure.h"
#include "file_io.h"
#include "job_report.h"
#include "role_report.h"
#include "sampling.h"
#include "stack_fold.h"
#include "trace_format.h"

namespace memledger::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RunFile {
  bool present = false;
  std::vector<std::string> command;
  int root_pid = 0;
  ExitInfo exit;
  std::string untraced;  // why no process was traced, when `memledger run` could tell
  KernelLog kernel;      // "kernel": what the kernel said after the run
};

RunFile read_run_file(const fs::path& dir, std::vector<std::string>& problems) {
  RunFile rf;
  fs::path p = dir / "run.json";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(p, ec))) return rf;
  std::string text, error;
  if (!read_regular_file(p.string(), text, error, size_t{1} << 20)) {
    problems.push_back(error + "; exit status taken from the traces");
    return rf;
  }
  try {
    json j = json::parse(text);
    rf.present = true;
    if (j.contains("command")) rf.command = j["command"].get<std::vector<std::string>>();
    rf.root_pid = j.value("root_pid", 0);
    rf.untraced = j.value("untraced", "");
    if (j.contains("kernel")) rf.kernel = kernel_log_from_json(j["kernel"]);
    if (j.contains("exit") && j["exit"].is_object()) {
      const json& e = j["exit"];
      rf.exit.known = true;
      if (e.contains("signal")) {
        rf.exit.signaled = true;
        rf.exit.signo = e["signal"].get<int>();
      } else {
        rf.exit.code = e.value("code", 0);
      }
    }
  } catch (const std::exception& ex) {
    problems.push_back(p.string() + ": unreadable (" + ex.what() + "); exit status taken from the traces");
  }
  return rf;
}

}  // namespace

std::string frame_text(const Frame& f) {
  std::string out = f.function.empty() ? "??" : f.function;
  if (!f.file.empty()) {
    out += "  " + f.file;
    if (f.line > 0) out += ":" + std::to_string(f.line);
  } else if (!f.module.empty()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%" PRIx64, f.address);
    out += "  (" + f.module + " " + buf + ")";
  }
  if (f.inlined) out += "  [inlined]";
  if (f.attributed) out += "  [attributed]";
  return out;
}

std::string site_name(const Site& site) {
  if (site.frames.empty()) return "stack #" + std::to_string(site.stack) + " (no frames recorded)";
  const Frame& f = site.frames[user_frame_index(site.frames)];
  std::string out = f.function.empty() ? "??" : f.function;
  if (!f.file.empty()) {
    out += " at " + fs::path(f.file).filename().string();
    if (f.line > 0) out += ":" + std::to_string(f.line);
  } else if (!f.module.empty()) {
    out += " in " + fs::path(f.module).filename().string();
  }
  // Allocated on a framework's thread while the main thread was at this line.
  if (f.attributed) out += " (attributed from the main thread)";
  return out;
}

namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

json frames_json(const std::vector<Frame>& frames) {
  json out = json::array();
  for (const Frame& f : frames) {
    char addr[32];
    std::snprintf(addr, sizeof addr, "0x%" PRIx64, f.address);
    out.push_back({{"function", f.function},
                   {"file", f.file},
                   {"line", f.line},
                   {"module", f.module},
                   {"address", addr},
                   {"inlined", f.inlined},
                   {"attributed", f.attributed},
                   {"language", f.python ? "python" : "native"}});
  }
  return out;
}

// A row's stacks (one row per user line): their number, and each of them
// with its own figures when more than one was merged.
template <typename T, typename ToJson>
void merged_json(const T& row, ToJson to_json, json& out) {
  out["stacks_merged"] = row.stacks_merged;
  if (row.variants.empty()) return;
  json variants = json::array();
  for (const T& v : row.variants) variants.push_back(to_json(v));
  out["variants"] = std::move(variants);
}

json site_total_json(const SiteTotal& t) {
  json out = {{"kind", format::kind_name(static_cast<format::Kind>(t.site.kind))},
              {"site", site_name(t.site)},
              {"bytes", t.bytes},
              {"count", t.count},
              {"estimated", t.estimated},
              {"bytes_error", t.bytes_error},
              {"stack", frames_json(t.site.frames)}};
  if (t.site.graph) out["graph_owned"] = true;
  if (!t.site.role.empty()) out["role"] = t.site.role;
  merged_json(t, site_total_json, out);
  return out;
}

json site_totals_json(const std::vector<SiteTotal>& totals) {
  json out = json::array();
  for (const SiteTotal& t : totals) out.push_back(site_total_json(t));
  return out;
}

json suspect_json(const LeakSuspect& s) {
  json out = {{"kind", format::kind_name(static_cast<format::Kind>(s.site.kind))},
              {"site", site_name(s.site)},
              {"bytes_per_step", std::llround(s.bytes_per_step)},
              {"bytes_per_step_exact", s.bytes_per_step},
              {"allocations_per_step", s.allocations_per_step},
              {"estimated", s.estimated},
              {"bytes_per_step_error", s.bytes_per_step_error},
              {"allocations_per_step_error", s.allocations_per_step_error},
              {"first_step", s.first_step},
              {"monotonicity", s.monotonicity},
              {"r_squared", s.r_squared},
              {"live_at_end", s.live_at_end},
              {"series", s.series},
              {"stack", frames_json(s.site.frames)}};
  if (s.window_seconds > 0) {
    out["window_seconds"] = s.window_seconds;
    out["bytes_per_second"] = s.bytes_per_step / s.window_seconds;
  }
  if (s.site.graph) out["graph_owned"] = true;
  if (!s.site.role.empty()) {
    out["role"] = s.site.role;
    out["role_rule"] = s.site.role_rule;
    out["role_explanation"] = s.role_explanation;
  }
  if (!s.kept_by.empty()) {
    json kept = json::array();
    for (const KeptBy& k : s.kept_by) kept.push_back({{"hops", k.hops}, {"objects", k.objects}, {"bytes", k.bytes}});
    out["kept_by"] = std::move(kept);
  }
  merged_json(s, suspect_json, out);
  return out;
}

std::string hex(uint64_t value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, value);
  return buf;
}

std::string mismatch_site(const CuptiMismatch& m) {
  Site site;
  site.stack = m.stack;
  site.kind = m.kind;
  site.frames = m.frames;
  return site_name(site);
}

// The first allocations whose byte counts CUPTI and the hooks disagree on:
// the hooks' site and size beside CUPTI's.
json size_differences(const std::vector<CuptiMismatch>& items) {
  json out = json::array();
  for (const CuptiMismatch& m : items) {
    out.push_back({{"ts_ns", m.ts_ns},
                   {"address", hex(m.addr)},
                   {"bytes", m.bytes},
                   {"cupti_bytes", m.cupti_bytes},
                   {"kind", format::kind_name(static_cast<format::Kind>(m.kind))},
                   {"device", m.device},
                   {"site", mismatch_site(m)},
                   {"mapping", m.mapping},
                   {"cupti_kind", format::cupti_kind_name(m.cupti_kind)},
                   {"async", m.async},
                   {"correlation", m.correlation}});
  }
  return out;
}

json cupti_json(const CuptiView& c) {
  auto list = [](const std::vector<CuptiMismatch>& items, bool hooks) {
    json out = json::array();
    for (const CuptiMismatch& m : items) {
      json item = {{"ts_ns", m.ts_ns},
                   {"address", hex(m.addr)},
                   {"bytes", m.bytes},
                   {"kind", format::kind_name(static_cast<format::Kind>(m.kind))},
                   {"device", m.device}};
      if (hooks) {
        item["site"] = mismatch_site(m);
        item["stack"] = frames_json(m.frames);
        item["mapping"] = m.mapping;
      } else {
        item["pc"] = hex(m.pc);
        item["cupti_kind"] = format::cupti_kind_name(m.cupti_kind);
        item["async"] = m.async;
        item["correlation"] = m.correlation;
        if (!m.name.empty()) item["name"] = m.name;
      }
      out.push_back(std::move(item));
    }
    return out;
  };
  return {{"status", c.status},
          {"message", c.message},
          {"end", c.end_message},
          {"holder", c.holder},
          {"version", c.version},
          {"compared", c.compared},
          {"allocations", c.cupti_allocations},
          {"releases", c.cupti_releases},
          {"pool_records", c.cupti_pool_records},
          {"dropped", c.cupti_dropped},
          {"matched", c.matched},
          {"matched_bytes", c.matched_bytes},
          {"size_differences", c.size_differences},
          {"size_difference_samples", size_differences(c.size_differences_list)},
          {"matched_mappings", c.matched_mappings},
          {"module_statics",
           {{"count", c.module_statics}, {"bytes", c.module_statics_bytes}, {"allocations", list(c.module_statics_list, false)}}},
          {"hooks_only", {{"count", c.hooks_only}, {"bytes", c.hooks_only_bytes}, {"allocations", list(c.hooks_only_list, true)}}},
          {"cupti_only", {{"count", c.cupti_only}, {"bytes", c.cupti_only_bytes}, {"allocations", list(c.cupti_only_list, false)}}}};
}

// A suspect's series (a value per step), and its variants', at the steps of
// the rows kept.
void thin_series(json& suspect, const std::vector<size_t>& rows) {
  json& series = suspect["series"];
  json kept = json::array();
  for (const size_t row : rows) kept.push_back(row < series.size() ? series[row] : json(0));
  series = std::move(kept);
  if (suspect.contains("variants")) {
    for (json& variant : suspect["variants"]) thin_series(variant, rows);
  }
}

// How many steps the process has and how many of their rows the report
// holds; `positions` (1-based step numbers of the rows) when they differ.
json step_rows_json(size_t n_steps, const std::vector<size_t>& rows, size_t limit) {
  json out = {{"steps", n_steps}, {"rows", rows.size()}, {"limit", limit}, {"thinned", rows.size() < n_steps}};
  if (rows.size() < n_steps) {
    json positions = json::array();
    for (const size_t row : rows) positions.push_back(row + 1);
    out["positions"] = positions;
  }
  return out;
}

std::string thinned_note(size_t n_steps, size_t rows, size_t limit) {
  return std::to_string(n_steps) + " steps: the JSON report holds " + std::to_string(rows) +
         " of their rows (at most " + std::to_string(limit) +
         ": evenly spaced steps, the first, the last and each peak; step_rows.positions names them), and the "
         "suspects' series at the same steps. The figures, suspects and charts are computed over every step";
}

// The positions (0-based) of the steps whose rows the JSON report holds:
// every step up to `limit` (0: no limit); past it, evenly spaced steps
// together with the first, the last and those where the live bytes of each
// kind, of all kinds, and the held bytes peaked, so that every peak a reader
// or `memledger check` looks for is among the rows. At most `limit` rows.
std::vector<size_t> step_rows(const std::vector<StepStats>& steps, size_t limit) {
  const size_t n = steps.size();
  std::vector<size_t> rows;
  if (limit == 0 || n <= limit) {
    for (size_t k = 0; k < n; ++k) rows.push_back(k);
    return rows;
  }
  auto peak_of = [&](auto value) {
    size_t best = 0;
    for (size_t k = 1; k < n; ++k) best = value(steps[k]) > value(steps[best]) ? k : best;
    return best;
  };
  rows = {0, n - 1, peak_of([](const StepStats& s) { return s.live[0] + s.live[1] + s.live[2] + s.live[3] + s.live[4]; }),
          peak_of([](const StepStats& s) { return s.held_host; }),
          peak_of([](const StepStats& s) { return s.held_device; }),
          peak_of([](const StepStats& s) { return static_cast<int64_t>(s.held_host) + s.held_device; })};
  for (int kind = 0; kind < format::kKindCount; ++kind) {
    rows.push_back(peak_of([kind](const StepStats& s) { return s.live[kind]; }));
  }
  const size_t even = std::max<size_t>(2, limit > rows.size() ? limit - rows.size() : 2);
  for (size_t i = 0; i < even; ++i) rows.push_back(i * (n - 1) / (even - 1));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// The CUDA stack and frameworks (environment.h).
json environment_json(const Environment& e) {
  json libraries = json::array();
  for (const CudaLibrary& l : e.libraries) {
    libraries.push_back({{"name", l.name}, {"path", l.path}, {"version", l.version}, {"build_id", l.build_id},
                         {"major", l.major}});
  }
  json frameworks = json::object();
  for (const auto& [name, fields] : e.frameworks) {
    json f = json::object();
    for (const auto& [field, value] : fields) f[field] = value;
    frameworks[name] = std::move(f);
  }
  return {{"driver_cuda", e.driver},     {"driver_release", e.driver_release},
          {"driver_library_release", e.driver_library_release}, {"devices", e.devices},       {"libraries", libraries},
          {"frameworks", frameworks},     {"init_error", e.init_error}, {"create_errors", e.create_errors}, {"python_exception", e.python_exception},
          {"findings", e.findings},       {"lines", environment_lines(e)}};
}

// The host's memory over the run (pressure.h).
json host_memory_json(const HostPressure& h) {
  return {{"sampled", h.sampled},
          {"mem_total", h.mem_total},
          {"min_available", h.min_available},
          {"min_available_ts_ns", h.min_available_ts},
          {"last_available", h.last_available},
          {"swap_total", h.swap_total},
          {"max_swap_used", h.max_swap_used},
          {"max_swap_in_per_s", h.max_swap_in},
          {"psi", h.psi},
          {"max_psi_some_avg10", h.max_psi_some},
          {"max_psi_full_avg10", h.max_psi_full},
          {"cgroup", h.cgroup},
          {"cgroup_oom_kills", h.cgroup_oom_kills},
          {"freeze_seconds", h.freeze_seconds},
          {"freeze", h.freeze},
          {"line", pressure_line(h)}};
}

json step_json(const ProcessReport& p, const StepStats& s) {
  json live = json::object();
  for (int k = 0; k < format::kKindCount; ++k) {
    if (k == 0 || s.live[k] != 0) live[format::kind_name(static_cast<format::Kind>(k))] = s.live[k];
  }
  json step = {{"index", s.index},
               {"source", s.source},
               {"label", s.label},
               {"end_ns", s.end_ns},
               {"live", live},
               {"held", {{"host", p.allocator.held_known ? json(s.held_host) : json(nullptr)}}},
               {"rss", s.rss},
               {"allocations", s.allocations},
               {"frees", s.frees}};
  if (s.held_device != 0 || s.live[1] != 0 || s.live[2] != 0 || s.device_total != 0) {
    step["held"]["device"] = s.held_device;
    const int64_t device_live = s.live[1] + s.live[2];
    const int64_t frag = std::max<int64_t>(0, s.held_device - device_live);
    json holders = json::array();
    for (const Holder& h : s.device_holders) holders.push_back({{"name", h.name}, {"held", h.held}, {"unused", h.unused}});
    step["fragmentation"] = {{"device",
                              {{"bytes", frag},
                               {"share", s.held_device > 0 ? double(frag) / double(s.held_device) : 0.0},
                               {"holders", holders}}}};
    if (s.live_by_device.size() > 1) step["live_by_device"] = s.live_by_device;
    if (s.device_total) step["device_memory"] = {{"free", s.device_free}, {"total", s.device_total}};
    if (!s.not_hooked_by_device.empty()) {
      json by_device = json::object();
      for (const auto& [device, bytes] : s.not_hooked_by_device) by_device[std::to_string(device)] = bytes;
      step["not_hooked_by_device"] = by_device;
    }
    if (s.reserved_address_space) step["reserved_address_space"] = s.reserved_address_space;
  }
  return step;
}

json verdict_json(const Verdict& v) {
  json verdict = {{"kind", v.kind},
                  {"summary", v.summary},
                  {"exit_code", v.exit_code},
                  {"signal", v.signo},
                  {"signal_name", v.signal_name},
                  {"last_rss", v.last_rss},
                  {"cgroup_limit", v.cgroup_limit},
                  {"cgroup_usage", v.cgroup_usage}};
  if (v.kind == "crash") {
    char addr[32];
    std::snprintf(addr, sizeof addr, "0x%" PRIx64, v.fault_addr);
    verdict["fault_address"] = addr;
    verdict["crash_stack"] = frames_json(v.crash_stack);
  }
  return verdict;
}

json ooms_json(const ProcessReport& p) {
  json ooms = json::array();
  for (const OomEvent& o : p.ooms) {
    json holders = json::array();
    for (const Holder& h : o.holders) holders.push_back({{"name", h.name}, {"held", h.held}, {"unused", h.unused}});
    ooms.push_back({{"requested", o.requested},
                    {"error", o.error},
                    {"device", o.device},
                    {"kind", format::kind_name(static_cast<format::Kind>(o.kind))},
                    {"step", o.step},
                    {"phase", phase_of(o.step, o.ts_ns, p.steps)},
                    {"ts_ns", o.ts_ns},
                    {"device_live", o.device_live},
                    {"device_free", o.device_free},
                    {"device_total", o.device_total},
                    {"held_unused", o.held_unused},
                    {"holders", holders},
                    {"stack", frames_json(o.stack)},
                    {"live_by_site", site_totals_json(o.live_by_site)},
                    {"live_by_role", roles_object(o.live_by_role)}});
  }
  return ooms;
}

json process_json(const ProcessReport& p, size_t max_step_rows) {
  const std::vector<size_t> rows = step_rows(p.steps, max_step_rows);
  const bool thinned = rows.size() < p.steps.size();
  json steps = json::array();
  for (const size_t row : rows) {
    steps.push_back(step_json(p, p.steps[row]));
    if (!p.roles.per_step.empty()) steps.back()["roles"] = step_roles_json(p, row);
  }
  json suspects = json::array();
  for (const LeakSuspect& s : p.leak_suspects) {
    json row = suspect_json(s);
    if (thinned) thin_series(row, rows);
    suspects.push_back(std::move(row));
  }
  json notes = p.notes;
  if (thinned) notes.push_back(thinned_note(p.steps.size(), rows.size(), max_step_rows));
  const json verdict = verdict_json(p.verdict);
  const json ooms = ooms_json(p);
  return {
      {"ooms", ooms},
      {"caching_allocator_hidden", p.caching_allocator_hidden},
      {"pid", p.pid},
      {"ppid", p.ppid},
      {"rank", p.rank},
      {"command", p.command},
      {"trace", p.trace_path},
      {"host_mode", p.host_mode},
      {"sample_interval", p.sample_interval},
      {"allocator",
       {{"name", p.allocator.name.empty() ? json(nullptr) : json(p.allocator.name)},
        {"path", p.allocator.path},
        {"reached", p.allocator.reached},
        {"held_source", p.allocator.held_known ? json(p.allocator.held_source) : json(nullptr)},
        {"traced", p.allocator.traced}}},
      {"step_source", p.step_source},
      {"step_inference", p.step_inference},
      {"window_seconds", p.window_seconds},
      {"python_role", p.python_role},
      {"start_method", p.start_method},
      {"kernel_id", p.kernel_id},
      {"warmup_steps", p.warmup_steps},
      {"duration_ns", p.duration_ns},
      {"steps", steps},
      {"step_rows", step_rows_json(p.steps.size(), rows, max_step_rows)},
      {"growth_view",
       {{"from_step", p.growth_view.from_step},
        {"to_step", p.growth_view.to_step},
        {"bytes", p.growth_view.bytes},
        {"estimated", p.growth_view.estimated},
        {"note", p.growth_view.note},
        {"sites", site_totals_json(p.growth_view.sites)}}},
      {"leak_suspects", suspects},
      {"roles", roles_json(p)},
      {"exit_leaks",
       {{"bytes", p.exit_leak_bytes},
        {"bytes_error", p.exit_leak_bytes_error},
        {"count", p.exit_leak_count},
        {"count_estimated", p.leak_counts_estimated},
        {"sites", site_totals_json(p.exit_leaks)}}},
      {"startup_allocations",
       {{"bytes", p.startup_bytes},
        {"bytes_error", p.startup_bytes_error},
        {"count", p.startup_count},
        {"count_estimated", p.leak_counts_estimated},
        {"sites", site_totals_json(p.startup)}}},
      {"growth_per_step",
       {{"judged", p.total_growth.judged},
        {"bytes_per_step", p.total_growth.per_step},
        {"r_squared", p.total_growth.r_squared},
        {"first_step", p.total_growth.first_step},
        {"last_step", p.total_growth.last_step},
        {"plateau", p.total_growth.plateau}}},
      {"peak",
       {{"bytes", p.peak.bytes},
        {"step", p.peak.step},
        {"phase", peak_phase(p.peak, p.steps)},
        {"ts_ns", p.peak.ts_ns},
        {"kind", format::kind_name(static_cast<format::Kind>(p.peak.kind))}}},
      {"verdict", verdict},
      {"stats",
       {{"events", p.events},
        {"dropped", p.dropped},
        {"unknown_frees", p.unknown_frees},
        {"inherited", p.inheritance.parent == 0 && p.inheritance.host_live_at_fork < 0
                          ? nlohmann::json(nullptr)
                          : nlohmann::json{{"parent", p.inheritance.parent},
                                           {"blocks", p.inheritance.blocks},
                                           {"bytes", p.inheritance.bytes},
                                           {"freed_blocks", p.inheritance.freed_blocks},
                                           {"freed_bytes", p.inheritance.freed_bytes},
                                           {"host_live_at_fork", p.inheritance.host_live_at_fork}}},
        {"copied_on_write", p.copied_on_write},
        {"retention", p.retention_when.empty() ? json(nullptr)
                                               : json{{"when", p.retention_when},
                                                      {"seconds", p.retention_seconds},
                                                      {"skipped", p.retention_skipped}}},
        {"double_allocations", p.double_allocations},
        {"failed_allocations", p.failed_allocations},
        {"frames_read", p.frames_read},
        {"frames_damaged", p.frames_damaged},
        {"truncated", p.truncated}}},
      {"notes", notes},
      {"cupti", cupti_json(p.cupti)},
      {"environment", environment_json(p.environment)},
      {"host_memory", host_memory_json(p.host_pressure)},
  };
}

}  // namespace

RunReport load_run(const std::string& path, const AnalysisOptions& options, const RunOutcome* outcome) {
  RunReport run;
  fs::path p(path);
  std::error_code ec;
  std::vector<fs::path> files;
  RunFile rf;
  if (fs::is_directory(p, ec)) {
    run.run_dir = p.string();
    for (const auto& entry : fs::directory_iterator(p, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("trace.", 0) == 0 && entry.path().extension() == ".mlt") files.push_back(entry.path());
    }
    if (ec) throw TraceError(path + ": " + ec.message());
    rf = read_run_file(p, run.problems);
    if (files.empty()) {
      throw TraceError(path + ": no memledger traces (trace.*.mlt) in this folder" +
                       (rf.untraced.empty() ? std::string() : ": " + rf.untraced));
    }
    run.command = rf.command;
  } else if (fs::exists(p, ec)) {
    files.push_back(p);
  } else {
    throw TraceError(path + ": no such file or folder");
  }
  if (outcome != nullptr) {
    rf.root_pid = outcome->root_pid;
    rf.exit = outcome->exit;
    if (outcome->kernel.checked) rf.kernel = outcome->kernel;
  }
  std::sort(files.begin(), files.end());

  std::vector<Trace> traces;
  std::vector<std::string> first_error;
  for (const fs::path& f : files) {
    try {
      traces.push_back(read_trace(f.string(), false));  // events are streamed by analyze_stream
    } catch (const TraceError& e) {
      run.problems.push_back(e.what());
    }
  }
  if (traces.empty()) {
    throw TraceError(run.problems.empty() ? path + ": no readable trace" : run.problems.front());
  }
  // The root: the pid `memledger run` started (its latest image if it exec'ed),
  // else a process whose parent is not among the traced ones.
  std::sort(traces.begin(), traces.end(), [](const Trace& a, const Trace& b) {
    auto start = [](const Trace& t) { return std::strtoull(t.header_value("start_mono_ns", "0").c_str(), nullptr, 10); };
    return start(a) < start(b);
  });
  size_t root = 0;
  bool found = false;
  if (rf.root_pid != 0) {
    for (size_t i = 0; i < traces.size(); ++i) {
      if (traces[i].pid() == rf.root_pid) {
        root = i;  // keep the latest image of that pid
        found = true;
      }
    }
  }
  if (!found) {
    for (size_t i = 0; i < traces.size(); ++i) {
      const std::string ppid = traces[i].header_value("ppid");
      bool parent_traced = std::any_of(traces.begin(), traces.end(),
                                       [&](const Trace& t) { return std::to_string(t.pid()) == ppid; });
      if (!parent_traced) {
        root = i;
        break;
      }
    }
  }
  // A forked child starts from its parent's live set at the fork: the parent
  // (started earlier, so analysed first) keeps it for the child.
  std::vector<std::vector<InheritedBlock>> inherited(traces.size());
  std::vector<int> forked_from(traces.size(), -1);
  for (size_t i = 0; i < traces.size(); ++i) {
    const std::string parent = traces[i].header_value("parent_trace");
    if (parent.empty() || traces[i].header_value("fork_seq").empty()) continue;
    for (size_t p = 0; p < i; ++p) {
      if (std::to_string(traces[p].pid()) == parent) forked_from[i] = static_cast<int>(p);  // its latest image
    }
  }
  // How children ended, as their traced parents' own waits saw them (the
  // Python module notes "child.status" = "PID STATUS" for each child of
  // subprocess.Popen): a parent is analysed before its children, so its
  // notes are read by then. Keyed by (parent pid, child pid).
  std::map<std::pair<int, int>, int> child_status;
  for (size_t i = 0; i < traces.size(); ++i) {
    ExitInfo exit_info;
    if (i == root && rf.exit.known) exit_info = rf.exit;
    const int ppid = std::atoi(traces[i].header_value("ppid", "0").c_str());
    // The status is the last image's: an image that exec'ed is judged by
    // its exec.
    const bool later_image = std::any_of(traces.begin() + static_cast<std::ptrdiff_t>(i) + 1, traces.end(),
                                         [&](const Trace& t) { return t.pid() == traces[i].pid(); });
    if (auto seen = child_status.find({ppid, traces[i].pid()});
        !exit_info.known && !later_image && seen != child_status.end()) {
      exit_info.known = true;
      exit_info.signaled = WIFSIGNALED(seen->second);
      exit_info.signo = exit_info.signaled ? WTERMSIG(seen->second) : 0;
      exit_info.code = WIFEXITED(seen->second) ? WEXITSTATUS(seen->second) : 0;
    }
    exit_info.kernel = rf.kernel.checked ? &rf.kernel : nullptr;
    AnalysisOptions process_options = options;
    for (size_t c = i + 1; c < traces.size(); ++c) {
      if (forked_from[c] != static_cast<int>(i)) continue;
      const uint64_t seq = std::strtoull(traces[c].header_value("fork_seq").c_str(), nullptr, 10);
      process_options.keep_live_sets.push_back({seq, &inherited[c]});
    }
    if (forked_from[i] >= 0) {
      process_options.inherited = &inherited[i];
      process_options.inherited_from = traces[static_cast<size_t>(forked_from[i])].pid();
    }
    run.processes.push_back(analyze_stream(traces[i], exit_info, process_options));
    std::vector<InheritedBlock>().swap(inherited[i]);
    for (const auto& [key, value] : traces[i].info_strings()) {
      if (key != "child.status") continue;
      int pid = 0, status = 0;
      if (std::sscanf(std::string(value).c_str(), "%d %d", &pid, &status) == 2) {
        child_status[{traces[i].pid(), pid}] = status;
      }
    }
    // The process exited, but its trace has neither the exit nor the end:
    // tracing was lost before the end (the trace file became unwritable).
    const Trace& t = traces[i];
    if (exit_info.known && !exit_info.signaled && !t.has_exit && !t.has_end && t.execs.empty()) {
      char at[32];
      std::snprintf(at, sizeof at, "%.2f s", static_cast<double>(t.last_ts) / 1e9);
      run.processes.back().notes.push_back(std::string("the trace ends at ") + at +
                                           ", before the process did: tracing was lost from then on, and what "
                                           "the process did later is missing from this report");
    }
  }
  run.root = root;
  return run;
}

std::string escape_terminal(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto escaped = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      escaped(c);
    } else if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      escaped(c);
      escaped(static_cast<unsigned char>(text[++i]));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string suspect_rate_text(const LeakSuspect& s) {
  if (s.window_seconds > 0) {
    const double per_second = s.bytes_per_step / s.window_seconds;
    if (!s.estimated) return human_bytes(per_second) + "/s";
    return bytes_with_error(per_second, s.bytes_per_step_error / s.window_seconds) + "/s estimated";
  }
  if (!s.estimated) return human_bytes(s.bytes_per_step) + "/step";
  return bytes_with_error(s.bytes_per_step, s.bytes_per_step_error) + "/step estimated";
}

std::string suspect_count_text(const LeakSuspect& s) {
  if (s.window_seconds > 0) {
    const double per_second = s.allocations_per_step / s.window_seconds;
    if (!s.estimated) return fixed(per_second, 1) + " allocations/s";
    return number_with_error(per_second, s.allocations_per_step_error / s.window_seconds) + " allocations/s estimated";
  }
  if (!s.estimated) return fixed(s.allocations_per_step, 1) + " allocations/step";
  return number_with_error(s.allocations_per_step, s.allocations_per_step_error) + " allocations/step estimated";
}

std::string leak_bytes_text(double bytes, bool estimated, double error) {
  if (!estimated) return human_bytes(bytes);
  return bytes_with_error(bytes, error) + " estimated";
}

std::string total_growth_text(const ProcessReport& p) {
  const TotalGrowth& g = p.total_growth;
  char fit[96];
  std::snprintf(fit, sizeof fit, " (all live bytes, fit over steps %llu-%llu%s, R\u00b2 %.2f)",
                static_cast<unsigned long long>(g.first_step), static_cast<unsigned long long>(g.last_step),
                g.plateau ? ", last half" : "", g.r_squared);
  std::string out = human_bytes(g.per_step) + "/step" + fit;
  if (!p.leak_suspects.empty()) {
    const LeakSuspect& s = p.leak_suspects.front();
    out += "; top suspect " + suspect_rate_text(s) + " at " + site_name(s.site);
  }
  return out;
}

std::string render_summary_line(const RunReport& run) {
  const ProcessReport& p = run.processes[run.root];
  std::ostringstream out;
  out << p.verdict.summary << "; " << p.steps.size() << " steps (" << p.step_source << ")";
  if (!p.allocator.traced) {
    out << "; the host heap was not traced (" << p.allocator.name << " comes before memledger in the lookup order)";
  }
  if (run.processes.size() > 1) {
    // The root of a job (a launcher, a shell, a main process with workers)
    // is seldom the process that grows: the line gives the whole job's verdict.
    out << "; whole job: " << summarize_job(run).conclusion;
  } else if (!p.leak_suspects.empty()) {
    const LeakSuspect& s = p.leak_suspects.front();
    out << "; top growth: " << suspect_rate_text(s) << " at " << site_name(s.site);
  } else if (!p.steps.empty()) {
    out << "; no growth suspects";
  }
  // One line: a newline from the traced process must not start another.
  std::string line = escape_terminal(out.str());
  for (char& c : line) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  return line;
}

namespace {

// A process's heading: who it is, why it stopped, its mode, steps and peak.
// Which host allocator served the program, and what that means for the
// host figures (not traced at all, or held bytes unknown).
void text_allocator(const HostAllocator& a, std::ostringstream& out) {
  if (a.name.empty()) return;
  out << "host allocator: " << a.name;
  if (!a.reached.empty()) out << ", " << a.reached;
  if (!a.traced) {
    out << ": the host heap is not traced\n";
  } else {
    out << "; held bytes " << (a.held_known ? "from " + a.held_source : std::string("unknown")) << "\n";
  }
}

void text_heading(const ProcessReport& p, bool root, std::ostringstream& out) {
  out << "\n== process " << p.pid;
  if (!p.rank.empty()) out << " (rank " << p.rank << ")";
  if (!p.python_role.empty()) {
    out << " (" << p.python_role << (p.kernel_id.empty() ? "" : " " + p.kernel_id)
        << (p.start_method.empty() ? "" : ", " + p.start_method) << ")";
  }
  if (root) out << " (root)";
  out << ": " << p.command << "\n";
  out << "stop verdict: " << p.verdict.summary << "\n";
  if (!p.verdict.crash_stack.empty()) {
    out << "crash stack:\n";
    for (const Frame& f : p.verdict.crash_stack) out << "    " << frame_text(f) << "\n";
  }
  if (!p.environment.empty()) {
    out << "environment:\n";
    for (const std::string& line : environment_lines(p.environment)) out << "  " << line << "\n";
  }
  if (const std::string line = pressure_line(p.host_pressure); !line.empty()) out << line << "\n";
  out << "host mode: " << p.host_mode;
  if (p.host_mode == "sampled") out << " (mean interval " << human_bytes(double(p.sample_interval)) << ")";
  out << "; duration " << fixed(double(p.duration_ns) / 1e9, 2) << " s; " << p.events << " events\n";
  text_allocator(p.allocator, out);
  out << "steps: " << p.steps.size() << " (source: " << p.step_source;
  if (!p.step_inference.empty()) out << " (" << p.step_inference << ")";
  out << ")";
  if (!p.steps.empty()) out << ", warm-up " << p.warmup_steps;
  out << "\n";
  out << (p.allocator.traced ? "peak live: " : "peak live (host heap not traced): ") << human_bytes(double(p.peak.bytes));
  const std::string phase = peak_phase(p.peak, p.steps);
  if (!phase.empty()) out << " " << phase;
  out << "\n";
  if (p.total_growth.judged) {
    out << "growth per step: " << total_growth_text(p) << "\n";
  } else if (p.window_seconds > 0) {
    out << "growth: judged per site over time windows (no steps); the total, start-up included, is not\n";
  }
}

// Each out-of-memory failure, with the device's live set at that moment.
void text_ooms(const ProcessReport& p, std::ostringstream& out) {
  for (const OomEvent& o : p.ooms) {
    out << "\nCUDA out of memory " << phase_of(o.step, o.ts_ns, p.steps) << ": " << human_bytes(double(o.requested)) << " requested on device "
        << o.device << " (error " << o.error << "); live on the device: " << human_bytes(double(o.device_live));
    if (o.device_total) out << "; free " << human_bytes(double(o.device_free)) << " of " << human_bytes(double(o.device_total)) << " at the last step end";
    out << "; held by pools but unused: " << human_bytes(double(o.held_unused)) << "\n";
    if (!o.stack.empty()) {
      out << "  failed at " << site_name(Site{0, o.kind, o.stack}) << "\n";
    }
    out << "  device live set at that moment, by site:\n";
    for (const SiteTotal& t : o.live_by_site) {
      out << "    " << human_bytes(double(t.bytes)) << " in " << t.count << " at " << site_name(t.site) << "\n";
    }
    if (const std::string roles = roles_in_words(o.live_by_role); !roles.empty()) {
      out << "  by role: " << roles << "\n";
    }
    for (const Holder& h : o.holders) {
      out << "    " << h.name << ": holds " << human_bytes(double(h.held)) << ", unused " << human_bytes(double(h.unused)) << "\n";
    }
  }
}

// A table of more than 24 steps shows the first and last 10: true for a
// row in between (the first of them prints "...").
bool elided_row(size_t k, size_t n, std::ostringstream& out) {
  if (n <= 24 || k < 10 || k + 10 >= n) return false;
  if (k == 10) out << "  ...\n";
  return true;
}

// Device memory per step, when the process used any.
void text_device_steps(const ProcessReport& p, std::ostringstream& out) {
  bool device = false;
  for (const StepStats& st : p.steps) device = device || st.live[1] != 0 || st.live[2] != 0 || st.held_device != 0;
  if (!p.steps.empty() && device) {
    out << "\n  step   device live  device held  fragmented   device free   pinned host  reserved VA\n";
    const size_t n = p.steps.size();
    for (size_t k = 0; k < n; ++k) {
      if (elided_row(k, n, out)) continue;
      const StepStats& s = p.steps[k];
      const int64_t live = s.live[1] + s.live[2];
      char line[200];
      std::snprintf(line, sizeof line, "  %4" PRIu64 "  %12s  %11s  %10s  %12s  %12s  %11s\n", s.index,
                    human_bytes(double(live)).c_str(), human_bytes(double(s.held_device)).c_str(),
                    human_bytes(double(std::max<int64_t>(0, s.held_device - live))).c_str(),
                    s.device_total ? human_bytes(double(s.device_free)).c_str() : "-",
                    human_bytes(double(s.live[3])).c_str(), human_bytes(double(s.reserved_address_space)).c_str());
      out << line;
    }
  }
}

// Host memory per step; memory mapped outside the heap in a column of its
// own when the process mapped any.
void text_host_steps(const ProcessReport& p, std::ostringstream& out) {
  if (!p.steps.empty()) {
    constexpr int kMapped = static_cast<int>(format::Kind::kMapped);
    const bool mapped =
        std::any_of(p.steps.begin(), p.steps.end(), [](const StepStats& s) { return s.live[kMapped] != 0; });
    out << "\n  step   host live   host held" << (mapped ? "      mapped" : "") << "         RSS    allocs     frees\n";
    const size_t n = p.steps.size();
    for (size_t k = 0; k < n; ++k) {
      if (elided_row(k, n, out)) continue;
      const StepStats& s = p.steps[k];
      // Figures memledger could not measure are not shown as if it had.
      const std::string live = p.allocator.traced ? human_bytes(double(s.live[0])) : "untraced";
      const std::string held = p.allocator.held_known ? human_bytes(double(s.held_host)) : "unknown";
      char column[32] = "";
      if (mapped) std::snprintf(column, sizeof column, "  %10s", human_bytes(double(s.live[kMapped])).c_str());
      char line[200];
      std::snprintf(line, sizeof line, "  %4" PRIu64 "  %10s  %10s%s  %10s  %8" PRIu64 "  %8" PRIu64 "\n", s.index,
                    live.c_str(), held.c_str(), column, human_bytes(double(s.rss)).c_str(), s.allocations, s.frees);
      out << line;
    }
  }
}

// A row made of several stacks below one user line says so.
std::string merged_text(size_t stacks, bool largest_below) {
  if (stacks <= 1) return {};
  return "  (" + std::to_string(stacks) + " stacks merged" + (largest_below ? "; the largest below" : "") + ")";
}

void text_suspects(const ProcessReport& p, bool full_stacks, std::ostringstream& out) {
  out << "\ngrowth leak suspects: " << p.leak_suspects.size() << "\n";
  for (size_t k = 0; k < p.leak_suspects.size(); ++k) {
    const LeakSuspect& s = p.leak_suspects[k];
    out << "  #" << k + 1 << " " << suspect_rate_text(s);
    if (!s.estimated && s.window_seconds > 0) {
      out << " (" << std::llround(s.bytes_per_step) << " B per " << fixed(s.window_seconds, 3) << " s window)";
    } else if (!s.estimated) {
      out << " (" << std::llround(s.bytes_per_step) << " B/step)";
    }
    out << ", " << suspect_count_text(s) << (s.window_seconds > 0 ? ", from time window " : ", from step ") << s.first_step
        << ", monotone " << fixed(s.monotonicity * 100, 0) << "%, " << format::kind_name(format::Kind(s.site.kind))
        << (s.site.graph ? ", CUDA graph-owned (allocated by each graph launch; the stack is the capture site)" : "")
        << "\n     " << site_name(s.site) << merged_text(s.stacks_merged, true) << "\n";
    text_suspect_role(s, out);
    if (full_stacks) {
      for (const Frame& f : s.site.frames) out << "       " << frame_text(f) << "\n";
    } else {
      for (const std::string& line : folded_stack(s.site.frames)) out << "       " << line << "\n";
    }
    for (const KeptBy& k : s.kept_by) {
      for (size_t h = 0; h < k.hops.size(); ++h) {
        out << (h == 0 ? "     kept by: " : "         ← ") << k.hops[h];
        if (h + 1 == k.hops.size()) {
          out << "  (" << k.objects << (k.objects == 1 ? " object, " : " objects, ") << human_bytes(double(k.bytes))
              << ")";
        }
        out << "\n";
      }
    }
  }
}

// What grew between two step ends: the total and the three largest rows.
void text_growth_view(const ProcessReport& p, std::ostringstream& out) {
  const GrowthView& g = p.growth_view;
  if (p.steps.empty() || !g.note.empty() || g.sites.empty()) return;
  out << "\nwhat grew from the end of step " << g.from_step << " to the end of step " << g.to_step << ": "
      << human_bytes(double(g.bytes)) << (g.estimated ? " estimated" : "") << " (flame graph in the HTML report)\n";
  for (size_t k = 0; k < g.sites.size() && k < 3; ++k) {
    const SiteTotal& t = g.sites[k];
    out << "  " << human_bytes(double(t.bytes)) << (g.estimated ? " estimated" : "") << " at " << site_name(t.site)
        << merged_text(t.stacks_merged, false) << "\n";
  }
}

// Exit leaks, and the start-up allocations kept apart from them.
void text_exit_leaks(const ProcessReport& p, std::ostringstream& out) {
  // Sampled mode: bytes and counts are estimates (a count of allocations, not of samples).
  const bool estimated = p.leak_counts_estimated;
  const char* about = estimated ? "about " : "";
  // Mapped memory at the same line as heap blocks is a row of its own, named
  // so (pymalloc's arenas below a Python line, say); it is never sampled.
  auto row = [&](const SiteTotal& t) {
    const bool mapped = t.site.kind == static_cast<uint8_t>(format::Kind::kMapped);
    out << "  " << leak_bytes_text(double(t.bytes), t.estimated, t.bytes_error) << " in " << (mapped ? "" : about)
        << t.count << (mapped ? " mappings" : "") << " at " << site_name(t.site) << merged_text(t.stacks_merged, false)
        << (t.site.graph ? " (CUDA graph-owned, allocated by a graph launch)" : "") << "\n";
  };
  const bool first_step_is_startup = !p.steps.empty() && p.window_seconds == 0;
  out << "\nexit leaks (live at exit, "
      << (first_step_is_startup ? "allocated after the first step" : "no steps: all but what imports made") << "): "
      << leak_bytes_text(double(p.exit_leak_bytes), estimated, p.exit_leak_bytes_error) << " in " << about
      << p.exit_leak_count << " allocations" << (estimated ? " (estimated from the sampled ones)" : "") << "\n";
  for (const SiteTotal& t : p.exit_leaks) row(t);
  if (!first_step_is_startup && p.startup_count > 0) {
    out << "made by imports, still live: " << leak_bytes_text(double(p.startup_bytes), estimated, p.startup_bytes_error)
        << " in " << about << p.startup_count << " allocations\n";
    for (size_t k = 0; k < p.startup.size() && k < 5; ++k) row(p.startup[k]);
  } else if (first_step_is_startup) {
    out << "one-off start-up allocations (before the first step, still live): "
        << leak_bytes_text(double(p.startup_bytes), estimated, p.startup_bytes_error) << " in " << about
        << p.startup_count << " allocations\n";
    for (size_t k = 0; k < p.startup.size() && k < 5; ++k) row(p.startup[k]);
  }
}

// CUPTI's view beside the hooks', or its status.
void text_cupti(const ProcessReport& p, std::ostringstream& out) {
  if (p.cupti.compared) {
    const CuptiView& c = p.cupti;
    out << "\nCUPTI beside the CUDA hooks: " << c.matched << " allocations seen by both ("
        << human_bytes(double(c.matched_bytes))
        << (c.matched_mappings ? "; " + std::to_string(c.matched_mappings) + " of them VMM mappings" : "") << "), "
        << c.hooks_only << " only by the hooks, " << c.cupti_only << " only by CUPTI"
        << (c.cupti_dropped ? ", " + std::to_string(c.cupti_dropped) + " CUPTI records lost" : "")
        << "\n  " << c.message << "\n";
    for (const CuptiMismatch& m : c.hooks_only_list) {
      out << "  only hooks: " << human_bytes(double(m.bytes)) << " " << format::kind_name(format::Kind(m.kind))
          << " at " << hex(m.addr) << (m.mapping ? " (cuMemMap)" : "") << " from " << mismatch_site(m) << "\n";
    }
    if (c.size_differences != 0) {
      out << "  sizes differ: " << c.size_differences << " allocations seen by both with other byte counts\n";
      for (size_t k = 0; k < c.size_differences_list.size() && k < 5; ++k) {
        const CuptiMismatch& m = c.size_differences_list[k];
        out << "    hooks " << human_bytes(double(m.bytes)) << ", CUPTI " << human_bytes(double(m.cupti_bytes))
            << " at " << hex(m.addr) << (m.async ? " (stream-ordered)" : "") << " from " << mismatch_site(m) << "\n";
      }
    }
    for (const CuptiMismatch& m : c.cupti_only_list) {
      out << "  only CUPTI: " << human_bytes(double(m.bytes)) << " " << format::kind_name(format::Kind(m.kind))
          << " on device " << m.device << " at " << hex(m.addr) << " (pc " << hex(m.pc)
          << (m.cupti_kind != 0 ? std::string(", CUPTI kind ") + format::cupti_kind_name(m.cupti_kind) : "")
          << (m.async ? ", stream-ordered" : "") << ")\n";
    }
    if (c.module_statics != 0) {
      out << "  module statics (not compared: the driver places a module's variables when it loads it, no call a "
             "hook sees): "
          << c.module_statics << " (" << human_bytes(double(c.module_statics_bytes)) << ")\n";
      for (size_t k = 0; k < c.module_statics_list.size() && k < 5; ++k) {
        const CuptiMismatch& m = c.module_statics_list[k];
        out << "    " << human_bytes(double(m.bytes)) << " " << format::cupti_kind_name(m.cupti_kind) << " "
            << (m.name.empty() ? "(unnamed)" : m.name) << " on device " << m.device << " at " << hex(m.addr) << "\n";
      }
    }
  } else if (p.cupti.status != "none") {
    out << "\nCUPTI: " << p.cupti.status << " (device memory as the CUDA hooks see it, without a cross-check)\n";
  }
}

}  // namespace

std::string render_text(const RunReport& run, bool full_stacks) {
  std::ostringstream out;
  const ProcessReport& root = run.processes[run.root];
  out << "memledger report";
  if (!run.run_dir.empty()) out << " for " << run.run_dir;
  out << "\n";
  std::string cmd = root.command;
  if (!run.command.empty()) {
    cmd.clear();
    for (const std::string& a : run.command) cmd += (cmd.empty() ? "" : " ") + a;
  }
  out << "command: " << cmd << "\n";
  if (run.processes.size() > 1) {
    out << "processes: " << run.processes.size() << " traced\n";
    out << render_job_text(summarize_job(run));
  }
  for (const std::string& p : run.problems) out << "warning: " << p << "\n";

  for (size_t i = 0; i < run.processes.size(); ++i) {
    const ProcessReport& p = run.processes[(i + run.root) % run.processes.size()];
    text_heading(p, &p == &root, out);
    text_ooms(p, out);
    text_device_steps(p, out);
    text_host_steps(p, out);
    text_roles(p, out);
    text_suspects(p, full_stacks, out);
    text_growth_view(p, out);
    text_exit_leaks(p, out);
    text_cupti(p, out);
    if (!p.notes.empty()) {
      out << "\nnotes:\n";
      for (const std::string& n : p.notes) out << "  - " << n << "\n";
    }
  }
  return escape_terminal(out.str());
}

nlohmann::json render_json(const RunReport& run, size_t max_step_rows) {
  json processes = json::array();
  for (const ProcessReport& p : run.processes) processes.push_back(process_json(p, max_step_rows));
  json top = {{"schema", "memledger-report"}, {"schema_version", kReportSchemaVersion}, {"run_dir", run.run_dir}};
  top["run_command"] = run.command;
  top["problems"] = run.problems;
  // The root's fields once more at the top: one copy (a run of a million
  // steps has a million step objects in each).
  const json& root = processes[run.root];
  for (auto it = root.begin(); it != root.end(); ++it) top[it.key()] = it.value();
  top["root_pid"] = run.processes[run.root].pid;
  top["job"] = job_json(summarize_job(run));
  top["processes"] = std::move(processes);
  return top;
}

}  // namespace memledger::report
