// Stage "growth": the sites whose live bytes keep rising from step to step
// after the warm-up (DESIGN.md, "Growth leak suspect").
//
// In:  the replay's site accumulators (each site's live bytes and
//      cumulative allocations at the step ends where they changed) and the
//      number of steps.
// Out: the suspects, steepest first: bytes per step from a least-squares
//      fit, its r², the share of step-to-step changes that are not
//      decreases, the first step that grew, allocations per step, the dense
//      series; or, when growth cannot be judged, why (too few steps, none).
//
// A site must grow over the window, steadily (monotone share, at least
// three rises, a positive Theil-Sen slope) and still in its last third (a
// cache that fills up and stops is not a leak). The stacks made under one
// line of the program are judged together as well (GrowthOptions::line_of):
// when their sum grows steadily, each of them that rose is a suspect, even
// where none grows steadily alone. Suspects' sites are unnamed (stack id
// and kind).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis.h"
#include "replay.h"

namespace memledger::report {

struct GrowthOptions {
  int warmup_steps = -1;  // -1: automatic (a tenth of the steps, at least 1, at most 10)
  size_t max_suspects = 20;
  // Sampled host mode: one sampled allocation weighs about this much, so a
  // host site must gain several of it to be more than sampling noise.
  bool sampled = false;
  uint64_t sample_interval = 0;
  // What a site must gain over the window after the warm-up to be judged at
  // all. Steps found without markers (auto) take kMinAutoStepGrowth: their
  // boundaries are inferred, and a lazily filled library cache that gains a
  // few hundred bytes now and then is not the loop's growth.
  uint64_t min_growth = 1024;
  // The program line a site was made under (empty: none known): sites of
  // one line are also judged together, their live bytes summed, and when
  // the sum grows steadily each of them that rose is a suspect.
  std::function<std::string(const SiteAcc&)> line_of = nullptr;
};

inline constexpr uint64_t kMinAutoStepGrowth = 16 << 10;

struct Growth {
  int warmup_steps = 0;
  std::vector<LeakSuspect> suspects;  // steepest first, at most max_suspects
  std::string note;  // why growth could not be judged (empty when it was)
};

Growth find_growth(const SiteAccs& sites, size_t steps, const GrowthOptions& options);

// The growth of the live total (every kind) per step after `warmup_steps`,
// as `memledger check` computes it.
TotalGrowth total_growth(const std::vector<StepStats>& steps, int warmup_steps);

}  // namespace memledger::report
