#include "check.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <tuple>

#include "analysis.h"
#include "file_io.h"
#include "run_report.h"
#include "trace_reader.h"

namespace memledger::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kKindNames[kKinds] = {"host", "device", "managed", "pinned_host", "mapped"};

// Each check or diff loads the run itself, so it can list more than the
// report's usual top 20: per-kind exit leaks are sums over every site.
constexpr size_t kLoadSuspects = 1000;
constexpr size_t kLoadExitSites = 100000;
// A report.json past this is refused before it is parsed: the parsed
// document takes several times the text's size. memledger's own reports stay
// far below it however long the run (per-step rows are thinned).
constexpr size_t kMaxReportJsonBytes = size_t{256} << 20;

int kind_index(const std::string& name) {
  for (int k = 0; k < kKinds; ++k) {
    if (name == kKindNames[k]) return k;
  }
  return -1;
}

int scope_kind(Scope scope) { return static_cast<int>(scope) - 1; }  // -1 for kTotal

double number(const json& j, const char* key, double fallback = 0) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return fallback;
  return it->get<double>();
}

std::string text(const json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

const json& member(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

const json& process_json(const RunData& run, size_t i) { return run.report.at("processes").at(i); }

// A site named as the report names it, from a stack in JSON (OOM stacks carry
// no site name).
std::string site_of_stack(const json& stack) {
  if (!stack.is_array() || stack.empty()) return {};
  std::vector<Frame> frames;
  for (const json& f : stack) {
    Frame frame;
    frame.function = text(f, "function");
    frame.file = text(f, "file");
    frame.line = static_cast<int>(number(f, "line"));
    frame.module = text(f, "module");
    frames.push_back(std::move(frame));
  }
  const Frame& f = frames[user_frame_index(frames)];
  std::string out = f.function.empty() ? "??" : f.function;
  if (!f.file.empty()) {
    out += " at " + fs::path(f.file).filename().string();
    if (f.line > 0) out += ":" + std::to_string(f.line);
  } else if (!f.module.empty()) {
    out += " in " + fs::path(f.module).filename().string();
  }
  return out;
}

std::vector<double> series_of(const ProcessData& p, Scope scope) {
  std::vector<double> out;
  out.reserve(p.live.size());
  if (is_role_scope(scope)) {
    for (const auto& roles : p.roles) out.push_back(roles[scope_role(scope)]);
    return out;
  }
  const int k = scope_kind(scope);
  for (const auto& live : p.live) out.push_back(k < 0 ? live[0] + live[1] + live[2] + live[3] + live[4] : live[k]);
  return out;
}

bool kind_ever_live(const ProcessData& p, int k) {
  return std::any_of(p.live.begin(), p.live.end(), [k](const auto& l) { return l[k] != 0; });
}

// The kinds with live bytes at some step end of some process.
std::vector<Scope> kinds_present(const RunData& run) {
  std::vector<Scope> out;
  for (int k = 0; k < 4; ++k) {
    bool any = false;
    for (const ProcessData& p : run.processes) any = any || kind_ever_live(p, k);
    if (any) out.push_back(static_cast<Scope>(k + 1));
  }
  return out;
}

// The roles with live bytes at some step end of some process.
std::vector<Scope> roles_present(const RunData& run) {
  std::vector<Scope> out;
  for (int r = 0; r < kRoleCount; ++r) {
    bool any = false;
    for (const ProcessData& p : run.processes) {
      any = any || std::any_of(p.roles.begin(), p.roles.end(), [r](const auto& roles) { return roles[r] != 0; });
    }
    if (any) out.push_back(static_cast<Scope>(kFirstRoleScope + r));
  }
  return out;
}

bool in_scope(const json& site, Scope scope) {
  if (is_role_scope(scope)) return text(site, "role") == scope_name(scope);
  return scope == Scope::kTotal || text(site, "kind") == scope_name(scope);
}

// The largest growth suspect of the scope (suspects are sorted by growth).
std::string top_suspect(const json& process, Scope scope) {
  for (const json& s : member(process, "leak_suspects")) {
    if (in_scope(s, scope)) return text(s, "site");
  }
  return {};
}

int process_warmup(const ProcessData& p, int warmup_steps) {
  return warmup_steps >= 0 ? warmup_steps : p.report_warmup;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The holder with the most bytes at a step ("memory pool 0x... on device 0").
std::string largest_holder(const json& step, bool by_unused) {
  const json& holders = member(member(member(step, "fragmentation"), "device"), "holders");
  std::string best;
  double most = 0;
  for (const json& h : holders) {
    const double v = number(h, by_unused ? "unused" : "held");
    if (v > most) {
      most = v;
      best = text(h, "name") + " (" + format_size(v) + (by_unused ? " unused)" : " held)");
    }
  }
  return best;
}

// What a metric's figure is computed from: one process of a run.
struct FigureInput {
  const ProcessData& p;
  const json& pj;     // its report
  const json& steps;  // pj's steps
  Scope scope;
  int k;  // scope_kind(scope)
  int warmup_steps;
};

// Growth per step: the fit after the warm-up, or why there is none.
void growth_figure(const FigureInput& in, Figure& f) {
  const ProcessData& p = in.p;
  const json& pj = in.pj;
  const Scope scope = in.scope;
  const int warmup = process_warmup(p, in.warmup_steps);
  if (pj.is_object() && pj.value("step_source", std::string()) == "time") {
    f.judged = false;
    f.why_not = "no steps: the report judged its sites over time windows, which hold start-up too "
                "(gate on suspects, or mark steps)";
    return;
  }
  const GrowthFit fit = fit_growth(series_of(p, scope), warmup);
  if (!fit.judged) {
    f.judged = false;
    const size_t n = p.live.size();
    f.why_not = n == 0 ? "no steps were recorded (mark steps with memledger_step(), or run with --step-interval)"
                       : "only " + std::to_string(n) + " step" + (n == 1 ? "" : "s") + " with " +
                             std::to_string(warmup) + " warm-up step" + (warmup == 1 ? "" : "s") +
                             " (at least 3 steps after the warm-up are needed)";
    return;
  }
  f.value = fit.slope;
  // In sampled host mode a role's live bytes are the exact host total split
  // by sampled shares; the report lists a role as growing only where a
  // growth suspect of that role, or its exact bytes, back the slope. The
  // gate judges as the report does.
  const json& roles = member(pj, "roles");
  const json& growing = member(roles, "growing");
  if (is_role_scope(scope) && std::round(fit.slope) > 0 && member(roles, "estimated") == true && growing.is_array()) {
    const bool listed = std::any_of(growing.begin(), growing.end(),
                                    [&](const json& g) { return text(g, "role") == scope_name(scope); });
    if (!listed) {
      f.sampling_noise = true;
      f.estimate = fit.slope;
      f.value = 0;
    }
  }
  f.r_squared = fit.r_squared;
  f.flat = fit.flat;
  f.first_step = fit.first_step;
  f.last_step = fit.last_step;
  f.plateau = fit.plateau;
  f.site = top_suspect(pj, scope);
  f.site_role = "top suspect";
}

// The highest live total at a step end (or between them, for the report's peak).
void peak_figure(const FigureInput& in, Figure& f) {
  const ProcessData& p = in.p;
  const json& pj = in.pj;
  const Scope scope = in.scope;
  const int k = in.k;
  const std::vector<double> series = series_of(p, scope);
  f.value = series.empty() ? 0 : *std::max_element(series.begin(), series.end());
  // The report's peak is the highest live total between step ends; it
  // counts for one kind too when that kind is the only one in use.
  bool only_kind = k < 0;
  if (is_role_scope(scope)) {
    only_kind = false;
  } else if (k >= 0) {
    only_kind = true;
    for (int other = 0; other < 4; ++other) only_kind = only_kind && (other == k || !kind_ever_live(p, other));
  }
  if (only_kind) f.value = std::max(f.value, p.peak);
  f.site = top_suspect(pj, scope);
  f.site_role = "top suspect";
}

// The most bytes held from the system at a step end, and the largest holder then.
void held_figure(const FigureInput& in, Figure& f) {
  const ProcessData& p = in.p;
  const json& steps = in.steps;
  const int k = in.k;
  size_t at = 0;
  for (size_t i = 0; i < p.live.size(); ++i) {
    const double v = k < 0 ? p.held_host[i] + p.held_device[i] : k == 0 ? p.held_host[i] : p.held_device[i];
    if (v > f.value) {
      f.value = v;
      at = i;
    }
  }
  const size_t row = p.rows.empty() ? at : std::lower_bound(p.rows.begin(), p.rows.end(), at) - p.rows.begin();
  if (!p.rows.empty() && (row >= p.rows.size() || p.rows[row] != at)) return;  // a step without a row
  if (k != 0 && f.value > 0 && steps.is_array() && row < steps.size()) {
    f.site = largest_holder(steps[row], false);
    f.site_role = "largest holder";
  }
}

// The median share of held bytes not in use after the warm-up.
void fragmentation_figure(const FigureInput& in, Figure& f) {
  const ProcessData& p = in.p;
  const json& steps = in.steps;
  const int k = in.k;
  const int warmup = process_warmup(p, in.warmup_steps);
  std::vector<double> all, after;
  for (size_t i = 0; i < p.live.size(); ++i) {
    const auto& live = p.live[i];
    double held = 0, used = 0, share = -1;
    if (k <= 0) {
      held += p.held_host[i];
      used += live[0];
    }
    if (k == 1 || k < 0) {
      held += p.held_device[i];
      used += live[1] + live[2];
    }
    if (k == 1 && p.device_share[i] >= 0) {
      share = p.device_share[i];
    } else if (held > 0) {
      share = std::max(0.0, held - used) / held;
    }
    if (share < 0) continue;
    all.push_back(share);
    if (static_cast<int>(i) >= warmup) after.push_back(share);
  }
  if (all.empty()) {
    f.judged = false;
    f.why_not = std::string("no held bytes were recorded") + (k >= 0 ? std::string(" for ") + kKindNames[k] : "");
    return;
  }
  f.value = median(after.empty() ? all : after);
  if (k != 0 && steps.is_array() && !steps.empty()) {
    f.site = largest_holder(steps.back(), true);
    f.site_role = "largest holder";
  }
}

// Bytes live at exit (start-up allocations apart), and the largest site.
void exit_leak_figure(const FigureInput& in, Figure& f) {
  const json& pj = in.pj;
  const Scope scope = in.scope;
  const int k = in.k;
  const json& leaks = member(pj, "exit_leaks");
  double largest = 0;
  double sum = 0;
  for (const json& s : member(leaks, "sites")) {
    if (!in_scope(s, scope)) continue;
    const double b = number(s, "bytes");
    sum += b;
    if (b > largest) {
      largest = b;
      f.site = text(s, "site") + " (" + format_size(b) + ")";
    }
  }
  f.value = k < 0 ? number(leaks, "bytes") : sum;
  f.site_role = "largest exit leak";
}

// The number of growth suspects, and the top one.
void suspects_figure(const FigureInput& in, Figure& f) {
  const json& pj = in.pj;
  const Scope scope = in.scope;
  for (const json& s : member(pj, "leak_suspects")) f.value += in_scope(s, scope) ? 1 : 0;
  f.site = top_suspect(pj, scope);
  f.site_role = "top suspect";
}

// Out-of-memory failures (and a host OOM kill), and the first one.
void oom_figure(const FigureInput& in, Figure& f) {
  const json& pj = in.pj;
  const json& ooms = member(pj, "ooms");
  f.value = ooms.is_array() ? static_cast<double>(ooms.size()) : 0;
  if (f.value > 0) {
    const json& first = ooms[0];
    f.site = format_size(number(first, "requested")) + " requested on device " +
             std::to_string(static_cast<int>(number(first, "device")));
    const std::string where = site_of_stack(member(first, "stack"));
    if (!where.empty()) f.site += " by " + where;
    f.site_role = "first OOM";
  }
  if (text(member(pj, "verdict"), "kind") == "host_oom_kill") {
    f.value += 1;
    if (f.site.empty()) {
      f.site = text(member(pj, "verdict"), "summary");
      f.site_role = "verdict";
    }
  }
}

// Why a host figure was not measured, or empty: a gate must not pass on
// host bytes memledger never saw (an allocator ahead of it in the lookup
// order) or held bytes it could not read (shown as 0 in the JSON of no run).
std::string unmeasured_host(const ProcessData& p, Metric metric, int k) {
  if (k > 0 || metric == Metric::kOoms || metric == Metric::kMinSteps) return {};
  if (!p.host_traced) {
    return "the host heap was not traced (" + p.allocator + " comes before memledger in the lookup order)";
  }
  if (!p.host_held_known && (metric == Metric::kHeld || metric == Metric::kFragmentationShare)) {
    return "held host bytes are unknown (" + p.allocator + " offers no statistics memledger reads)";
  }
  return {};
}

// One process's value of a metric; judged=false when it has none.
Figure process_figure(const RunData& run, size_t index, Metric metric, Scope scope, int warmup_steps) {
  const ProcessData& p = run.processes[index];
  const json& pj = process_json(run, index);
  Figure f;
  f.pid = p.pid;
  f.rank = p.rank;
  f.why_not = unmeasured_host(p, metric, scope_kind(scope));
  if (!f.why_not.empty()) {
    f.judged = false;
    return f;
  }
  if (is_role_scope(scope) && p.roles.empty() && !p.live.empty() &&
      (metric == Metric::kGrowthPerStep || metric == Metric::kPeak)) {
    f.judged = false;
    f.why_not = "the report holds no live bytes by role (made by a memledger from before roles)";
    return f;
  }
  const FigureInput in{p, pj, member(pj, "steps"), scope, scope_kind(scope), warmup_steps};
  switch (metric) {
    case Metric::kGrowthPerStep: growth_figure(in, f); return f;
    case Metric::kPeak: peak_figure(in, f); return f;
    case Metric::kHeld: held_figure(in, f); return f;
    case Metric::kFragmentationShare: fragmentation_figure(in, f); return f;
    case Metric::kExitLeak: exit_leak_figure(in, f); return f;
    case Metric::kSuspects: suspects_figure(in, f); return f;
    case Metric::kOoms: oom_figure(in, f); return f;
    case Metric::kMinSteps: f.value = static_cast<double>(p.live.size()); return f;
  }
  return f;
}

std::string plural(size_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

RunSummary summarize(const RunData& run, int warmup_steps) {
  RunSummary s;
  s.path = run.path;
  s.source = run.source;
  s.command = run.command;
  s.processes = run.processes.size();
  if (!run.processes.empty()) {
    const ProcessData& p = run.processes[run.main];
    s.steps = p.live.size();
    s.warmup_steps = process_warmup(p, warmup_steps);
    s.verdict = text(member(process_json(run, run.main), "verdict"), "summary");
    if (run.main != run.root) s.verdict = text(member(process_json(run, run.root), "verdict"), "summary");
  }
  return s;
}

json summary_json(const RunSummary& s) {
  return {{"path", s.path},       {"source", s.source},   {"command", s.command},        {"steps", s.steps},
          {"warmup_steps", s.warmup_steps}, {"processes", s.processes}, {"verdict", s.verdict}};
}

std::string summary_line(const RunSummary& s) {
  std::string out = s.path + ": " + plural(s.steps, "step") + " (warm-up " + std::to_string(s.warmup_steps) + ")";
  if (s.processes > 1) out += ", " + std::to_string(s.processes) + " processes";
  if (!s.command.empty()) out += "; " + command_text(s.command);
  return out;
}

const char* unit_name(Unit unit) {
  switch (unit) {
    case Unit::kBytesPerStep: return "bytes_per_step";
    case Unit::kBytes: return "bytes";
    case Unit::kShare: return "share";
    case Unit::kCount: return "count";
  }
  return "";
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", std::round(fraction * 1000) / 10);
  return buf;
}

std::string signed_change(double delta, Unit unit) {
  if (unit == Unit::kShare) {
    // A change of a share is in percentage points, not a share itself.
    char buf[32];
    std::snprintf(buf, sizeof buf, "%+.1f points", delta * 100);
    return buf;
  }
  return (delta > 0 ? "+" : "") + format_value(delta, unit);
}

std::string ratio_text(double a, double b) {
  if (a <= 0) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", (b - a) / a * 100);
  return buf;
}

}  // namespace

// --- Loading --------------------------------------------------------------------

std::string command_text(const std::vector<std::string>& command) {
  std::string out;
  for (const std::string& a : command) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out;
}

bool same_command(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (i == 0 ? fs::path(a[i]).filename() != fs::path(b[i]).filename() : a[i] != b[i]) return false;
  }
  return true;
}

std::string command_difference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  auto quoted = [](const std::string& s) { return "'" + s + "'"; };
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const bool same = i == 0 ? fs::path(a[i]).filename() == fs::path(b[i]).filename() : a[i] == b[i];
    if (same) continue;
    return (i == 0 ? std::string("the program") : "argument " + std::to_string(i)) + " is " + quoted(a[i]) +
           " here and " + quoted(b[i]) + " in the baseline";
  }
  if (a.size() > n) return "this run has an extra argument " + quoted(a[n]);
  if (b.size() > n) return "the baseline has an extra argument " + quoted(b[n]);
  return {};
}

namespace {

// A thinned report's step count is filled back in one value per step: a
// report that claims more steps than this is refused, not allocated for.
constexpr double kMaxFilledSteps = 10e6;

// A report that thinned its step rows (step_rows.positions) gets back a
// value per step: live and held bytes interpolated linearly between the
// rows around a step (a steady growth reads the same), a fragmentation
// share held from the row before. The peaks are rows of their own.
void fill_thinned_steps(const json& process, ProcessData& p, const std::string& damaged) {
  const json& info = member(process, "step_rows");
  const json& positions = member(info, "positions");
  if (!positions.is_array()) return;
  const double total = number(info, "steps");
  if (positions.size() != p.live.size() || positions.size() < 2 || !(total >= 1)) {
    throw InputError(damaged + " does not match its steps");
  }
  if (total > kMaxFilledSteps) {
    throw InputError(damaged + ": " + std::to_string(static_cast<uint64_t>(total)) +
                     " steps claimed; check and diff read at most 10000000");
  }
  for (const json& at : positions) {
    const double step = at.is_number() ? at.get<double>() : 0;
    if (step < 1 || step > total || (!p.rows.empty() && step - 1 <= static_cast<double>(p.rows.back()))) {
      throw InputError(damaged + ".positions is not a rising list of steps");
    }
    p.rows.push_back(static_cast<size_t>(step) - 1);
  }
  const size_t n = static_cast<size_t>(total);
  ProcessData full;
  size_t r = 0;
  for (size_t k = 0; k < n; ++k) {
    while (r + 1 < p.rows.size() && p.rows[r + 1] <= k) ++r;
    const size_t next = std::min(r + 1, p.rows.size() - 1);
    const double span = static_cast<double>(p.rows[next]) - static_cast<double>(p.rows[r]);
    const double t = k <= p.rows[r] || span <= 0 ? 0 : (static_cast<double>(k) - static_cast<double>(p.rows[r])) / span;
    auto between = [&](const std::vector<double>& v) { return v[r] + (v[next] - v[r]) * t; };
    std::array<double, kKinds> live{};
    for (size_t kind = 0; kind < live.size(); ++kind) live[kind] = p.live[r][kind] + (p.live[next][kind] - p.live[r][kind]) * t;
    full.live.push_back(live);
    full.held_host.push_back(between(p.held_host));
    full.held_device.push_back(between(p.held_device));
    full.device_share.push_back(p.device_share[r]);
    if (!p.roles.empty()) {
      std::array<double, kRoleCount> roles{};
      for (int role = 0; role < kRoleCount; ++role) roles[role] = p.roles[r][role] + (p.roles[next][role] - p.roles[r][role]) * t;
      full.roles.push_back(roles);
    }
  }
  p.roles = std::move(full.roles);
  p.live = std::move(full.live);
  p.held_host = std::move(full.held_host);
  p.held_device = std::move(full.held_device);
  p.device_share = std::move(full.device_share);
}

}  // namespace

RunData run_data_from_json(json report, const std::string& path, const std::string& source) {
  if (!report.is_object()) throw InputError(path + ": not a memledger report (not a JSON object)");
  const std::string schema = text(report, "schema");
  if (schema != "memledger-report") {
    throw InputError(path + ": not a memledger report (schema " +
                     (schema.empty() ? std::string("missing") : "'" + schema + "'") +
                     ", expected 'memledger-report' from memledger report --format json)");
  }
  const double version = number(report, "schema_version", -1);
  if (version < 1) throw InputError(path + ": report without a schema_version");
  if (version > kReportSchemaVersion) {
    throw InputError(path + ": report schema_version " + std::to_string(static_cast<int>(version)) +
                     " is newer than this memledger reads (" + std::to_string(kReportSchemaVersion) + ")");
  }
  RunData run;
  run.path = path;
  run.source = source;
  try {
    if (!report.contains("processes") || !report["processes"].is_array() || report["processes"].empty()) {
      json self = report;
      self.erase("processes");
      report["processes"] = json::array({self});
    }
    const int root_pid = static_cast<int>(number(report, "root_pid", number(report, "pid")));
    size_t i = 0;
    for (const json& pj : report["processes"]) {
      const std::string where = "processes[" + std::to_string(i) + "]";
      if (!pj.is_object()) throw InputError(path + ": damaged report: " + where + " is not an object");
      const json& step_list = member(pj, "steps");
      if (!step_list.is_null() && !step_list.is_array()) {
        throw InputError(path + ": damaged report: " + where + ".steps is not a list");
      }
      for (const json& s : step_list) {
        if (!s.is_object()) throw InputError(path + ": damaged report: " + where + ".steps has a non-object entry");
      }
      ProcessData p;
      p.pid = static_cast<int>(number(pj, "pid"));
      p.rank = text(pj, "rank");
      p.command = text(pj, "command");
      p.report_warmup = static_cast<int>(number(pj, "warmup_steps"));
      for (const json& s : member(pj, "steps")) {
        std::array<double, kKinds> live{};
        const json& kinds = member(s, "live");
        if (kinds.is_object()) {
          for (auto it = kinds.begin(); it != kinds.end(); ++it) {
            const int k = kind_index(it.key());
            if (k >= 0 && it->is_number()) live[k] = it->get<double>();
          }
        }
        p.live.push_back(live);
        const json& roles = member(s, "roles");
        if (roles.is_object()) {
          std::array<double, kRoleCount> by_role{};
          for (int r = 0; r < kRoleCount; ++r) by_role[r] = number(roles, role_name(static_cast<Role>(r)));
          p.roles.push_back(by_role);
        }
        p.held_host.push_back(number(member(s, "held"), "host"));
        p.held_device.push_back(number(member(s, "held"), "device"));
        const json& frag = member(member(s, "fragmentation"), "device");
        p.device_share.push_back(frag.is_object() ? number(frag, "share", -1) : -1);
      }
      const json& allocator = member(pj, "allocator");
      p.allocator = text(allocator, "name");
      const json& traced = member(allocator, "traced");
      p.host_traced = !(traced.is_boolean() && !traced.get<bool>());
      // Reports from before the allocator was named took held bytes from mallinfo2.
      p.host_held_known = p.allocator.empty() || !text(allocator, "held_source").empty();
      if (p.roles.size() != p.live.size()) p.roles.clear();  // some rows without roles: none judged
      fill_thinned_steps(pj, p, path + ": damaged report: " + where + ".step_rows");
      p.peak = number(member(pj, "peak"), "bytes");
      p.peak_kind = text(member(pj, "peak"), "kind");
      if (p.pid == root_pid) run.root = i;
      run.processes.push_back(std::move(p));
      ++i;
    }
    run.main = run.root;
    if (run.processes[run.root].live.empty()) {
      for (size_t j = 0; j < run.processes.size(); ++j) {
        if (run.processes[j].live.size() > run.processes[run.main].live.size()) run.main = j;
      }
    }
    if (report.contains("run_command") && report["run_command"].is_array()) {
      for (const json& a : report["run_command"]) {
        if (a.is_string()) run.command.push_back(a.get<std::string>());
      }
    }
    if (run.command.empty()) {
      std::istringstream words(run.processes[run.root].command);
      for (std::string w; words >> w;) run.command.push_back(w);
    }
  } catch (const json::exception& e) {
    throw InputError(path + ": damaged report: " + e.what());
  }
  run.report = std::move(report);
  return run;
}

RunData load_run_data(const std::string& path, const LoadOptions& options) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) throw InputError(path + ": no such file or folder");
  auto from_json_file = [&](const fs::path& file) {
    std::string text, error;
    if (!read_regular_file(file.string(), text, error, kMaxReportJsonBytes)) throw InputError(error);
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw InputError(file.string() + ": not valid JSON (" + e.what() + ")");
    }
    text = std::string();
    return run_data_from_json(std::move(j), path, "report JSON");
  };
  auto from_traces = [&]() {
    AnalysisOptions analysis;
    analysis.warmup_steps = options.warmup_steps;
    analysis.max_suspects = kLoadSuspects;
    analysis.max_exit_sites = kLoadExitSites;
    analysis.symbolizer = options.symbolizer;
    analysis.role_rules = options.role_rules;
    try {
      return run_data_from_json(render_json(load_run(path, analysis), 0), path, "traces");
    } catch (const TraceError& e) {
      throw InputError(e.what());
    }
  };
  if (fs::is_directory(p, ec)) {
    bool traces = false;
    for (const auto& entry : fs::directory_iterator(p, ec)) {
      const std::string name = entry.path().filename().string();
      traces = traces || (name.rfind("trace.", 0) == 0 && entry.path().extension() == ".mlt");
    }
    if (traces) return from_traces();
    if (fs::exists(fs::symlink_status(p / "report.json", ec))) return from_json_file(p / "report.json");
    throw InputError(path + ": no traces (trace.*.mlt) and no report.json in this folder");
  }
  // Traces begin with their magic; a report is a JSON object (a file named
  // .json that is not one gets the JSON parser's message). Only the start of
  // a regular file is read to tell which: a FIFO or a device is refused here.
  std::string start, error;
  if (!read_regular_file_start(path, start, error, 4096)) throw InputError(error);
  const size_t first = start.find_first_not_of(" \t\r\n");
  const bool json_text = first != std::string::npos && (start[first] == '{' || start[first] == '[');
  if (json_text || p.extension() == ".json") return from_json_file(p);
  return from_traces();
}

// --- Figures --------------------------------------------------------------------

GrowthFit fit_growth(const std::vector<double>& series, int warmup_steps) {
  GrowthFit fit;
  const size_t warmup = static_cast<size_t>(std::max(0, warmup_steps));
  if (series.size() < warmup + 3) return fit;
  const std::vector<double> window(series.begin() + static_cast<long>(warmup), series.end());
  fit.judged = true;
  fit.slope = theil_sen_slope(window);
  fit.r_squared = fit_line(window).r_squared;
  fit.flat = std::all_of(window.begin(), window.end(), [&](double v) { return v == window.front(); });
  fit.first_step = warmup + 1;
  fit.last_step = series.size();
  // A warm-up that outlasts the warm-up steps shows as a rise that levels
  // off: the last half of the window then grows less than the whole, and its
  // slope is the one that says whether memory still grows.
  if (window.size() >= 6) {
    const size_t half = window.size() / 2;
    const std::vector<double> tail(window.end() - static_cast<long>(half), window.end());
    const double tail_slope = theil_sen_slope(tail);
    if (tail_slope < fit.slope) {
      fit.slope = tail_slope;
      fit.r_squared = fit_line(tail).r_squared;
      fit.flat = std::all_of(tail.begin(), tail.end(), [&](double v) { return v == tail.front(); });
      fit.first_step = series.size() - half + 1;
      fit.plateau = true;
    }
  }
  return fit;
}

Figure compute_figure(const RunData& run, Metric metric, Scope scope, int warmup_steps) {
  Figure worst;
  bool any = false;
  size_t judged = 0;
  Figure first_unjudged;
  for (size_t i = 0; i < run.processes.size(); ++i) {
    Figure f = process_figure(run, i, metric, scope, warmup_steps);
    if (!f.judged) {
      if (i == run.main || first_unjudged.why_not.empty()) first_unjudged = f;
      continue;
    }
    ++judged;
    // The worst process: the highest value (the fewest steps for min_steps is
    // not wanted: at least one process must have run the steps).
    if (!any || f.value > worst.value) worst = f;
    any = true;
  }
  if (!any) {
    Figure none = first_unjudged;
    none.judged = false;
    return none;
  }
  worst.several_processes = judged > 1;
  return worst;
}

// --- Checking -------------------------------------------------------------------

namespace {

// Whether the exit-leak sites of every process add up to its exit-leak total
// (a saved report lists its largest sites only).
bool exit_sites_complete(const RunData& run) {
  for (size_t i = 0; i < run.processes.size(); ++i) {
    const json& leaks = member(process_json(run, i), "exit_leaks");
    double sum = 0;
    for (const json& s : member(leaks, "sites")) sum += number(s, "bytes");
    if (sum < number(leaks, "bytes")) return false;
  }
  return true;
}

}  // namespace

size_t CheckOutcome::failures() const {
  return static_cast<size_t>(std::count_if(items.begin(), items.end(), [](const CheckItem& i) { return !i.passed; }));
}

std::string CheckItem::id() const {
  return std::string(metric_info(metric).key).substr(metric == Metric::kMinSteps ? 0 : 4) + "." + scope_name(scope) +
         (vs_baseline ? ".baseline" : "");
}

std::string CheckItem::name() const {
  std::string out = metric_info(metric).label;
  if (metric != Metric::kOoms && metric != Metric::kMinSteps) out += std::string(" (") + scope_name(scope) + ")";
  if (vs_baseline) out += " vs baseline";
  return out;
}

std::string CheckItem::message() const {
  const MetricInfo& info = metric_info(metric);
  if (!figure.judged) return "not judged: " + figure.why_not;
  if (vs_baseline && !base.judged) return "not judged: the baseline has " + base.why_not;
  std::string out = format_value(figure.value, info.unit);
  if (figure.several_processes) {
    out += " in pid " + std::to_string(figure.pid);
    if (!figure.rank.empty()) out += " (rank " + figure.rank + ")";
  }
  const bool minimum = metric == Metric::kMinSteps;
  if (passed) {
    out += minimum ? " >= " : " <= ";
  } else {
    out += minimum ? " < " : " > ";
  }
  out += "limit " + format_value(limit, info.unit);
  std::vector<std::string> details;
  if (vs_baseline) {
    std::string d = "baseline " + format_value(base.value, info.unit);
    const std::string r = ratio_text(base.value, figure.value);
    if (!r.empty()) d += ", " + r;
    if (metric != Metric::kOoms) {
      d += "; tolerance " + percent(tolerance);
      if (floor > 0) d += " + " + format_value(floor, info.unit);
    }
    details.push_back(d);
  }
  if (metric == Metric::kGrowthPerStep) {
    char buf[128];
    char fit_text[32] = "flat";
    if (!figure.flat) std::snprintf(fit_text, sizeof fit_text, "R\u00b2 %.2f", figure.r_squared);
    std::snprintf(buf, sizeof buf, "fit over steps %llu-%llu, %s%s", static_cast<unsigned long long>(figure.first_step),
                  static_cast<unsigned long long>(figure.last_step), fit_text,
                  figure.plateau ? ", last half of the window" : "");
    details.push_back(buf);
    if (figure.sampling_noise) {
      details.push_back("the sampled estimate, " + format_value(figure.estimate, info.unit) +
                        ", is sampling noise: no growth suspect has this role");
    }
  }
  if (!details.empty()) {
    out += " (";
    for (size_t i = 0; i < details.size(); ++i) out += (i ? "; " : "") + details[i];
    out += ")";
  }
  if (!passed && !figure.site.empty()) out += "; " + figure.site_role + ": " + figure.site;
  return out;
}

CheckOutcome run_check(const RunData& run, const RunData* baseline, const Policy& policy) {
  CheckOutcome outcome;
  const int warmup = policy.warmup_steps.value_or(-1);
  outcome.run = summarize(run, warmup);
  for (const json& p : member(run.report, "problems")) {
    if (p.is_string()) outcome.notes.push_back(p.get<std::string>());
  }

  for (const Limit& limit : policy.sorted_limits()) {
    CheckItem item;
    item.metric = limit.metric;
    item.scope = limit.scope;
    item.figure = compute_figure(run, limit.metric, limit.scope, warmup);
    item.limit = limit.value;
    item.limit_origin = limit.origin;
    // Memory comes in whole bytes: a sampled estimate that grows by a
    // fraction of a byte a step is judged as the whole bytes it prints.
    const Unit unit = metric_info(limit.metric).unit;
    if (unit == Unit::kBytes || unit == Unit::kBytesPerStep) item.figure.value = std::round(item.figure.value) + 0.0;
    if (!item.figure.judged) {
      item.passed = false;
    } else if (limit.metric == Metric::kMinSteps) {
      item.passed = item.figure.value >= limit.value;
    } else {
      item.passed = item.figure.value <= limit.value;
    }
    outcome.items.push_back(std::move(item));
  }

  if (baseline != nullptr) {
    outcome.baseline = summarize(*baseline, warmup);
    outcome.tolerance = policy.tolerance.value_or(kDefaultTolerance);
    std::vector<Scope> kinds = kinds_present(run);
    for (Scope s : kinds_present(*baseline)) {
      if (std::find(kinds.begin(), kinds.end(), s) == kinds.end()) kinds.push_back(s);
    }
    std::sort(kinds.begin(), kinds.end());
    std::vector<Scope> scopes = {Scope::kTotal};
    if (kinds.size() > 1) scopes.insert(scopes.end(), kinds.begin(), kinds.end());
    for (int m = 0; m < kMetricCount; ++m) {
      const MetricInfo& info = metric_info(static_cast<Metric>(m));
      if (!info.baseline) continue;
      for (Scope scope : scopes) {
        if (!(info.scopes & (1u << static_cast<unsigned>(scope)))) continue;
        CheckItem item;
        item.metric = info.metric;
        item.scope = scope;
        item.vs_baseline = true;
        item.figure = compute_figure(run, info.metric, scope, warmup);
        item.base = compute_figure(*baseline, info.metric, scope, warmup);
        item.limit_origin = policy.baseline_origin;
        if (info.metric == Metric::kOoms) {
          item.limit = item.base.value;  // no more out-of-memory events than the baseline had
        } else {
          item.tolerance = *outcome.tolerance;
          item.floor = info.floor;
          item.limit = std::max(0.0, item.base.value) * (1 + item.tolerance) + item.floor;
        }
        item.passed = item.figure.judged && item.base.judged && item.figure.value <= item.limit;
        outcome.items.push_back(std::move(item));
      }
    }
    if (outcome.baseline->steps != outcome.run.steps) {
      outcome.notes.push_back("the baseline recorded " + plural(outcome.baseline->steps, "step") + ", this run " +
                              plural(outcome.run.steps, "step") + ": peaks and exit leaks may not compare");
    }
  }
  const bool per_kind_exit_leak = std::any_of(outcome.items.begin(), outcome.items.end(), [](const CheckItem& i) {
    return i.metric == Metric::kExitLeak && i.scope != Scope::kTotal;
  });
  for (const RunData* r : {&run, baseline}) {
    if (r != nullptr && per_kind_exit_leak && !exit_sites_complete(*r)) {
      outcome.notes.push_back(r->path + " is a report that lists only its largest exit-leak sites: exit leaks per "
                              "kind count those sites only (a run folder gives exact figures)");
    }
  }
  if (warmup >= 0 && !run.processes.empty() && run.source == "report JSON" &&
      run.processes[run.main].report_warmup != warmup) {
    outcome.notes.push_back("growth suspects were judged by the report with " +
                            plural(static_cast<size_t>(run.processes[run.main].report_warmup), "warm-up step") +
                            "; the growth fits use " + std::to_string(warmup));
  }
  return outcome;
}

// --- Outputs --------------------------------------------------------------------

std::string render_check_text(const CheckOutcome& outcome, bool failures_only) {
  std::ostringstream out;
  if (!failures_only) {
    out << "memledger check: " << summary_line(outcome.run) << "\n";
    if (outcome.baseline) {
      out << "baseline: " << summary_line(*outcome.baseline) << "; tolerance " << percent(*outcome.tolerance)
          << "\n";
    }
  }
  for (const CheckItem& item : outcome.items) {
    if (failures_only && item.passed) continue;
    out << (item.passed ? "ok   " : "FAIL ") << item.name() << ": " << item.message() << "\n";
  }
  for (const std::string& n : outcome.notes) out << "note: " << n << "\n";
  const size_t failed = outcome.failures();
  const size_t total = outcome.items.size();
  if (failed) {
    out << "memledger check: FAILED: " << failed << " of " << plural(total, "limit") << " broken\n";
  } else if (!failures_only) {
    out << "memledger check: passed: " << (total == 1 ? "the limit holds" : "all " + plural(total, "limit") + " hold")
        << "\n";
  }
  return out.str();
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\n': out += "&#10;"; break;
      case '\t': out += "&#9;"; break;
      case '\r': out += "&#13;"; break;
      default:
        // XML 1.0 forbids other control characters even as references.
        if (c < 0x20) {
          out += '?';
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string render_check_junit(const CheckOutcome& outcome, const std::string& timestamp,
                               const std::string& hostname, double seconds) {
  const size_t tests = outcome.items.size();
  const size_t failures = outcome.failures();
  char time_text[32];
  std::snprintf(time_text, sizeof time_text, "%.3f", seconds);
  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out << "<testsuites name=\"memledger check\" tests=\"" << tests << "\" failures=\"" << failures
      << "\" errors=\"0\" time=\"" << time_text << "\">\n";
  out << "  <testsuite name=\"memledger\" package=\"memledger\" id=\"0\" tests=\"" << tests << "\" failures=\""
      << failures << "\" errors=\"0\" skipped=\"0\" time=\"" << time_text << "\" timestamp=\"" << xml_escape(timestamp)
      << "\" hostname=\"" << xml_escape(hostname.empty() ? "localhost" : hostname) << "\">\n";
  out << "    <properties>\n";
  auto property = [&](const std::string& name, const std::string& value) {
    out << "      <property name=\"" << xml_escape(name) << "\" value=\"" << xml_escape(value) << "\"/>\n";
  };
  property("run", outcome.run.path);
  property("command", command_text(outcome.run.command));
  property("steps", std::to_string(outcome.run.steps));
  property("warmup_steps", std::to_string(outcome.run.warmup_steps));
  if (outcome.baseline) {
    property("baseline", outcome.baseline->path);
    property("tolerance", percent(*outcome.tolerance));
  }
  out << "    </properties>\n";
  for (const CheckItem& item : outcome.items) {
    out << "    <testcase name=\"" << xml_escape(item.name()) << "\" classname=\"memledger."
        << metric_info(item.metric).key << "\" time=\"0\"";
    if (item.passed) {
      out << "/>\n";
      continue;
    }
    out << ">\n      <failure type=\"" << xml_escape(item.id()) << "\" message=\"" << xml_escape(item.message())
        << "\">" << xml_escape(item.name() + ": " + item.message());
    if (!item.limit_origin.empty()) out << xml_escape("\nlimit from " + item.limit_origin);
    out << "</failure>\n    </testcase>\n";
  }
  out << "    <system-out>" << xml_escape(render_check_text(outcome, false)) << "</system-out>\n";
  out << "    <system-err></system-err>\n";
  out << "  </testsuite>\n</testsuites>\n";
  return out.str();
}

json render_check_json(const CheckOutcome& outcome) {
  json checks = json::array();
  for (const CheckItem& item : outcome.items) {
    const MetricInfo& info = metric_info(item.metric);
    json c = {{"id", item.id()},
              {"name", item.name()},
              {"metric", std::string(info.key).substr(item.metric == Metric::kMinSteps ? 0 : 4)},
              {"scope", scope_name(item.scope)},
              {"against", item.vs_baseline ? "baseline" : "limit"},
              {"passed", item.passed},
              {"judged", item.figure.judged && (!item.vs_baseline || item.base.judged)},
              {"unit", unit_name(info.unit)},
              {"figure", item.figure.judged ? json(item.figure.value) : json(nullptr)},
              {"limit", item.limit},
              {"limit_origin", item.limit_origin},
              {"message", item.message()}};
    if (item.vs_baseline) {
      c["baseline"] = item.base.judged ? json(item.base.value) : json(nullptr);
      c["tolerance"] = item.tolerance;
      c["floor"] = item.floor;
    }
    if (item.figure.judged) {
      c["pid"] = item.figure.pid;
      if (!item.figure.rank.empty()) c["rank"] = item.figure.rank;
      if (!item.figure.site.empty()) c["site"] = {{"role", item.figure.site_role}, {"name", item.figure.site}};
      if (item.metric == Metric::kGrowthPerStep) {
        c["fit"] = {{"method", "theil_sen"},
                    {"r_squared", item.figure.r_squared},
                    {"flat", item.figure.flat},
                    {"first_step", item.figure.first_step},
                    {"last_step", item.figure.last_step},
                    {"last_half", item.figure.plateau}};
        if (item.figure.sampling_noise) c["fit"]["sampling_noise_estimate"] = item.figure.estimate;
      }
    }
    checks.push_back(std::move(c));
  }
  json out = {{"schema", "memledger-check"},
              {"schema_version", kCheckSchemaVersion},
              {"passed", outcome.passed()},
              {"exit_code", outcome.passed() ? 0 : 1},
              {"failures", outcome.failures()},
              {"run", summary_json(outcome.run)},
              {"baseline", outcome.baseline ? summary_json(*outcome.baseline) : json(nullptr)},
              {"tolerance", outcome.tolerance ? json(*outcome.tolerance) : json(nullptr)},
              {"checks", checks},
              {"notes", outcome.notes}};
  return out;
}

namespace {

// Markdown table cells: no line breaks, no column separators; text from the
// traced program goes in code spans.
std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string md_code(const std::string& s) {
  std::string inner = md_cell(s);
  std::replace(inner.begin(), inner.end(), '`', '\'');
  return "`" + inner + "`";
}

}  // namespace

std::string render_check_markdown(const CheckOutcome& outcome) {
  std::ostringstream out;
  const size_t failed = outcome.failures();
  const size_t total = outcome.items.size();
  out << "### memledger check: " << (failed ? "failed" : "passed") << "\n\n";
  out << (failed ? std::to_string(failed) + " of " + plural(total, "limit") + " broken"
                 : (total == 1 ? std::string("The limit holds") : "All " + plural(total, "limit") + " hold"))
      << ". Run " << md_code(outcome.run.path);
  if (!outcome.run.command.empty()) out << " (" << md_code(command_text(outcome.run.command)) << ")";
  out << ": " << plural(outcome.run.steps, "step") << ", warm-up " << outcome.run.warmup_steps << ".";
  if (outcome.baseline) {
    out << " Baseline " << md_code(outcome.baseline->path) << ", tolerance " << percent(*outcome.tolerance) << ".";
  }
  out << "\n\n| | check | figure | limit | where to look |\n|---|---|---|---|---|\n";
  for (const CheckItem& item : outcome.items) {
    const Unit unit = metric_info(item.metric).unit;
    std::string figure = item.figure.judged ? format_value(item.figure.value, unit) : "not judged";
    std::string limit = format_value(item.limit, unit);
    if (item.vs_baseline && item.base.judged) limit += " (baseline " + format_value(item.base.value, unit) + ")";
    std::string where;
    if (!item.figure.judged) {
      where = md_cell(item.figure.why_not);
    } else if (item.vs_baseline && !item.base.judged) {
      where = "baseline: " + md_cell(item.base.why_not);
    } else if (!item.figure.site.empty()) {
      where = md_cell(item.figure.site_role) + " " + md_code(item.figure.site);
    }
    out << "| " << (item.passed ? "pass" : "**FAIL**") << " | " << md_cell(item.name()) << " | " << md_cell(figure)
        << " | " << md_cell(limit) << " | " << where << " |\n";
  }
  for (const std::string& n : outcome.notes) out << "\n> " << md_cell(n) << "\n";
  return out.str();
}

// --- Diff -----------------------------------------------------------------------

namespace {

struct SiteKey {
  std::string kind;
  std::string site;
  bool operator<(const SiteKey& o) const { return std::tie(kind, site) < std::tie(o.kind, o.site); }
};

// Sums a per-site figure over every process, by site name: stack ids differ
// between traces, the named site does not.
std::map<SiteKey, double> sites_by_name(const RunData& run, const char* list, const char* inner, const char* field) {
  std::map<SiteKey, double> out;
  for (size_t i = 0; i < run.processes.size(); ++i) {
    const json& pj = process_json(run, i);
    const json& sites = inner ? member(member(pj, list), inner) : member(pj, list);
    for (const json& s : sites) out[{text(s, "kind"), text(s, "site")}] += number(s, field);
  }
  return out;
}

json site_changes(const std::map<SiteKey, double>& a, const std::map<SiteKey, double>& b, size_t max_sites) {
  std::map<SiteKey, std::pair<double, double>> both;
  for (const auto& [k, v] : a) both[k].first = v;
  for (const auto& [k, v] : b) both[k].second = v;
  std::vector<std::pair<SiteKey, std::pair<double, double>>> rows(both.begin(), both.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) {
    return std::fabs(x.second.second - x.second.first) > std::fabs(y.second.second - y.second.first);
  });
  json out = json::array();
  for (const auto& [k, v] : rows) {
    if (out.size() >= max_sites) break;
    if (v.first == v.second) continue;
    out.push_back({{"kind", k.kind},
                   {"site", k.site},
                   {"a", v.first},
                   {"b", v.second},
                   {"change", v.second - v.first},
                   {"in_a", a.count(k) > 0},
                   {"in_b", b.count(k) > 0}});
  }
  return out;
}

json figure_value(const Figure& f) { return f.judged ? json(f.value) : json(nullptr); }

}  // namespace

json diff_runs(const RunData& a, const RunData& b, int warmup_steps, size_t max_sites) {
  json out = {{"schema", "memledger-diff"}, {"schema_version", kDiffSchemaVersion}};
  out["a"] = summary_json(summarize(a, warmup_steps));
  out["b"] = summary_json(summarize(b, warmup_steps));
  out["same_command"] = same_command(a.command, b.command);

  std::vector<Scope> kinds = kinds_present(a);
  for (Scope s : kinds_present(b)) {
    if (std::find(kinds.begin(), kinds.end(), s) == kinds.end()) kinds.push_back(s);
  }
  std::sort(kinds.begin(), kinds.end());
  std::vector<Scope> scopes = {Scope::kTotal};
  if (kinds.size() > 1) scopes.insert(scopes.end(), kinds.begin(), kinds.end());

  std::vector<Scope> roles = roles_present(a);
  for (Scope s : roles_present(b)) {
    if (std::find(roles.begin(), roles.end(), s) == roles.end()) roles.push_back(s);
  }
  std::sort(roles.begin(), roles.end());

  json figures = json::array();
  const Metric metrics[] = {Metric::kMinSteps,          Metric::kGrowthPerStep, Metric::kPeak,     Metric::kHeld,
                            Metric::kFragmentationShare, Metric::kExitLeak,      Metric::kSuspects, Metric::kOoms};
  for (Metric m : metrics) {
    const MetricInfo& info = metric_info(m);
    // By role: growth and the highest live bytes at a step end.
    std::vector<Scope> metric_scopes = scopes;
    if (m == Metric::kGrowthPerStep || m == Metric::kPeak) metric_scopes.insert(metric_scopes.end(), roles.begin(), roles.end());
    for (Scope scope : metric_scopes) {
      if (!(info.scopes & (1u << static_cast<unsigned>(scope)))) continue;
      const Figure fa = compute_figure(a, m, scope, warmup_steps);
      const Figure fb = compute_figure(b, m, scope, warmup_steps);
      std::string name = m == Metric::kMinSteps ? std::string("steps") : std::string(info.label);
      if (scope != Scope::kTotal || (m != Metric::kOoms && m != Metric::kMinSteps)) {
        name += std::string(" (") + scope_name(scope) + ")";
      }
      json row = {{"name", name},
                  {"metric", std::string(info.key).substr(m == Metric::kMinSteps ? 0 : 4)},
                  {"scope", scope_name(scope)},
                  {"unit", unit_name(info.unit)},
                  {"a", figure_value(fa)},
                  {"b", figure_value(fb)}};
      if (m == Metric::kMinSteps) row["metric"] = "steps";
      if (fa.judged && fb.judged) {
        row["change"] = fb.value - fa.value;
        const bool ratio = fa.value > 0 && info.unit != Unit::kShare;
        row["change_ratio"] = ratio ? json((fb.value - fa.value) / fa.value) : json(nullptr);
      } else {
        row["change"] = nullptr;
        row["change_ratio"] = nullptr;
      }
      figures.push_back(std::move(row));
    }
  }
  out["figures"] = figures;

  json series = json::object();
  const ProcessData* pa = a.processes.empty() ? nullptr : &a.processes[a.main];
  const ProcessData* pb = b.processes.empty() ? nullptr : &b.processes[b.main];
  // One scope's live bytes at each step end of both runs, side by side.
  auto side_by_side = [&](Scope scope) {
    const std::vector<double> sa = pa ? series_of(*pa, scope) : std::vector<double>{};
    const std::vector<double> sb = pb ? series_of(*pb, scope) : std::vector<double>{};
    json rows = json::array();
    for (size_t i = 0; i < std::max(sa.size(), sb.size()); ++i) {
      rows.push_back({{"step", i + 1},
                      {"a", i < sa.size() ? json(sa[i]) : json(nullptr)},
                      {"b", i < sb.size() ? json(sb[i]) : json(nullptr)}});
    }
    return rows;
  };
  for (Scope kind : kinds.empty() ? std::vector<Scope>{Scope::kHost} : kinds) series[scope_name(kind)] = side_by_side(kind);
  out["series"] = series;
  json role_series = json::object();
  for (Scope role : roles) role_series[scope_name(role)] = side_by_side(role);
  out["role_series"] = role_series;
  out["growth_sites"] = site_changes(sites_by_name(a, "leak_suspects", nullptr, "bytes_per_step_exact"),
                                     sites_by_name(b, "leak_suspects", nullptr, "bytes_per_step_exact"), max_sites);
  out["exit_leak_sites"] = site_changes(sites_by_name(a, "exit_leaks", "sites", "bytes"),
                                        sites_by_name(b, "exit_leaks", "sites", "bytes"), max_sites);
  return out;
}

namespace {

Unit unit_from_name(const std::string& name) {
  if (name == "bytes_per_step") return Unit::kBytesPerStep;
  if (name == "bytes") return Unit::kBytes;
  if (name == "share") return Unit::kShare;
  return Unit::kCount;
}

std::string pad(const std::string& s, size_t width, bool right) {
  // Widths count characters, not bytes (R², µ): count UTF-8 lead bytes only.
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
  if (chars >= width) return s;
  return right ? std::string(width - chars, ' ') + s : s + std::string(width - chars, ' ');
}

std::string value_or_dash(const json& v, Unit unit) {
  return v.is_number() ? format_value(v.get<double>(), unit) : std::string("-");
}

std::string run_line(const json& s) {
  std::string out = s.value("path", std::string()) + ": " + plural(s.value("steps", size_t{0}), "step") +
                    " (warm-up " + std::to_string(s.value("warmup_steps", 0)) + ")";
  const std::vector<std::string> command = s.value("command", std::vector<std::string>{});
  if (!command.empty()) out += "; " + command_text(command);
  const std::string verdict = s.value("verdict", std::string());
  if (!verdict.empty()) out += "; " + verdict;
  return out;
}

void render_sites(std::ostringstream& out, const json& sites, Unit unit, const char* title) {
  out << "\n" << title << "\n";
  if (sites.empty()) {
    out << "  (no change)\n";
    return;
  }
  out << "  " << pad("change", 16, false) << pad("A", 16, false) << pad("B", 16, false) << pad("kind", 13, false)
      << "site\n";
  for (const json& s : sites) {
    const double av = s.value("a", 0.0), bv = s.value("b", 0.0);
    out << "  " << pad(signed_change(bv - av, unit), 16, false)
        << pad(s.value("in_a", false) ? format_value(av, unit) : "-", 16, false)
        << pad(s.value("in_b", false) ? format_value(bv, unit) : "-", 16, false)
        << pad(s.value("kind", std::string()), 13, false) << s.value("site", std::string()) << "\n";
  }
}

}  // namespace

std::string render_diff_text(const json& diff, size_t max_rows) {
  std::ostringstream out;
  out << "memledger diff\n";
  out << "  A: " << run_line(diff.at("a")) << "\n";
  out << "  B: " << run_line(diff.at("b")) << "\n";
  if (!diff.value("same_command", true)) out << "  (the two runs ran different commands)\n";

  out << "\n" << pad("figure", 34, false) << pad("A", 16, true) << pad("B", 16, true) << "   change\n";
  for (const json& f : diff.at("figures")) {
    const Unit unit = unit_from_name(f.value("unit", std::string()));
    std::string change;
    if (f["change"].is_number()) {
      const double d = f["change"].get<double>();
      change = d == 0 ? "=" : signed_change(d, unit);
      if (d != 0 && f["change_ratio"].is_number()) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " (%+.1f%%)", f["change_ratio"].get<double>() * 100);
        change += buf;
      }
    }
    out << pad(f.value("name", std::string()), 34, false) << pad(value_or_dash(f["a"], unit), 16, true)
        << pad(value_or_dash(f["b"], unit), 16, true) << "   " << change << "\n";
  }

  for (auto it = diff.at("series").begin(); it != diff.at("series").end(); ++it) {
    const json& rows = it.value();
    out << "\nlive bytes at step ends (" << it.key() << ")\n";
    out << pad("step", 8, true) << pad("A", 14, true) << pad("B", 14, true) << pad("B - A", 14, true) << "\n";
    const size_t n = rows.size();
    const size_t every = max_rows == 0 || n <= max_rows ? 1 : (n + max_rows - 1) / max_rows;
    for (size_t i = 0; i < n; ++i) {
      if (i % every != 0 && i + 1 != n) continue;
      const json& r = rows[i];
      std::string delta;
      if (r["a"].is_number() && r["b"].is_number()) {
        const double d = r["b"].get<double>() - r["a"].get<double>();
        delta = d == 0 ? "=" : signed_change(d, Unit::kBytes);
      }
      out << pad(std::to_string(r.value("step", size_t{0})), 8, true)
          << pad(value_or_dash(r["a"], Unit::kBytes), 14, true)
          << pad(value_or_dash(r["b"], Unit::kBytes), 14, true) << pad(delta, 14, true) << "\n";
    }
    if (every > 1) out << "  (every " << every << " steps and the last; --all-steps or --format json for all)\n";
  }
  render_sites(out, diff.at("growth_sites"), Unit::kBytesPerStep, "sites whose growth per step changed most");
  render_sites(out, diff.at("exit_leak_sites"), Unit::kBytes, "sites whose exit leak changed most");
  return out.str();
}

}  // namespace memledger::report
