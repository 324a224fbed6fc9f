#include "check_command.h"

#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <utility>

#include "check.h"
#include "file_io.h"
#include "policy.h"

namespace memledger::tools {

using report::InputError;
using report::Metric;
using report::PolicyError;

const char* const kCheckUsage = MEMLEDGER_CHECK_USAGE;

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(1, word.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    // Levenshtein distance, one row at a time.
    std::vector<size_t> row(candidate.size() + 1);
    for (size_t j = 0; j <= candidate.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= candidate.size(); ++j) {
        const size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (word[i - 1] == candidate[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    if (row[candidate.size()] < best_distance) {
      best_distance = row[candidate.size()];
      best = candidate;
    }
  }
  return best;
}

std::string unknown_option(const char* given, const struct option* options) {
  std::vector<std::string> names;
  for (const struct option* o = options; o->name; ++o) names.push_back(std::string("--") + o->name);
  std::string word = given;
  if (size_t eq = word.find('='); eq != std::string::npos) word.resize(eq);
  std::string message = std::string("unknown option ") + given;
  const std::string near = nearest(word, names);
  if (!near.empty()) message += "; did you mean " + near + "?";
  return message;
}

namespace {

constexpr int kExitBroken = 1;
constexpr int kExitUsage = 2;

int fail(const char* command, const std::string& message) {
  std::fprintf(stderr, "memledger: %s: %s\n", command, message.c_str());
  return kExitUsage;
}

// One line: the whole help would bury the message that matters.
int usage(const char* command, const std::string& message) {
  std::fprintf(stderr, "memledger: %s: %s (memledger %s --help)\n", command, message.c_str(), command);
  return kExitUsage;
}

// The file's folder exists and takes new files (or the file exists and is
// writable); nothing is created.
bool writable_place(const std::string& path, std::string& error) {
  if (access(path.c_str(), F_OK) == 0) {
    if (access(path.c_str(), W_OK) == 0) return true;
    error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (access(dir.c_str(), W_OK | X_OK) == 0) return true;
  error = "cannot write " + path + ": " + std::strerror(errno);
  return false;
}

std::string local_timestamp() {
  const time_t now = time(nullptr);
  struct tm tm;
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

int parse_warmup(const char* command, const char* text, int& out) {
  try {
    const uint64_t n = report::parse_count(text, "--warmup-steps");
    if (n > 100000) throw PolicyError(std::string("--warmup-steps: '") + text + "' is too many steps");
    out = static_cast<int>(n);
    return 0;
  } catch (const PolicyError& e) {
    return fail(command, e.what());
  }
}

const char* missing_value_option(int argc, char** argv) {
  // getopt_long leaves the option without its value at argv[optind - 1].
  return optind - 1 < argc && optind >= 1 ? argv[optind - 1] : "option";
}

}  // namespace

namespace {

int check_main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  enum : int {
    kGrowth = 1000,
    kPeak,
    kHeld,
    kFragmentation,
    kExitLeak,
    kSuspects,
    kOoms,
    kMinSteps,
    kWarmup,
    kPolicy,
    kBaseline,
    kTolerance,
    kAllowDifferent,
    kJunit,
    kJson,
    kMarkdown,
    kDebugDir,
  };
  static const option long_options[] = {
      {"max-growth-per-step", required_argument, nullptr, kGrowth},
      {"max-peak", required_argument, nullptr, kPeak},
      {"max-held", required_argument, nullptr, kHeld},
      {"max-fragmentation-share", required_argument, nullptr, kFragmentation},
      {"max-exit-leak", required_argument, nullptr, kExitLeak},
      {"max-suspects", required_argument, nullptr, kSuspects},
      {"max-ooms", required_argument, nullptr, kOoms},
      {"min-steps", required_argument, nullptr, kMinSteps},
      {"warmup-steps", required_argument, nullptr, kWarmup},
      {"policy", required_argument, nullptr, kPolicy},
      {"baseline", required_argument, nullptr, kBaseline},
      {"tolerance", required_argument, nullptr, kTolerance},
      {"allow-different-command", no_argument, nullptr, kAllowDifferent},
      {"junit", required_argument, nullptr, kJunit},
      {"json", required_argument, nullptr, kJson},
      {"markdown", required_argument, nullptr, kMarkdown},
      {"debug-dir", required_argument, nullptr, kDebugDir},
      {"quiet", no_argument, nullptr, 'q'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  report::Policy flags;
  std::map<std::pair<Metric, report::Scope>, std::string> given;  // limit flags seen, to catch contradictions
  std::string policy_file, junit_file, json_file, markdown_file;
  report::LoadOptions load;
  bool quiet = false;
  optind = 1;
  opterr = 0;
  int c;
  try {
    while ((c = getopt_long(argc, argv, ":qh", long_options, nullptr)) != -1) {
      switch (c) {
        case kGrowth:
        case kPeak:
        case kHeld:
        case kFragmentation:
        case kExitLeak:
        case kSuspects:
        case kOoms:
        case kMinSteps: {
          report::Limit limit = report::parse_limit_flag(static_cast<Metric>(c - kGrowth), optarg);
          const auto key = std::pair(limit.metric, limit.scope);
          if (auto it = given.find(key); it != given.end() && it->second != limit.text) {
            throw PolicyError(limit.origin + ": given twice with different values ('" + it->second + "' and '" +
                              limit.text + "')");
          }
          given[key] = limit.text;
          flags.set(std::move(limit));
          break;
        }
        case kWarmup: {
          int n = 0;
          if (int rc = parse_warmup("check", optarg, n)) return rc;
          flags.warmup_steps = n;
          flags.warmup_origin = "--warmup-steps";
          break;
        }
        case kPolicy: policy_file = optarg; break;
        case kBaseline:
          if (*optarg == '\0') throw PolicyError("--baseline: an empty path");
          flags.baseline = optarg;
          flags.baseline_origin = "--baseline";
          break;
        case kTolerance:
          flags.tolerance = report::parse_tolerance(optarg, "--tolerance");
          flags.tolerance_origin = "--tolerance";
          break;
        case kAllowDifferent: flags.allow_different_command = true; break;
        case kJunit: junit_file = optarg; break;
        case kJson: json_file = optarg; break;
        case kMarkdown: markdown_file = optarg; break;
        case kDebugDir: load.symbolizer.debug_dirs.emplace_back(optarg); break;
        case 'q': quiet = true; break;
        case 'h': std::fputs(kCheckUsage, stdout); return 0;
        case ':': return usage("check", std::string("option ") + missing_value_option(argc, argv) + " needs a value");
        default: return usage("check", unknown_option(argv[optind - 1], long_options));
      }
    }
  } catch (const PolicyError& e) {
    return fail("check", e.what());
  }
  if (optind == argc) return usage("check", "give the RUN to check (a run folder, a trace or a report JSON)");
  if (argc - optind > 1) return usage("check", std::string("one RUN at a time; also got '") + argv[optind + 1] + "'");
  const std::string run_path = argv[optind];

  report::Policy policy;
  try {
    if (!policy_file.empty()) policy = report::load_policy_file(policy_file);
    report::merge_policy(policy, flags);
    report::validate_policy(policy);
  } catch (const PolicyError& e) {
    return fail("check", e.what());
  }
  if (policy.limits.empty() && !policy.baseline) {
    return usage("check", "no limits given: use --max-growth-per-step and the other limits, --policy FILE, or "
                          "--baseline RUN_OR_JSON");
  }
  load.warmup_steps = policy.warmup_steps.value_or(-1);
  load.role_rules = policy.role_rules;
  // A verdict file that cannot be written is found now, before the run is read.
  for (const auto& [flag, file] : {std::pair("--junit", &junit_file), std::pair("--json", &json_file),
                                   std::pair("--markdown", &markdown_file)}) {
    std::string error;
    if (!file->empty() && !writable_place(*file, error)) return fail("check", std::string(flag) + ": " + error);
  }

  report::RunData run, baseline;
  try {
    run = report::load_run_data(run_path, load);
    if (policy.baseline) {
      try {
        baseline = report::load_run_data(*policy.baseline, load);
      } catch (const InputError& e) {
        throw InputError(std::string("baseline (") + policy.baseline_origin + "): " + e.what());
      }
      if (!policy.allow_different_command.value_or(false) && !report::same_command(run.command, baseline.command)) {
        throw InputError("the baseline ran another command: " +
                         report::command_difference(run.command, baseline.command) + " (baseline '" +
                         report::command_text(baseline.command) + "', this run '" + report::command_text(run.command) +
                         "'; --allow-different-command to compare anyway)");
      }
    }
  } catch (const InputError& e) {
    return fail("check", e.what());
  }

  const report::CheckOutcome outcome = report::run_check(run, policy.baseline ? &baseline : nullptr, policy);
  const std::string text = report::render_check_text(outcome, quiet);
  if (std::string error; !report::write_stream(stdout, text, error)) return fail("check", error);

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string error;
  if (!junit_file.empty() &&
      !report::write_user_file(junit_file, report::render_check_junit(outcome, local_timestamp(), host_name(), seconds), error)) {
    return fail("check", "--junit: " + error);
  }
  if (!json_file.empty() && !report::write_user_file(json_file, report::render_check_json(outcome).dump(2) + "\n", error)) {
    return fail("check", "--json: " + error);
  }
  if (!markdown_file.empty() && !report::write_user_file(markdown_file, report::render_check_markdown(outcome), error)) {
    return fail("check", "--markdown: " + error);
  }
  return outcome.passed() ? 0 : kExitBroken;
}

}  // namespace

int cmd_check(int argc, char** argv) {
  // Exit 1 means "a limit is broken" to CI: nothing else may end with it.
  try {
    return check_main(argc, argv);
  } catch (const std::exception& e) {
    return fail("check", std::string("internal error: ") + e.what());
  }
}

int cmd_diff(int argc, char** argv) {
  enum : int { kFormat = 1000, kWarmup, kMaxSites, kAllSteps, kDebugDir };
  static const option long_options[] = {
      {"format", required_argument, nullptr, kFormat},
      {"output", required_argument, nullptr, 'o'},
      {"warmup-steps", required_argument, nullptr, kWarmup},
      {"max-sites", required_argument, nullptr, kMaxSites},
      {"all-steps", no_argument, nullptr, kAllSteps},
      {"debug-dir", required_argument, nullptr, kDebugDir},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  std::string format = "text", output;
  int warmup = -1;
  size_t max_sites = 10;
  size_t max_rows = 40;
  report::LoadOptions load;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":o:h", long_options, nullptr)) != -1) {
    switch (c) {
      case kFormat:
        format = optarg;
        if (format != "text" && format != "json") {
          return usage("diff", "--format must be text or json, not '" + format + "'");
        }
        break;
      case 'o': output = optarg; break;
      case kWarmup:
        if (int rc = parse_warmup("diff", optarg, warmup)) return rc;
        break;
      case kMaxSites:
        try {
          max_sites = report::parse_count(optarg, "--max-sites");
        } catch (const PolicyError& e) {
          return fail("diff", e.what());
        }
        break;
      case kAllSteps: max_rows = 0; break;
      case kDebugDir: load.symbolizer.debug_dirs.emplace_back(optarg); break;
      case 'h': std::fputs(kCheckUsage, stdout); return 0;
      case ':': return usage("diff", std::string("option ") + missing_value_option(argc, argv) + " needs a value");
      default: return usage("diff", unknown_option(argv[optind - 1], long_options));
    }
  }
  if (argc - optind != 2) {
    return usage("diff", "give two runs: memledger diff A B (run folders, traces or report JSON)");
  }
  load.warmup_steps = warmup;
  report::RunData a, b;
  try {
    a = report::load_run_data(argv[optind], load);
    b = report::load_run_data(argv[optind + 1], load);
  } catch (const InputError& e) {
    return fail("diff", e.what());
  }
  const nlohmann::json diff = report::diff_runs(a, b, warmup, max_sites);
  const std::string text = format == "json" ? diff.dump(2) + "\n" : report::render_diff_text(diff, max_rows);
  std::string error;
  if (output.empty() || output == "-") return report::write_stream(stdout, text, error) ? 0 : fail("diff", error);
  if (!report::write_user_file(output, text, error)) return fail("diff", error);
  return 0;
}

}  // namespace memledger::tools
