#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "analysis.h"
#include "event_builder.h"
#include "growth.h"
#include "replay.h"
#include "sampling.h"

using namespace memledger::report;
using memledger::report::testing::EventBuilder;
namespace fmt = memledger::format;

TEST_CASE("sampling: a record stands for 1/p allocations and size/p bytes", "[sampling]") {
  const uint64_t interval = 128 * 1024;
  const SampleEstimate e = sampled_allocation(65536, interval);
  const double p = 1 - std::exp(-0.5);
  CHECK(e.count == Approx(1 / p));
  CHECK(e.bytes == Approx(65536 / p));
  CHECK(e.count_variance == Approx((1 - p) / (p * p)));
  // The recorder writes the weight (size / p); the size is found again from it.
  const SampleEstimate back = sampled_weight(static_cast<uint64_t>(std::llround(65536 / p)), interval);
  CHECK(back.count == Approx(1 / p).epsilon(1e-4));
  CHECK(back.bytes == Approx(65536 / p).epsilon(1e-4));
  // Allocations of the interval or more are recorded every time.
  const SampleEstimate big = sampled_allocation(200000, interval);
  CHECK(big.count == 1);
  CHECK(big.bytes == 200000);
  CHECK(big.bytes_variance == 0);
}

TEST_CASE("sampling: figures with their uncertainty, rounded to what is known", "[sampling]") {
  CHECK(bytes_with_error(65536, 12000) == "64 \u00b1 12 KiB");
  CHECK(bytes_with_error(66000, 1000) == "64.45 \u00b1 0.98 KiB");
  CHECK(bytes_with_error(3.2 * 1048576, 600 * 1024) == "3.20 \u00b1 0.59 MiB");
  CHECK(bytes_with_error(65536 + 300, 40 * 1024) == "64 \u00b1 40 KiB");
  CHECK(bytes_with_error(65536, 0) == "64.0 KiB");
  CHECK(number_with_error(1.04, 0.21) == "1.04 \u00b1 0.21");
  CHECK(number_with_error(1.0, 0) == "1.0");
}

namespace {

// One run of a loop that keeps a 64 KiB allocation per step, recorded as the
// recorder does in sampled mode (Poisson by bytes, mean interval 128 KiB),
// through the replay and growth stages: the suspect's figures.
LeakSuspect sampled_leak(std::mt19937_64& rng, size_t steps) {
  const uint64_t interval = 128 * 1024, size = 65536;
  const double p = -std::expm1(-double(size) / double(interval));
  Trace trace;
  trace.header["sample_interval"] = std::to_string(interval);
  EventBuilder b;
  std::bernoulli_distribution sampled(p);
  for (size_t k = 0; k < steps; ++k) {
    if (sampled(rng)) {
      b.alloc(0x100000 + k * 0x20000, static_cast<uint64_t>(std::llround(double(size) / p)), 7, 0,
              static_cast<uint8_t>(fmt::kAllocSampled | kAllocByChance));
    }
    b.step();
  }
  Replay replay(trace, true);
  replay.observe(b.events.data(), b.events.size());
  const ReplayOutput out = replay.finish();
  const Growth g = find_growth(out.sites, out.steps.size(), GrowthOptions{5, 20, false, interval});
  return g.suspects.empty() ? LeakSuspect{} : g.suspects.front();
}

}  // namespace

TEST_CASE("sampling: a sampled 64 KiB/step leak is estimated without bias, with its error", "[sampling]") {
  std::mt19937_64 rng(15);
  const int runs = 400;
  double bytes = 0, allocs = 0;
  int judged = 0, within_two_sigma = 0;
  for (int r = 0; r < runs; ++r) {
    const LeakSuspect s = sampled_leak(rng, 50);
    if (s.bytes_per_step == 0) continue;
    ++judged;
    REQUIRE(s.estimated);
    bytes += s.bytes_per_step;
    allocs += s.allocations_per_step;
    within_two_sigma += std::fabs(s.bytes_per_step - 65536) <= 2 * s.bytes_per_step_error;
  }
  REQUIRE(judged > runs * 9 / 10);
  // Unbiased: the mean over runs is within 3% (one run's own error is
  // about 18% at this interval, which the reported ± says).
  CHECK(bytes / judged == Approx(65536).epsilon(0.03));
  CHECK(allocs / judged == Approx(1.0).epsilon(0.03));
  CHECK(within_two_sigma > judged * 85 / 100);
}

TEST_CASE("peak phase: before the first step, in a step, or after the last one", "[sampling]") {
  // Steps of 10 ms each, the first ending 2 s in: it began at 1.99 s.
  std::vector<StepStats> steps(40);
  for (size_t k = 0; k < steps.size(); ++k) steps[k].end_ns = 2'000'000'000 + k * 10'000'000;
  CHECK(first_step_start_ns(steps) == 1'990'000'000);
  Peak peak;
  peak.step = 41;
  CHECK(peak_phase(peak, steps) == "after the last step");
  peak.step = 40;
  CHECK(peak_phase(peak, steps) == "in step 40");
  peak.step = 1;
  peak.ts_ns = 500'000'000;  // importing, building the model
  CHECK(peak_phase(peak, steps) == "before the first step");
  peak.ts_ns = 1'995'000'000;
  CHECK(peak_phase(peak, steps) == "in step 1");
  CHECK(peak_phase(peak, {}).empty());
  // One step: when it began cannot be told.
  steps.resize(1);
  peak.ts_ns = 0;
  CHECK(peak_phase(peak, steps) == "in step 1");
}

TEST_CASE("total growth per step: the figure check gates on", "[growth]") {
  std::vector<StepStats> steps(12);
  for (size_t k = 0; k < steps.size(); ++k) {
    steps[k].live[0] = static_cast<int64_t>(1000 + 100 * k);
    steps[k].live[1] = static_cast<int64_t>(50 * k);
  }
  const TotalGrowth g = total_growth(steps, 2);
  CHECK(g.judged);
  CHECK(g.per_step == Approx(150));
  CHECK(g.first_step == 3);
  CHECK(g.last_step == 12);
  CHECK_FALSE(total_growth(std::vector<StepStats>(4), 2).judged);
}
