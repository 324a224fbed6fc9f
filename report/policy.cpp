#include "policy.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

namespace memledger::report {
namespace {

namespace fs = std::filesystem;

constexpr unsigned bit(Scope s) { return 1u << static_cast<unsigned>(s); }
constexpr unsigned kAllScopes = (1u << kScopeCount) - 1;
// Held bytes (and so fragmentation) are reported for the host heap and for
// device memory (device and managed allocations together) only.
constexpr unsigned kHeldScopes = bit(Scope::kTotal) | bit(Scope::kHost) | bit(Scope::kDevice);

// The absolute floors of baseline comparisons keep near-zero baselines from
// failing on noise (0 B/step against 16 B/step): a few pages of growth per
// step, a MiB of peak or held memory, 64 KiB of exit leak.
const MetricInfo kMetrics[kMetricCount] = {
    {Metric::kGrowthPerStep, "max_growth_per_step", "--max-growth-per-step", "growth per step", Unit::kBytesPerStep,
     kAllScopes, true, 4096},
    {Metric::kPeak, "max_peak", "--max-peak", "peak live", Unit::kBytes, kAllScopes, true, 1 << 20},
    {Metric::kHeld, "max_held", "--max-held", "peak held", Unit::kBytes, kHeldScopes, true, 1 << 20},
    {Metric::kFragmentationShare, "max_fragmentation_share", "--max-fragmentation-share", "fragmentation share",
     Unit::kShare, kHeldScopes, false, 0},
    {Metric::kExitLeak, "max_exit_leak", "--max-exit-leak", "exit leak", Unit::kBytes, kAllScopes, true, 64 << 10},
    {Metric::kSuspects, "max_suspects", "--max-suspects", "growth suspects", Unit::kCount, kAllScopes, false, 0},
    {Metric::kOoms, "max_ooms", "--max-ooms", "OOM events", Unit::kCount, bit(Scope::kTotal), true, 0},
    {Metric::kMinSteps, "min_steps", "--min-steps", "steps recorded", Unit::kCount, bit(Scope::kTotal), false, 0},
};

const char* const kScopeNames[kScopeCount] = {"total", "host", "device", "managed", "pinned_host"};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

// A plain decimal number ("12", "1.5", ".5"): no sign, exponent, hex, inf or nan.
// Returns the number and leaves the rest (the unit) in `text`.
std::optional<double> take_decimal(std::string_view& text) {
  size_t i = 0;
  bool digits = false, dot = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      digits = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return std::nullopt;
  const std::string number(text.substr(0, i));
  text.remove_prefix(i);
  return std::strtod(number.c_str(), nullptr);
}

std::string allowed_scopes(const MetricInfo& info) {
  std::string out;
  for (int s = 0; s < kScopeCount; ++s) {
    if (!(info.scopes & (1u << s))) continue;
    if (!out.empty()) out += ", ";
    out += kScopeNames[s];
  }
  return out;
}

const MetricInfo* metric_by_key(std::string_view key) {
  for (const MetricInfo& m : kMetrics) {
    if (key == m.key) return &m;
  }
  return nullptr;
}

double parse_metric_value(const MetricInfo& info, std::string_view text, std::string_view what) {
  switch (info.unit) {
    case Unit::kBytesPerStep: return parse_size(text, what, true);
    case Unit::kBytes: return parse_size(text, what);
    case Unit::kShare: return parse_share(text, what);
    case Unit::kCount: return static_cast<double>(parse_count(text, what));
  }
  return 0;
}

// --- TOML ---------------------------------------------------------------------

const char* toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "nothing";
  }
}

class TomlReader {
 public:
  TomlReader(std::string source, std::string base_dir) : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  Policy read(std::string_view text) {
    toml::table root;
    try {
      root = toml::parse(text, source_);
    } catch (const toml::parse_error& e) {
      throw PolicyError(source_ + ":" + std::to_string(e.source().begin.line) + ": not valid TOML: " +
                        std::string(e.description()));
    }
    for (auto&& [key, node] : root) {
      const std::string name(key.str());
      const std::string where = location(key.source().begin.line, name);
      if (node.is_table()) {
        read_kind_table(name, *node.as_table(), key.source().begin.line);
      } else if (name == "warmup_steps") {
        const auto* v = node.as_integer();
        if (v == nullptr || v->get() < 0 || v->get() > 1000000) {
          throw PolicyError(where + ": expected a whole number of steps (0 or more), not " + describe(node));
        }
        policy_.warmup_steps = static_cast<int>(v->get());
        policy_.warmup_origin = where;
      } else if (name == "baseline") {
        const auto* v = node.as_string();
        if (v == nullptr || v->get().empty()) {
          throw PolicyError(where + ": expected the path of a run folder or report JSON (a string), not " +
                            describe(node));
        }
        fs::path p(v->get());
        if (p.is_relative() && !base_dir_.empty()) p = fs::path(base_dir_) / p;
        policy_.baseline = p.lexically_normal().string();
        policy_.baseline_origin = where;
      } else if (name == "tolerance") {
        if (const auto* s = node.as_string()) {
          policy_.tolerance = parse_tolerance(s->get(), where);
        } else if (node.is_number()) {
          policy_.tolerance = parse_tolerance(number_text(node), where);
        } else {
          throw PolicyError(where + ": expected a tolerance such as \"5%\" or 0.05, not " + describe(node));
        }
        policy_.tolerance_origin = where;
      } else if (name == "allow_different_command") {
        const auto* v = node.as_boolean();
        if (v == nullptr) throw PolicyError(where + ": expected true or false, not " + describe(node));
        policy_.allow_different_command = v->get();
      } else if (const MetricInfo* info = metric_by_key(name)) {
        policy_.set(read_limit(*info, Scope::kTotal, node, where));
      } else {
        throw PolicyError(where + ": unknown key " + in_quotes(name) + " (keys: " + known_keys() +
                          "; tables: [host], [device], [managed], [pinned_host])");
      }
    }
    return policy_;
  }

 private:
  std::string location(uint32_t line, const std::string& key) const {
    return source_ + ":" + std::to_string(line) + ": " + key;
  }

  static std::string number_text(const toml::node& node) {
    std::ostringstream out;
    if (const auto* i = node.as_integer()) {
      out << i->get();
    } else if (const auto* f = node.as_floating_point()) {
      out.precision(17);
      out << f->get();
    }
    return out.str();
  }

  static std::string describe(const toml::node& node) {
    if (const auto* s = node.as_string()) return "the string \"" + s->get() + "\"";
    if (node.is_number()) return number_text(node);
    if (const auto* b = node.as_boolean()) return b->get() ? "true" : "false";
    return toml_type_name(node);
  }

  static std::string known_keys() {
    std::string out;
    for (const MetricInfo& m : kMetrics) out += std::string(m.key) + ", ";
    return out + "warmup_steps, baseline, tolerance, allow_different_command";
  }

  void read_kind_table(const std::string& name, const toml::table& table, uint32_t line) {
    const std::optional<Scope> scope = scope_from_name(name);
    if (!scope || *scope == Scope::kTotal) {
      throw PolicyError(location(line, "[" + name + "]") + ": unknown memory kind " + in_quotes(name) +
                        " (tables: [host], [device], [managed], [pinned_host]; limits on all memory go at the top)");
    }
    for (auto&& [key, node] : table) {
      const std::string sub(key.str());
      const std::string where = location(key.source().begin.line, name + "." + sub);
      const MetricInfo* info = metric_by_key(sub);
      if (info == nullptr) {
        const bool run_wide = sub == "warmup_steps" || sub == "baseline" || sub == "tolerance" ||
                              sub == "allow_different_command";
        throw PolicyError(where + ": " +
                          (run_wide ? in_quotes(sub) + " is not a per-kind setting: put it at the top of the file"
                                    : "unknown key " + in_quotes(sub) + " in [" + name + "]"));
      }
      if (!(info->scopes & bit(*scope))) {
        throw PolicyError(where + ": no " + info->label + " figure exists for " + name + " memory (" + info->key +
                          " applies to: " + allowed_scopes(*info) + ")");
      }
      policy_.set(read_limit(*info, *scope, node, where));
    }
  }

  static Limit read_limit(const MetricInfo& info, Scope scope, const toml::node& node, const std::string& where) {
    Limit limit;
    limit.metric = info.metric;
    limit.scope = scope;
    limit.origin = where;
    if (const auto* s = node.as_string()) {
      if (info.unit == Unit::kCount) {
        throw PolicyError(where + ": expected a whole number, not " + describe(node));
      }
      limit.text = s->get();
    } else if (node.is_number()) {
      if (info.unit == Unit::kCount && !node.is_integer()) {
        throw PolicyError(where + ": expected a whole number, not " + describe(node));
      }
      limit.text = number_text(node);
      if (!limit.text.empty() && limit.text[0] == '-') {
        throw PolicyError(where + ": " + in_quotes(limit.text) + " is negative");
      }
    } else {
      const char* expected = info.unit == Unit::kCount   ? "a whole number"
                             : info.unit == Unit::kShare ? "a share such as \"30%\" or 0.3"
                                                         : "a size such as \"1.5GiB\" or a number of bytes";
      throw PolicyError(where + ": expected " + expected + ", not " + describe(node));
    }
    limit.value = parse_metric_value(info, limit.text, where);
    return limit;
  }

  std::string source_;
  std::string base_dir_;
  Policy policy_;
};

}  // namespace

const MetricInfo& metric_info(Metric metric) { return kMetrics[static_cast<int>(metric)]; }

const char* scope_name(Scope scope) { return kScopeNames[static_cast<int>(scope)]; }

std::optional<Scope> scope_from_name(std::string_view name) {
  for (int s = 0; s < kScopeCount; ++s) {
    if (name == kScopeNames[s]) return static_cast<Scope>(s);
  }
  return std::nullopt;
}

const Limit* Policy::find(Metric metric, Scope scope) const {
  for (const Limit& l : limits) {
    if (l.metric == metric && l.scope == scope) return &l;
  }
  return nullptr;
}

void Policy::set(Limit limit) {
  for (Limit& l : limits) {
    if (l.metric == limit.metric && l.scope == limit.scope) {
      l = std::move(limit);
      return;
    }
  }
  limits.push_back(std::move(limit));
}

std::vector<Limit> Policy::sorted_limits() const {
  std::vector<Limit> out = limits;
  std::stable_sort(out.begin(), out.end(), [](const Limit& a, const Limit& b) {
    return std::pair(a.metric, a.scope) < std::pair(b.metric, b.scope);
  });
  return out;
}

double parse_size(std::string_view text, std::string_view what, bool per_step) {
  const std::string shown = in_quotes(text);
  std::string_view rest = trim(text);
  if (!rest.empty() && rest.front() == '-') {
    throw PolicyError(std::string(what) + ": " + shown + " is negative; a size is 0 or more bytes");
  }
  if (!rest.empty() && rest.front() == '+') rest.remove_prefix(1);
  const std::optional<double> number = take_decimal(rest);
  std::string unit = lower(trim(rest));
  if (per_step && unit.size() >= 5 && unit.compare(unit.size() - 5, 5, "/step") == 0) {
    unit = lower(trim(std::string_view(unit).substr(0, unit.size() - 5)));
  }
  struct UnitScale {
    const char* name;
    double scale;
  };
  static const UnitScale kUnits[] = {{"", 1},        {"b", 1},          {"kb", 1e3},        {"kib", 1024.0},
                                     {"mb", 1e6},    {"mib", 1048576.0}, {"gb", 1e9},        {"gib", 1073741824.0},
                                     {"tb", 1e12},   {"tib", 1099511627776.0}};
  const UnitScale* scale = nullptr;
  for (const UnitScale& u : kUnits) {
    if (unit == u.name) scale = &u;
  }
  if (!number || scale == nullptr) {
    throw PolicyError(std::string(what) + ": " + shown +
                      " is not a size (write e.g. 4096, 512KiB, 1.5GiB; units B, KB/KiB, MB/MiB, GB/GiB, TB/TiB)");
  }
  const double bytes = std::round(*number * scale->scale);
  if (!(bytes < 9.0e18)) throw PolicyError(std::string(what) + ": " + shown + " is too large");
  return bytes;
}

double parse_tolerance(std::string_view text, std::string_view what) {
  const std::string shown = in_quotes(text);
  std::string_view rest = trim(text);
  if (!rest.empty() && rest.front() == '-') {
    throw PolicyError(std::string(what) + ": " + shown + " is negative; a tolerance is 0% or more");
  }
  const std::optional<double> number = take_decimal(rest);
  rest = trim(rest);
  if (number && rest == "%") return *number / 100;
  if (number && rest.empty()) {
    if (*number < 1) return *number;
    throw PolicyError(std::string(what) + ": " + shown + " is ambiguous: write a percentage (\"" +
                      std::string(trim(text)) + "%\") or a fraction below 1 (\"0.05\")");
  }
  throw PolicyError(std::string(what) + ": " + shown + " is not a tolerance (write e.g. 5% or 0.05)");
}

double parse_share(std::string_view text, std::string_view what) {
  const std::string shown = in_quotes(text);
  std::string_view rest = trim(text);
  if (!rest.empty() && rest.front() == '-') {
    throw PolicyError(std::string(what) + ": " + shown + " is negative; a share is from 0 to 1 (0% to 100%)");
  }
  const std::optional<double> number = take_decimal(rest);
  rest = trim(rest);
  std::optional<double> share;
  if (number && rest == "%") share = *number / 100;
  if (number && rest.empty()) share = *number;
  if (!share) throw PolicyError(std::string(what) + ": " + shown + " is not a share (write e.g. 30% or 0.3)");
  if (*share > 1) throw PolicyError(std::string(what) + ": " + shown + " is more than 100%");
  return *share;
}

uint64_t parse_count(std::string_view text, std::string_view what) {
  const std::string_view t = trim(text);
  const bool digits = !t.empty() && t.size() <= 12 &&
                      std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    throw PolicyError(std::string(what) + ": " + in_quotes(text) + " is not a whole number (0 or more)");
  }
  return std::stoull(std::string(t));
}

Limit parse_limit_flag(Metric metric, std::string_view arg) {
  const MetricInfo& info = metric_info(metric);
  Limit limit;
  limit.metric = metric;
  limit.scope = Scope::kTotal;
  std::string_view value = arg;
  if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
    const std::string kind(trim(arg.substr(0, eq)));
    const std::optional<Scope> scope = scope_from_name(kind);
    if (!scope) {
      throw PolicyError(std::string(info.flag) + ": unknown memory kind " + in_quotes(kind) + " in " + in_quotes(arg) +
                        " (kinds: " + allowed_scopes(info) + ")");
    }
    if (!(info.scopes & bit(*scope))) {
      throw PolicyError(std::string(info.flag) + ": no " + info.label + " figure exists for " + kind +
                        " memory (kinds: " + allowed_scopes(info) + ")");
    }
    limit.scope = *scope;
    value = arg.substr(eq + 1);
  }
  limit.origin = info.flag;
  if (limit.scope != Scope::kTotal) limit.origin += std::string(" ") + scope_name(limit.scope) + "=";
  limit.text = std::string(trim(value));
  limit.value = parse_metric_value(info, value, info.flag);
  return limit;
}

Policy parse_policy_toml(std::string_view text, const std::string& source_name, const std::string& base_dir) {
  return TomlReader(source_name, base_dir).read(text);
}

Policy load_policy_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PolicyError("--policy: cannot read " + in_quotes(path) + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  fs::path dir = fs::path(path).parent_path();
  return parse_policy_toml(text.str(), path, dir.string());
}

void merge_policy(Policy& base, const Policy& over) {
  for (const Limit& l : over.limits) base.set(l);
  if (over.warmup_steps) {
    base.warmup_steps = over.warmup_steps;
    base.warmup_origin = over.warmup_origin;
  }
  if (over.baseline) {
    base.baseline = over.baseline;
    base.baseline_origin = over.baseline_origin;
  }
  if (over.tolerance) {
    base.tolerance = over.tolerance;
    base.tolerance_origin = over.tolerance_origin;
  }
  if (over.allow_different_command) base.allow_different_command = over.allow_different_command;
}

void validate_policy(const Policy& policy) {
  if (policy.tolerance && !policy.baseline) {
    throw PolicyError(policy.tolerance_origin +
                      ": a tolerance needs a baseline to compare with (--baseline RUN_OR_JSON, or baseline = ... "
                      "in the policy file)");
  }
  for (const Limit& l : policy.limits) {
    if (!(metric_info(l.metric).scopes & bit(l.scope))) {
      throw PolicyError(l.origin + ": no " + metric_info(l.metric).label + " figure exists for " +
                        scope_name(l.scope) + " memory");
    }
  }
}

std::string format_size(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = std::fabs(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  const char* sign = bytes < 0 && v != 0 ? "-" : "";
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%s%.0f B", sign, std::round(v));
  } else {
    const int digits = v >= 99.95 ? 0 : v >= 9.995 ? 1 : 2;
    std::snprintf(buf, sizeof buf, "%s%.*f %s", sign, digits, v, kUnits[u]);
  }
  return buf;
}

std::string format_value(double value, Unit unit) {
  char buf[64];
  switch (unit) {
    case Unit::kBytesPerStep: return format_size(value) + "/step";
    case Unit::kBytes: return format_size(value);
    case Unit::kShare:
      std::snprintf(buf, sizeof buf, "%.1f%%", value * 100);
      return buf;
    case Unit::kCount:
      std::snprintf(buf, sizeof buf, "%.0f", value);
      return buf;
  }
  return {};
}

}  // namespace memledger::report
