#include "policy.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <memory>
#include <regex>
#include <toml++/toml.h>
#include <yaml-cpp/yaml.h>

#include "file_io.h"

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

const char* const kScopeNames[kScopeCount] = {"total",      "host",     "device",          "managed",   "pinned_host",
                                              "mapped",     "parameter", "gradient",       "optimizer_state",
                                              "activation", "data",     "workspace",       "communication", "other"};
static_assert(kScopeCount - kFirstRoleScope == kRoleCount);

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

// --- Policy files -------------------------------------------------------------

// A policy file's contents, whatever its syntax: scalars keep their type (a
// quoted "3" is a string, a bare 3 an integer) and every key its line, so
// messages name the file, the line and the key.
struct FileValue;
struct FileEntry {
  std::string key;
  uint32_t line = 0;
  std::shared_ptr<const FileValue> value;
};
struct FileValue {
  enum class Type { kString, kInteger, kFloat, kBoolean, kTable, kArray, kOther };
  Type type = Type::kOther;
  std::string text;  // kString: the string; numbers: as written; kOther: what it is ("an array")
  int64_t integer = 0;
  bool boolean = false;
  std::vector<FileEntry> entries;  // kTable, in file order; kArray: the items (key empty)
};

std::string number_text(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

// --- TOML (toml++) ---

FileValue from_toml(const toml::node& node) {
  FileValue v;
  switch (node.type()) {
    case toml::node_type::string:
      v.type = FileValue::Type::kString;
      v.text = node.as_string()->get();
      break;
    case toml::node_type::integer:
      v.type = FileValue::Type::kInteger;
      v.integer = node.as_integer()->get();
      v.text = std::to_string(v.integer);
      break;
    case toml::node_type::floating_point:
      v.type = FileValue::Type::kFloat;
      v.text = number_text(node.as_floating_point()->get());
      break;
    case toml::node_type::boolean:
      v.type = FileValue::Type::kBoolean;
      v.boolean = node.as_boolean()->get();
      v.text = v.boolean ? "true" : "false";
      break;
    case toml::node_type::table:
      v.type = FileValue::Type::kTable;
      for (auto&& [key, child] : *node.as_table()) {
        v.entries.push_back({std::string(key.str()), key.source().begin.line,
                             std::make_shared<const FileValue>(from_toml(child))});
      }
      break;
    case toml::node_type::array:
      v.type = FileValue::Type::kArray;
      v.text = "an array";
      for (auto&& item : *node.as_array()) {
        v.entries.push_back({"", item.source().begin.line, std::make_shared<const FileValue>(from_toml(item))});
      }
      break;
    case toml::node_type::date: v.text = "a date"; break;
    case toml::node_type::time: v.text = "a time"; break;
    case toml::node_type::date_time: v.text = "a date-time"; break;
    default: v.text = "nothing"; break;
  }
  return v;
}

FileValue parse_toml_file(std::string_view text, const std::string& source) {
  try {
    return from_toml(toml::parse(text, source));
  } catch (const toml::parse_error& e) {
    throw PolicyError(source + ":" + std::to_string(e.source().begin.line) + ": not valid TOML: " +
                      std::string(e.description()));
  }
}

// --- YAML (yaml-cpp) ---

// A plain (unquoted) scalar is typed as YAML 1.2's core schema types it:
// null, true/false, integers, floats; anything else is a string. yes/no/on/off
// stay strings (YAML 1.1 read them as booleans).
FileValue yaml_scalar(const YAML::Node& node) {
  FileValue v;
  const std::string& s = node.Scalar();
  v.text = s;
  const std::string& tag = node.Tag();
  if (tag == "!" || tag == "tag:yaml.org,2002:str") {
    v.type = FileValue::Type::kString;
    return v;
  }
  static const std::regex kNull("~|null|Null|NULL|");
  static const std::regex kTrue("true|True|TRUE");
  static const std::regex kFalse("false|False|FALSE");
  static const std::regex kInteger("[-+]?[0-9]+");
  static const std::regex kFloat(
      "[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  if (std::regex_match(s, kNull)) {
    v.text = "nothing (null)";
  } else if (std::regex_match(s, kTrue) || std::regex_match(s, kFalse)) {
    v.type = FileValue::Type::kBoolean;
    v.boolean = s[0] == 't' || s[0] == 'T';
    v.text = v.boolean ? "true" : "false";
  } else if (std::regex_match(s, kInteger)) {
    errno = 0;
    const long long n = std::strtoll(s.c_str(), nullptr, 10);
    v.type = errno == ERANGE ? FileValue::Type::kFloat : FileValue::Type::kInteger;
    v.integer = n;
  } else if (std::regex_match(s, kFloat)) {
    v.type = FileValue::Type::kFloat;
    const double d = std::strtod(s.c_str(), nullptr);
    if (std::isfinite(d)) v.text = number_text(d);  // as TOML writes it: 1.5e9 is 1500000000
  } else {
    v.type = FileValue::Type::kString;
  }
  return v;
}

FileValue from_yaml(const YAML::Node& node, const std::string& source) {
  FileValue v;
  switch (node.Type()) {
    case YAML::NodeType::Scalar: return yaml_scalar(node);
    case YAML::NodeType::Map: {
      v.type = FileValue::Type::kTable;
      for (auto it = node.begin(); it != node.end(); ++it) {
        const uint32_t line = static_cast<uint32_t>(it->first.Mark().line + 1);
        if (!it->first.IsScalar()) {
          throw PolicyError(source + ":" + std::to_string(line) + ": a key must be a plain name, not a list or map");
        }
        const std::string key = it->first.Scalar();
        for (const FileEntry& e : v.entries) {
          if (e.key == key) {
            throw PolicyError(source + ":" + std::to_string(line) + ": " + key + ": given twice (first on line " +
                              std::to_string(e.line) + ")");
          }
        }
        v.entries.push_back({key, line, std::make_shared<const FileValue>(from_yaml(it->second, source))});
      }
      return v;
    }
    case YAML::NodeType::Sequence:
      v.type = FileValue::Type::kArray;
      v.text = "a list";
      for (auto it = node.begin(); it != node.end(); ++it) {
        v.entries.push_back({"", static_cast<uint32_t>(it->Mark().line + 1),
                             std::make_shared<const FileValue>(from_yaml(*it, source))});
      }
      return v;
    default: v.text = "nothing (null)"; return v;
  }
}

FileValue parse_yaml_file(std::string_view text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw PolicyError(source + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  // An empty document is an empty policy, as an empty TOML file is.
  if (!root.IsDefined() || root.IsNull()) {
    FileValue empty;
    empty.type = FileValue::Type::kTable;
    return empty;
  }
  if (!root.IsMap()) {
    throw PolicyError(source + ":" + std::to_string(root.Mark().line + 1) +
                      ": a policy file is a map of keys (max_peak: 1GiB, ...), not " +
                      (root.IsSequence() ? "a list" : "a single value"));
  }
  try {
    return from_yaml(root, source);
  } catch (const YAML::Exception& e) {
    throw PolicyError(source + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
}

// --- The schema, the same for both syntaxes ---

class PolicyReader {
 public:
  PolicyReader(std::string source, std::string base_dir) : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  Policy read(const FileValue& root) {
    for (const FileEntry& entry : root.entries) {
      const std::string& name = entry.key;
      const FileValue& node = *entry.value;
      const std::string where = location(entry.line, name);
      if (name == "roles") {
        read_roles(node, where);
      } else if (node.type == FileValue::Type::kTable) {
        read_kind_table(name, node, entry.line);
      } else if (name == "warmup_steps") {
        if (node.type != FileValue::Type::kInteger || node.integer < 0 || node.integer > 1000000) {
          throw PolicyError(where + ": expected a whole number of steps (0 or more), not " + describe(node));
        }
        policy_.warmup_steps = static_cast<int>(node.integer);
        policy_.warmup_origin = where;
      } else if (name == "baseline") {
        if (node.type != FileValue::Type::kString || node.text.empty()) {
          throw PolicyError(where + ": expected the path of a run folder or report JSON (a string), not " +
                            describe(node));
        }
        fs::path p(node.text);
        if (p.is_relative() && !base_dir_.empty()) p = fs::path(base_dir_) / p;
        policy_.baseline = p.lexically_normal().string();
        policy_.baseline_origin = where;
      } else if (name == "tolerance") {
        if (node.type != FileValue::Type::kString && node.type != FileValue::Type::kInteger &&
            node.type != FileValue::Type::kFloat) {
          throw PolicyError(where + ": expected a tolerance such as \"5%\" or 0.05, not " + describe(node));
        }
        policy_.tolerance = parse_tolerance(node.text, where);
        policy_.tolerance_origin = where;
      } else if (name == "allow_different_command") {
        if (node.type != FileValue::Type::kBoolean) {
          throw PolicyError(where + ": expected true or false, not " + describe(node));
        }
        policy_.allow_different_command = node.boolean;
      } else if (const MetricInfo* info = metric_by_key(name)) {
        policy_.set(read_limit(*info, Scope::kTotal, node, where));
      } else {
        throw PolicyError(where + ": unknown key " + in_quotes(name) + " (keys: " + known_keys() + ", roles" +
                          "; tables: host, device, managed, pinned_host, mapped and the roles)");
      }
    }
    return policy_;
  }

 private:
  std::string location(uint32_t line, const std::string& key) const {
    return source_ + ":" + std::to_string(line) + ": " + key;
  }

  static std::string describe(const FileValue& node) {
    switch (node.type) {
      case FileValue::Type::kString: return "the string \"" + node.text + "\"";
      case FileValue::Type::kTable: return "a table";
      default: return node.text;
    }
  }

  static std::string known_keys() {
    std::string out;
    for (const MetricInfo& m : kMetrics) out += std::string(m.key) + ", ";
    return out + "warmup_steps, baseline, tolerance, allow_different_command";
  }

  // [roles]: rules = [{role, frames, phase, lifetime, kind, why}, ...]
  // (README, "Roles"), tried before the built-in rules, in file order.
  void read_roles(const FileValue& table, const std::string& where) {
    if (table.type != FileValue::Type::kTable) {
      throw PolicyError(where + ": expected a table with a list of rules (rules = [...]), not " + describe(table));
    }
    for (const FileEntry& entry : table.entries) {
      const std::string at = location(entry.line, "roles." + entry.key);
      if (entry.key != "rules") throw PolicyError(at + ": unknown key " + in_quotes(entry.key) + " in roles (keys: rules)");
      if (entry.value->type != FileValue::Type::kArray) {
        throw PolicyError(at + ": expected a list of rules, not " + describe(*entry.value));
      }
      for (size_t i = 0; i < entry.value->entries.size(); ++i) {
        const FileEntry& item = entry.value->entries[i];
        policy_.role_rules.push_back(read_role_rule(*item.value, location(item.line, "roles.rules[" + std::to_string(i) + "]")));
      }
    }
  }

  RoleRule read_role_rule(const FileValue& node, const std::string& where) {
    if (node.type != FileValue::Type::kTable) {
      throw PolicyError(where + ": expected a rule (role = \"...\", frames = [...]), not " + describe(node));
    }
    RoleRule rule;
    rule.origin = where;
    bool has_role = false;
    for (const FileEntry& e : node.entries) {
      const std::string at = where + "." + e.key;
      const FileValue& v = *e.value;
      auto string_value = [&]() {
        if (v.type != FileValue::Type::kString) throw PolicyError(at + ": expected a string, not " + describe(v));
        return v.text;
      };
      if (e.key == "role") {
        const std::optional<Role> role = role_from_name(string_value());
        if (!role) throw PolicyError(at + ": unknown role " + in_quotes(v.text) + " (roles: " + role_names() + ")");
        rule.role = *role;
        has_role = true;
      } else if (e.key == "frames") {
        if (v.type == FileValue::Type::kString) {
          rule.frames.push_back(v.text);
        } else if (v.type == FileValue::Type::kArray) {
          for (const FileEntry& f : v.entries) {
            if (f.value->type != FileValue::Type::kString) {
              throw PolicyError(at + ": expected frame patterns (strings), not " + describe(*f.value));
            }
            rule.frames.push_back(f.value->text);
          }
        } else {
          throw PolicyError(at + ": expected a list of frame patterns, not " + describe(v));
        }
      } else if (e.key == "phase") {
        rule.phase = string_value();
      } else if (e.key == "lifetime") {
        rule.lifetime = string_value();
      } else if (e.key == "kind") {
        rule.kind = string_value();
      } else if (e.key == "why") {
        rule.why = string_value();
      } else {
        throw PolicyError(at + ": unknown key " + in_quotes(e.key) +
                          " in a role rule (keys: role, frames, phase, lifetime, kind, why)");
      }
    }
    if (!has_role) throw PolicyError(where + ": a role rule needs a role (roles: " + role_names() + ")");
    if (rule.phase == "any") rule.phase.clear();
    if (rule.lifetime == "any") rule.lifetime.clear();
    if (rule.kind == "any") rule.kind.clear();
    if (const std::string error = role_rule_error(rule); !error.empty()) throw PolicyError(where + ": " + error);
    if (rule.why.empty()) rule.why = "rule at " + where.substr(0, where.rfind(": "));
    return rule;
  }

  void read_kind_table(const std::string& name, const FileValue& table, uint32_t line) {
    const std::optional<Scope> scope = scope_from_name(name);
    if (!scope || *scope == Scope::kTotal) {
      throw PolicyError(location(line, name) + ": unknown memory kind or role " + in_quotes(name) +
                        " (tables: host, device, managed, pinned_host, mapped, the roles " + role_names() +
                        ", and roles for rules; limits on all memory go at the top)");
    }
    for (const FileEntry& entry : table.entries) {
      const std::string& sub = entry.key;
      const FileValue& node = *entry.value;
      const std::string where = location(entry.line, name + "." + sub);
      const MetricInfo* info = metric_by_key(sub);
      if (info == nullptr) {
        const bool run_wide = sub == "warmup_steps" || sub == "baseline" || sub == "tolerance" ||
                              sub == "allow_different_command";
        throw PolicyError(where + ": " +
                          (run_wide ? in_quotes(sub) + " is not a per-kind setting: put it at the top of the file"
                                    : "unknown key " + in_quotes(sub) + " in " + name));
      }
      if (!(info->scopes & bit(*scope))) {
        throw PolicyError(where + ": no " + info->label + " figure exists for " + name + " memory (" + info->key +
                          " applies to: " + allowed_scopes(*info) + ")");
      }
      policy_.set(read_limit(*info, *scope, node, where));
    }
  }

  static Limit read_limit(const MetricInfo& info, Scope scope, const FileValue& node, const std::string& where) {
    Limit limit;
    limit.metric = info.metric;
    limit.scope = scope;
    limit.origin = where;
    const bool number = node.type == FileValue::Type::kInteger || node.type == FileValue::Type::kFloat;
    if (node.type == FileValue::Type::kString || number) {
      if (info.unit == Unit::kCount && node.type != FileValue::Type::kInteger) {
        throw PolicyError(where + ": expected a whole number, not " + describe(node));
      }
      limit.text = node.text;
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
      throw PolicyError(std::string(info.flag) + ": unknown memory kind or role " + in_quotes(kind) + " in " +
                        in_quotes(arg) + " (kinds and roles: " + allowed_scopes(info) + ")");
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
  return PolicyReader(source_name, base_dir).read(parse_toml_file(text, source_name));
}

Policy parse_policy_yaml(std::string_view text, const std::string& source_name, const std::string& base_dir) {
  return PolicyReader(source_name, base_dir).read(parse_yaml_file(text, source_name));
}

Policy load_policy_file(const std::string& path) {
  const std::string ext = lower(fs::path(path).extension().string());
  const bool yaml = ext == ".yaml" || ext == ".yml";
  if (!yaml && ext != ".toml") {
    throw PolicyError("--policy: " + in_quotes(path) +
                      ": the file name says neither TOML nor YAML (name it .toml, .yaml or .yml)");
  }
  // A policy is a few lines: a FIFO, a device or a huge file is refused.
  std::string text, error;
  if (!read_regular_file(path, text, error, size_t{1} << 20)) {
    // error is "PATH: why"; the path is shown quoted, as in every policy message.
    const std::string why = error.rfind(path + ": ", 0) == 0 ? error.substr(path.size() + 2) : error;
    throw PolicyError("--policy: cannot read " + in_quotes(path) + ": " + why);
  }
  const std::string dir = fs::path(path).parent_path().string();
  return yaml ? parse_policy_yaml(text, path, dir) : parse_policy_toml(text, path, dir);
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
  base.role_rules.insert(base.role_rules.end(), over.role_rules.begin(), over.role_rules.end());
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
