// The limits `memledger check` judges a run by: parsed from command-line flags
// and from a policy file (TOML or YAML), merged (flags win) and checked for
// contradictions. Sizes read as people write them ("512KiB", "1.5GiB").
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "role_rules.h"

namespace memledger::report {

// A mistake in the limits (a value that does not parse, an unknown or
// contradictory key): `memledger check` exits 2 with this message, which
// names the flag or key and the value.
class PolicyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a limit bounds. Every metric is a maximum except kMinSteps.
enum class Metric : uint8_t {
  kGrowthPerStep,       // bytes per step, from a fit over the steps after warm-up
  kPeak,                // peak live bytes
  kHeld,                // peak held bytes (what the allocators hold from the system)
  kFragmentationShare,  // (held - live) / held, median over the steps after warm-up
  kExitLeak,            // bytes live at exit (start-up allocations excluded)
  kSuspects,            // number of growth leak suspects
  kOoms,                // out-of-memory events
  kMinSteps,            // steps recorded (a minimum)
};
inline constexpr int kMetricCount = 8;

// Which memory a figure covers: all kinds together, one kind (the report's
// kinds, in trace_format.h's order after kTotal), or one role (role_rules.h,
// in Role's order after the kinds).
enum class Scope : uint8_t {
  kTotal, kHost, kDevice, kManaged, kPinnedHost, kMapped,
  kParameter, kGradient, kOptimizerState, kActivation, kData, kWorkspace, kCommunication, kOther,
};
inline constexpr int kScopeCount = 14;
inline constexpr int kFirstRoleScope = static_cast<int>(Scope::kParameter);
inline bool is_role_scope(Scope scope) { return static_cast<int>(scope) >= kFirstRoleScope; }
// The role of a role scope (index in Role's order).
inline int scope_role(Scope scope) { return static_cast<int>(scope) - kFirstRoleScope; }

enum class Unit : uint8_t { kBytesPerStep, kBytes, kShare, kCount };

struct MetricInfo {
  Metric metric;
  const char* key;    // policy key: "max_growth_per_step"
  const char* flag;   // command-line flag: "--max-growth-per-step"
  const char* label;  // words in messages: "growth per step"
  Unit unit;
  unsigned scopes;    // bit (1 << Scope) for each scope the metric exists for
  bool baseline;      // compared against a baseline run
  double floor;       // absolute slack added to baseline comparisons (in the unit)
};

const MetricInfo& metric_info(Metric metric);
const char* scope_name(Scope scope);  // "total", "host", ..., "mapped", "parameter", ..., "other"
std::optional<Scope> scope_from_name(std::string_view name);

struct Limit {
  Metric metric = Metric::kGrowthPerStep;
  Scope scope = Scope::kTotal;
  double value = 0;
  std::string text;    // as written
  std::string origin;  // "--max-peak" or "ci.toml:4: device.max_peak"
};

struct Policy {
  std::vector<Limit> limits;
  std::optional<int> warmup_steps;
  std::string warmup_origin;
  std::optional<std::string> baseline;
  std::string baseline_origin;
  std::optional<double> tolerance;
  std::string tolerance_origin;
  std::optional<bool> allow_different_command;
  // [roles] rules (README, "Roles"): tried before the built-in ones.
  std::vector<RoleRule> role_rules;

  const Limit* find(Metric metric, Scope scope) const;
  // Adds a limit, replacing one for the same metric and scope.
  void set(Limit limit);
  // The limits in a stable order: by metric, then scope.
  std::vector<Limit> sorted_limits() const;
};

// Tolerance on baseline comparisons when none is given.
inline constexpr double kDefaultTolerance = 0.05;

// "4096", "4096B", "512KiB", "1.5 GiB", "10MB" (KB = 1000, KiB = 1024; units
// case-insensitive). With per_step, a "/step" suffix is allowed. Throws
// PolicyError naming `what` and the value.
double parse_size(std::string_view text, std::string_view what, bool per_step = false);
// "5%" or a fraction below 1 ("0.05").
double parse_tolerance(std::string_view text, std::string_view what);
// A share from 0 to 1: "30%" or "0.3".
double parse_share(std::string_view text, std::string_view what);
// A non-negative whole number.
uint64_t parse_count(std::string_view text, std::string_view what);

// A limit flag's value: "[KIND=]VALUE", e.g. "1MiB" or "device=256KiB".
Limit parse_limit_flag(Metric metric, std::string_view arg);

// A policy file's text (schema in README.md, "Policy files"; the same keys in
// both syntaxes). A relative baseline path is taken relative to base_dir.
// Throws PolicyError naming the file, line and key.
Policy parse_policy_toml(std::string_view text, const std::string& source_name, const std::string& base_dir);
Policy parse_policy_yaml(std::string_view text, const std::string& source_name, const std::string& base_dir);
// By extension: .toml, or .yaml / .yml.
Policy load_policy_file(const std::string& path);

// `over` wins: its limits replace the same metric and scope in `base`.
void merge_policy(Policy& base, const Policy& over);

// Contradictions that only show once everything is merged (a tolerance with
// no baseline). Throws PolicyError naming the key.
void validate_policy(const Policy& policy);

// Human-readable sizes with three significant digits: "512 B", "64.0 KiB",
// "1.50 GiB".
std::string format_size(double bytes);
std::string format_value(double value, Unit unit);

}  // namespace memledger::report
