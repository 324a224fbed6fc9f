// Stage "leaks at exit": what was still allocated when the process ended
// (DESIGN.md, "Exit leak"), and the live sets by site that flame graphs and
// the pprof export show.
//
// In:  the replay's live set at the end, its site accumulators (with each
//      site's share of the peak), whether the trace has steps, and the
//      mean sample interval when host allocations were sampled.
// Out: the exit leaks by site, largest first, apart from the start-up
//      allocations (made before the first step ended and never freed:
//      one-off globals), each with its total bytes and count (in sampled
//      mode, the estimated number of allocations, not of samples); the live set
//      by site at the peak and at the end. Sites are unnamed (stack id and
//      kind).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "analysis.h"
#include "replay.h"

namespace memledger::report {

struct ExitLeaks {
  std::vector<SiteTotal> leaks;  // largest first, at most max_sites
  int64_t leak_bytes = 0;        // of every site, listed or not
  uint64_t leak_count = 0;
  double leak_bytes_error = 0;   // sampled mode: one standard deviation of leak_bytes
  std::vector<SiteTotal> startup;
  int64_t startup_bytes = 0;
  uint64_t startup_count = 0;
  double startup_bytes_error = 0;
  bool counts_estimated = false;  // some counts stand for sampled allocations
  // Sampled mode: the sampled host allocations live at the end stood for
  // `scaled_from` bytes, more than the `scaled_to` that the exact total
  // leaves them; their estimates were scaled down to it. 0 when not.
  int64_t scaled_from = 0, scaled_to = 0;
};

// sample_interval: the mean bytes between samples of a sampled trace, 0
// when every allocation was recorded.
// Start-up is what the first step allocated. A process whose steps are time
// windows, or that has none, has no first step that sets start-up apart:
// there, `made_by_import` (a site's stack) tells start-up, and everything
// else still live at exit is a leak.
// In sampled mode, where the replay knows the host's exact live bytes at the
// end, the sampled allocations' estimates are scaled down when they add up
// to more than that total leaves them (ExitLeaks::scaled_from).
// `made_by_memledger`: stacks of memledger's own Python helpers (the
// retention walk at exit), whose blocks are neither exit leaks nor start-up.
ExitLeaks find_exit_leaks(const ReplayOutput& replay, size_t max_sites, uint64_t sample_interval = 0,
                          bool steps_are_time = false,
                          const std::function<bool(uint32_t stack)>& made_by_import = nullptr,
                          const std::function<bool(uint32_t stack)>& made_by_memledger = nullptr);

// How many allocations one sampled allocation of this weight stands for.
// The recorder gives an allocation of `size` bytes, smaller than the mean
// interval, the weight size / p, where p = 1 - exp(-size / interval) is the
// chance it was sampled; the size is found again from the weight (the
// weight grows with the size, from the interval up), and the allocation
// stands for weight / size allocations of its size. (An allocation of at
// least the interval is recorded at its true size and stands for one: the
// caller tells them apart by kAllocByChance.)
double allocations_per_sample(uint64_t weight, uint64_t interval);

// Live bytes and allocations by site at the peak (the moment the running
// total was highest; empty when nothing was live) and at the end, largest
// first, at most max_sites each.
struct LiveSets {
  std::vector<SiteTotal> at_peak;
  std::vector<SiteTotal> at_end;
  uint64_t sites_dropped = 0;  // smallest sites left out past max_sites
};

LiveSets live_sets(const ReplayOutput& replay, size_t max_sites);

}  // namespace memledger::report
