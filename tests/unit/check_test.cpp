#include "check.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "analysis.h"
#include "policy.h"

using namespace memledger::report;
using nlohmann::json;

namespace {

// The message of the PolicyError that `fn` throws ("" when none).
template <typename Fn>
std::string policy_error(Fn fn) {
  try {
    fn();
  } catch (const PolicyError& e) {
    return e.what();
  }
  return "";
}

// A report (schema memledger-report) of one process whose host live bytes at
// step ends are `live`, as `memledger report --format json` writes it.
json synthetic_report(const std::vector<double>& live,
                      const std::vector<std::string>& command = {"train", "--epochs", "1"}) {
  json steps = json::array();
  for (size_t i = 0; i < live.size(); ++i) {
    steps.push_back({{"index", i + 1},
                     {"live", {{"host", live[i]}}},
                     {"held", {{"host", live[i] * 1.25}}},
                     {"rss", 0},
                     {"allocations", 10},
                     {"frees", 10}});
  }
  json suspect = {{"kind", "host"}, {"site", "grow at train.cpp:12"}, {"bytes_per_step", 0}};
  return {{"schema", "memledger-report"},
          {"schema_version", 1},
          {"run_command", command},
          {"pid", 42},
          {"root_pid", 42},
          {"command", "train"},
          {"warmup_steps", 3},
          {"steps", steps},
          {"leak_suspects", json::array({suspect})},
          {"exit_leaks", {{"bytes", 0}, {"count", 0}, {"sites", json::array()}}},
          {"peak", {{"bytes", live.empty() ? 0 : live.back()}, {"kind", "host"}}},
          {"verdict", {{"kind", "exit"}, {"summary", "clean exit (code 0)"}}}};
}

std::vector<double> linear(size_t n, double start, double per_step) {
  std::vector<double> out;
  for (size_t i = 0; i < n; ++i) out.push_back(start + per_step * static_cast<double>(i));
  return out;
}

Policy growth_policy(const std::string& limit) {
  Policy p;
  p.set(parse_limit_flag(Metric::kGrowthPerStep, limit));
  return p;
}

}  // namespace

TEST_CASE("sizes parse as people write them", "[check][policy]") {
  CHECK(parse_size("4096", "x") == 4096);
  CHECK(parse_size("4096B", "x") == 4096);
  CHECK(parse_size("512KiB", "x") == 512 * 1024);
  CHECK(parse_size("512 kib", "x") == 512 * 1024);
  CHECK(parse_size("1.5GiB", "x") == 1.5 * 1024 * 1024 * 1024);
  CHECK(parse_size("10MB", "x") == 10e6);
  CHECK(parse_size("2TiB", "x") == 2.0 * (1ull << 40));
  CHECK(parse_size("64KiB/step", "x", true) == 65536);
  CHECK(parse_size(".5KiB", "x") == 512);

  CHECK_THAT(policy_error([] { parse_size("12XB", "--max-peak"); }),
             Catch::StartsWith("--max-peak: '12XB' is not a size"));
  CHECK_THAT(policy_error([] { parse_size("-1MiB", "--max-peak"); }), Catch::Contains("'-1MiB' is negative"));
  CHECK_THAT(policy_error([] { parse_size("1e3", "x"); }), Catch::Contains("'1e3' is not a size"));
  CHECK_THAT(policy_error([] { parse_size("", "x"); }), Catch::Contains("'' is not a size"));
  CHECK_THAT(policy_error([] { parse_size("1.2.3MiB", "x"); }), Catch::Contains("not a size"));
  CHECK_THAT(policy_error([] { parse_size("1MiB/step", "--max-peak"); }), Catch::Contains("'1MiB/step' is not a size"));
  CHECK_THAT(policy_error([] { parse_size("99999999999TiB", "x"); }), Catch::Contains("too large"));
}

TEST_CASE("tolerances, shares and counts", "[check][policy]") {
  CHECK(parse_tolerance("5%", "t") == Approx(0.05));
  CHECK(parse_tolerance("0.05", "t") == Approx(0.05));
  CHECK(parse_tolerance("0%", "t") == 0);
  CHECK_THAT(policy_error([] { parse_tolerance("5", "--tolerance"); }),
             Catch::Contains("--tolerance: '5' is ambiguous"));
  CHECK_THAT(policy_error([] { parse_tolerance("-5%", "--tolerance"); }), Catch::Contains("negative"));
  CHECK_THAT(policy_error([] { parse_tolerance("five", "--tolerance"); }),
             Catch::Contains("'five' is not a tolerance"));

  CHECK(parse_share("30%", "s") == Approx(0.3));
  CHECK(parse_share("0.3", "s") == Approx(0.3));
  CHECK_THAT(policy_error([] { parse_share("130%", "s"); }), Catch::Contains("more than 100%"));

  CHECK(parse_count("0", "c") == 0);
  CHECK(parse_count("17", "c") == 17);
  CHECK_THAT(policy_error([] { parse_count("1.5", "--max-suspects"); }),
             Catch::Contains("--max-suspects: '1.5' is not a whole number"));
}

TEST_CASE("limit flags take a memory kind", "[check][policy]") {
  const Limit total = parse_limit_flag(Metric::kGrowthPerStep, "1MiB");
  CHECK(total.scope == Scope::kTotal);
  CHECK(total.value == 1 << 20);
  CHECK(total.origin == "--max-growth-per-step");

  const Limit device = parse_limit_flag(Metric::kPeak, "device=2GiB");
  CHECK(device.scope == Scope::kDevice);
  CHECK(device.value == 2.0 * (1 << 30));

  CHECK_THAT(policy_error([] { parse_limit_flag(Metric::kPeak, "gpu=1MiB"); }),
             Catch::Contains("unknown memory kind or role 'gpu'"));
  CHECK_THAT(policy_error([] { parse_limit_flag(Metric::kHeld, "managed=1MiB"); }),
             Catch::Contains("no peak held figure exists for managed memory"));
  CHECK_THAT(policy_error([] { parse_limit_flag(Metric::kOoms, "host=1"); }), Catch::Contains("--max-ooms"));
}

TEST_CASE("TOML and YAML policies read the same", "[check][policy]") {
  const std::string toml = R"(
warmup_steps = 4
max_growth_per_step = "16KiB"
max_exit_leak = 1048576
tolerance = "2%"
baseline = "runs/main"

[device]
max_peak = "1.5GiB"
max_fragmentation_share = 0.4
)";
  const std::string yaml = R"(
# the same limits
warmup_steps: 4
max_growth_per_step: 16KiB
max_exit_leak: 1048576
tolerance: 2%
baseline: runs/main
device:
  max_peak: "1.5GiB"
  max_fragmentation_share: 0.4
)";
  for (const Policy& p : {parse_policy_toml(toml, "ci.toml", "/ci"), parse_policy_yaml(yaml, "ci.yaml", "/ci")}) {
    CHECK(p.warmup_steps == 4);
    CHECK(p.tolerance.value() == Approx(0.02));
    CHECK(p.baseline.value() == "/ci/runs/main");
    REQUIRE(p.limits.size() == 4);
    CHECK(p.find(Metric::kGrowthPerStep, Scope::kTotal)->value == 16384);
    CHECK(p.find(Metric::kExitLeak, Scope::kTotal)->value == 1048576);
    CHECK(p.find(Metric::kPeak, Scope::kDevice)->value == 1.5 * (1 << 30));
    CHECK(p.find(Metric::kFragmentationShare, Scope::kDevice)->value == Approx(0.4));
  }
  CHECK_THAT(parse_policy_toml(toml, "ci.toml", "").find(Metric::kPeak, Scope::kDevice)->origin,
             Catch::Equals("ci.toml:9: device.max_peak"));
  CHECK_THAT(parse_policy_yaml(yaml, "ci.yaml", "").find(Metric::kPeak, Scope::kDevice)->origin,
             Catch::Equals("ci.yaml:9: device.max_peak"));
}

TEST_CASE("bad policy files name the file, line and key", "[check][policy]") {
  auto toml_error = [](const std::string& text) {
    return policy_error([&] { parse_policy_toml(text, "p.toml", ""); });
  };
  auto yaml_error = [](const std::string& text) {
    return policy_error([&] { parse_policy_yaml(text, "p.yaml", ""); });
  };
  CHECK_THAT(toml_error("max_peak = \"1GiB\"\nmax_gruth = 3\n"),
             Catch::StartsWith("p.toml:2: max_gruth: unknown key 'max_gruth'"));
  CHECK_THAT(yaml_error("max_peak: 1GiB\nmax_gruth: 3\n"),
             Catch::StartsWith("p.yaml:2: max_gruth: unknown key 'max_gruth'"));
  CHECK_THAT(toml_error("max_peak = \"1GiB\"\nmax_peak = \"2GiB\"\n"), Catch::StartsWith("p.toml:2:"));
  CHECK_THAT(toml_error("max_peak = \"1GiB\"\nmax_peak = \"2GiB\"\n"), Catch::Contains("max_peak"));
  CHECK_THAT(yaml_error("max_peak: 1GiB\nmax_peak: 2GiB\n"),
             Catch::Equals("p.yaml:2: max_peak: given twice (first on line 1)"));
  CHECK_THAT(toml_error("max_peak = \"12XB\"\n"), Catch::Equals("p.toml:1: max_peak: '12XB' is not a size (write e.g. "
                                                                "4096, 512KiB, 1.5GiB; units B, KB/KiB, MB/MiB, "
                                                                "GB/GiB, TB/TiB)"));
  CHECK_THAT(yaml_error("host:\n  max_peak: 12XB\n"),
             Catch::StartsWith("p.yaml:2: host.max_peak: '12XB' is not a size"));
  CHECK_THAT(toml_error("[gpu]\nmax_peak = 1\n"), Catch::Contains("unknown memory kind or role 'gpu'"));
  CHECK_THAT(toml_error("[host]\nmax_ooms = 1\n"), Catch::StartsWith("p.toml:2: host.max_ooms: no OOM events figure"));
  CHECK_THAT(yaml_error("device:\n  tolerance: 5%\n"), Catch::Contains("'tolerance' is not a per-kind setting"));
  CHECK_THAT(toml_error("max_peak = true\n"), Catch::Contains("max_peak: expected a size"));
  CHECK_THAT(yaml_error("max_peak: [1, 2]\n"),
             Catch::Contains("max_peak: expected a size such as \"1.5GiB\" or a number "
                             "of bytes, not a list"));
  CHECK_THAT(toml_error("max_peak = -3\n"), Catch::Contains("'-3' is negative"));
  CHECK_THAT(toml_error("max_suspects = 1.5\n"), Catch::Contains("max_suspects: expected a whole number, not 1.5"));
  CHECK_THAT(toml_error("warmup_steps = \"3\"\n"), Catch::Contains("warmup_steps: expected a whole number of steps"));
  CHECK_THAT(yaml_error("allow_different_command: yes\n"),
             Catch::Contains("allow_different_command: expected true or false, not the string \"yes\""));
  CHECK_THAT(toml_error("max_peak = \n"), Catch::Contains("not valid TOML"));
  CHECK_THAT(yaml_error("max_peak: 1GiB\n  bad: indent\n"), Catch::StartsWith("p.yaml:2: not valid YAML"));
  CHECK_THAT(yaml_error("- max_peak\n"), Catch::Contains("not a list"));
  // An empty file is an empty policy (main then says no limits were given).
  CHECK(parse_policy_yaml("", "p.yaml", "").limits.empty());
  CHECK(parse_policy_toml("", "p.toml", "").limits.empty());
}

TEST_CASE("flags override the policy file; contradictions are errors", "[check][policy]") {
  Policy file =
      parse_policy_toml("max_peak = \"1GiB\"\nwarmup_steps = 2\n[host]\nmax_peak = \"512MiB\"\n", "p.toml", "");
  Policy flags;
  flags.set(parse_limit_flag(Metric::kPeak, "2GiB"));
  merge_policy(file, flags);
  CHECK(file.find(Metric::kPeak, Scope::kTotal)->value == 2.0 * (1 << 30));
  CHECK(file.find(Metric::kPeak, Scope::kTotal)->origin == "--max-peak");
  CHECK(file.find(Metric::kPeak, Scope::kHost)->value == 512.0 * (1 << 20));
  CHECK(file.warmup_steps == 2);

  Policy tolerance_alone = parse_policy_toml("tolerance = \"5%\"\n", "p.toml", "");
  CHECK_THAT(policy_error([&] { validate_policy(tolerance_alone); }),
             Catch::StartsWith("p.toml:1: tolerance: a tolerance needs a baseline"));
}

TEST_CASE("growth is a robust fit over the steps after warm-up", "[check][fit]") {
  SECTION("a steady leak is measured exactly") {
    const GrowthFit fit = fit_growth(linear(30, 1000, 4096), 3);
    REQUIRE(fit.judged);
    CHECK(fit.slope == Approx(4096));
    CHECK(fit.first_step == 4);
    CHECK(fit.last_step == 30);
    CHECK_FALSE(fit.plateau);
  }
  SECTION("too few steps after warm-up are not judged") {
    CHECK_FALSE(fit_growth(linear(5, 0, 1), 3).judged);
    CHECK(fit_growth(linear(6, 0, 1), 3).judged);
  }
  SECTION("a warm-up longer than the warm-up steps, then allocator noise: no growth") {
    // A cache fills 1 MiB a step for 10 steps, then stays; on top of it an
    // allocator keeps a random 0-256 KiB at each step end.
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> noise(0, 256 << 10);
    std::vector<double> live;
    for (int i = 0; i < 40; ++i) live.push_back(std::min(i + 1, 10) * double(1 << 20) + noise(rng));
    const GrowthFit fit = fit_growth(live, 3);
    REQUIRE(fit.judged);
    CHECK(fit.plateau);
    CHECK(std::fabs(fit.slope) < 16 << 10);
    // A least-squares line through the same window sees the warm-up as growth.
    const std::vector<double> window(live.begin() + 3, live.end());
    CHECK(fit_line(window).slope > 64 << 10);
  }
  SECTION("a leak under noise is still found") {
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> noise(0, 256 << 10);
    std::vector<double> live;
    for (int i = 0; i < 40; ++i) live.push_back(i * double(64 << 10) + noise(rng));
    const GrowthFit fit = fit_growth(live, 3);
    CHECK(fit.slope == Approx(64 << 10).epsilon(0.3));
  }
  SECTION("one outlying step does not move the fit") {
    std::vector<double> live = linear(30, 0, 1000);
    live[29] += 100 << 20;  // the last step ends during a checkpoint
    live[15] += 50 << 20;
    CHECK(fit_growth(live, 3).slope == Approx(1000));
    CHECK(fit_line(std::vector<double>(live.begin() + 3, live.end())).slope > 256 << 10);
  }
  SECTION("a flat series") {
    const GrowthFit fit = fit_growth(std::vector<double>(20, 5000), 2);
    CHECK(fit.slope == 0);
    CHECK(fit.flat);
  }
  SECTION("long series are thinned, not refused") {
    const GrowthFit fit = fit_growth(linear(5000, 0, 100), 10);
    CHECK(fit.slope == Approx(100));
  }
}

TEST_CASE("check judges a run by its limits", "[check]") {
  const RunData leaking = run_data_from_json(synthetic_report(linear(30, 1 << 20, 64 << 10)), "leaking", "report JSON");
  const RunData clean = run_data_from_json(synthetic_report(std::vector<double>(30, 1 << 20)), "clean", "report JSON");

  const CheckOutcome fail = run_check(leaking, nullptr, growth_policy("16KiB"));
  REQUIRE(fail.items.size() == 1);
  CHECK_FALSE(fail.passed());
  CHECK_THAT(fail.items[0].message(),
             Catch::StartsWith("64.0 KiB/step > limit 16.0 KiB/step (fit over steps 4-30, R\u00b2 1.00)"));
  CHECK_THAT(fail.items[0].message(), Catch::EndsWith("; top suspect: grow at train.cpp:12"));
  CHECK_THAT(render_check_text(fail, true), Catch::StartsWith("FAIL growth per step (total): 64.0 KiB/step > limit"));

  const CheckOutcome pass = run_check(clean, nullptr, growth_policy("16KiB"));
  CHECK(pass.passed());
  CHECK_THAT(pass.items[0].message(), Catch::Equals("0 B/step <= limit 16.0 KiB/step (fit over steps 4-30, flat)"));

  SECTION("a sampled estimate that drifts by a fraction of a byte a step is zero growth") {
    std::vector<double> live(30, 1 << 20);
    for (size_t i = 0; i < live.size(); ++i) live[i] += (i % 3 == 0 ? 0.0 : 1.0) + 0.01 * static_cast<double>(i);
    const RunData jitter = run_data_from_json(synthetic_report(live), "jitter", "report JSON");
    REQUIRE(fit_growth(live, 3).slope > 0);
    const CheckOutcome o = run_check(jitter, nullptr, growth_policy("0"));
    CHECK(o.passed());
    CHECK_THAT(o.items[0].message(), Catch::StartsWith("0 B/step <= limit 0 B/step"));
    const CheckOutcome a_byte = run_check(run_data_from_json(synthetic_report(linear(30, 1 << 20, 1)), "byte", "report JSON"),
                                          nullptr, growth_policy("0"));
    CHECK_FALSE(a_byte.passed());
  }
  SECTION("too few steps is a failure that says why") {
    const RunData short_run = run_data_from_json(synthetic_report(linear(4, 0, 1)), "short", "report JSON");
    const CheckOutcome o = run_check(short_run, nullptr, growth_policy("16KiB"));
    CHECK_FALSE(o.passed());
    CHECK_THAT(o.items[0].message(), Catch::Contains("not judged: only 4 steps with 3 warm-up steps"));
  }
  SECTION("the JSON verdict") {
    const json v = render_check_json(fail);
    CHECK(v["schema"] == "memledger-check");
    CHECK(v["passed"] == false);
    CHECK(v["exit_code"] == 1);
    CHECK(v["checks"][0]["id"] == "growth_per_step.total");
    CHECK(v["checks"][0]["figure"] == Approx(65536));
    CHECK(v["checks"][0]["fit"]["method"] == "theil_sen");
    CHECK(v["checks"][0]["site"]["name"] == "grow at train.cpp:12");
  }
  SECTION("Markdown") {
    const std::string md = render_check_markdown(fail);
    CHECK_THAT(md, Catch::StartsWith("### memledger check: failed"));
    CHECK_THAT(md, Catch::Contains("| **FAIL** | growth per step (total) | 64.0 KiB/step | 16.0 KiB/step |"));
  }
}

TEST_CASE("a role's growth that a sampled report judged sampling noise passes as the report says", "[check]") {
  // Activations gain a sample's worth now and then: about 29 KiB/step.
  const std::vector<double> live(20, 4 << 20);
  json report = synthetic_report(live);
  for (size_t i = 0; i < live.size(); ++i) {
    report["steps"][i]["roles"] = {{"activation", 550000 + 131072 * static_cast<double>(i / 4)}, {"other", 3644304}};
  }
  report["roles"] = {{"estimated", true}, {"growing", json::array()}};
  Policy policy;
  policy.set(parse_limit_flag(Metric::kGrowthPerStep, "activation=0"));
  const CheckOutcome noise = run_check(run_data_from_json(report, "noise", "report JSON"), nullptr, policy);
  REQUIRE(noise.items.size() == 1);
  CHECK(noise.passed());
  CHECK_THAT(noise.items[0].message(), Catch::StartsWith("0 B/step <= limit 0 B/step"));
  CHECK_THAT(noise.items[0].message(), Catch::Contains("is sampling noise: no growth suspect has this role"));
  CHECK(render_check_json(noise)["checks"][0]["fit"]["sampling_noise_estimate"].get<double>() > 20000);
  SECTION("listed as growing by the report: judged on its slope") {
    report["roles"]["growing"] = json::array({{{"role", "activation"}, {"bytes_per_step", 29127}}});
    CHECK_FALSE(run_check(run_data_from_json(report, "grows", "report JSON"), nullptr, policy).passed());
  }
  SECTION("exact counts (full host mode): judged on its slope") {
    report["roles"]["estimated"] = false;
    CHECK_FALSE(run_check(run_data_from_json(report, "exact", "report JSON"), nullptr, policy).passed());
  }
}

TEST_CASE("baselines: 10% more growth fails, 1% passes", "[check]") {
  const RunData base = run_data_from_json(synthetic_report(linear(30, 0, 1 << 20)), "base", "report JSON");
  const RunData worse = run_data_from_json(synthetic_report(linear(30, 0, 1.10 * (1 << 20))), "worse", "report JSON");
  const RunData same = run_data_from_json(synthetic_report(linear(30, 0, 1.01 * (1 << 20))), "same", "report JSON");
  Policy p;
  p.baseline = "base";
  p.tolerance = 0.05;
  auto growth_item = [](const CheckOutcome& o) {
    for (const CheckItem& i : o.items) {
      if (i.metric == Metric::kGrowthPerStep && i.scope == Scope::kTotal && i.vs_baseline) return i;
    }
    FAIL("no growth item");
    return CheckItem{};
  };
  const CheckItem bad = growth_item(run_check(worse, &base, p));
  CHECK_FALSE(bad.passed);
  CHECK_THAT(bad.message(), Catch::StartsWith("1.10 MiB/step > limit 1.05 MiB/step (baseline 1.00 MiB/step, +10.0%; "
                                              "tolerance 5% + 4.00 KiB/step"));
  CHECK(growth_item(run_check(same, &base, p)).passed);
  CHECK(run_check(same, &base, p).passed());
}

TEST_CASE("command lines are compared argument by argument", "[check]") {
  CHECK(same_command({"/a/train", "--lr", "1"}, {"./train", "--lr", "1"}));
  CHECK_FALSE(same_command({"train", "--lr", "1"}, {"train", "--lr", "2"}));
  CHECK(command_difference({"train", "--lr", "2"}, {"train", "--lr", "1"}) ==
        "argument 2 is '2' here and '1' in the baseline");
  CHECK(command_difference({"train"}, {"eval"}) == "the program is 'train' here and 'eval' in the baseline");
  CHECK(command_difference({"train", "-v"}, {"train"}) == "this run has an extra argument '-v'");
  CHECK(command_difference({"train"}, {"train"}).empty());
}

TEST_CASE("inputs that are not reports are refused", "[check]") {
  CHECK_THROWS_AS(run_data_from_json(json::array(), "x.json", "report JSON"), InputError);
  CHECK_THROWS_WITH(run_data_from_json(json{{"schema", "memledger-check"}}, "v.json", "report JSON"),
                    Catch::Contains("v.json: not a memledger report (schema 'memledger-check'"));
  CHECK_THROWS_WITH(run_data_from_json(json{{"schema", "memledger-report"}, {"schema_version", 99}}, "r.json", "r"),
                    Catch::Contains("schema_version 99 is newer"));
}

TEST_CASE("XML escaping keeps JUnit well-formed", "[check]") {
  CHECK(xml_escape("a<b>&\"c'") == "a&lt;b&gt;&amp;&quot;c&apos;");
  CHECK(xml_escape(std::string("x\x01y\n", 4)) == "x?y&#10;");
}

TEST_CASE("sizes print with three significant digits", "[check]") {
  CHECK(format_size(512) == "512 B");
  CHECK(format_size(65536) == "64.0 KiB");
  CHECK(format_size(1.5 * (1 << 30)) == "1.50 GiB");
  CHECK(format_size(-2048) == "-2.00 KiB");
  CHECK(format_value(0.438, Unit::kShare) == "43.8%");
}
