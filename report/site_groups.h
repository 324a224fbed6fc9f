// Stage "one row per line": the rows the report shows are lines of the
// user's code, not stacks. Sites whose stacks differ only around the same
// user line (a TensorFlow op reached through twenty native paths, a cache
// filled from five callers' worker processes) are one row.
//
// In:  named growth suspects, or named site totals (exit leaks, start-up
//      allocations), each for one interned stack.
// Out: one row per (kind, user frame): the figures summed over the stacks
//      merged (bytes per step and allocations per step, their sampling
//      errors in quadrature, the live bytes at each step end, from which the
//      fit's r² and monotone share are taken again), the number of stacks
//      merged, and the stacks themselves (at most kMaxVariants, largest
//      first) for drill-down; the row's own stack is the largest one's.
//      Rows are sorted as before and cut to max_rows.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "analysis.h"

namespace memledger::report {

// Stacks kept under one row (the count merged is kept in full).
inline constexpr size_t kMaxVariants = 20;

// The line a site belongs to: its kind and the frame that names it (the
// user's frame, site_name). Sites without frames are each their own line.
std::string user_line_key(const Site& site);

// `warmup_steps`: the suspects' fit window starts after it (growth.h).
std::vector<LeakSuspect> group_suspects(std::vector<LeakSuspect> suspects, int warmup_steps, size_t max_rows);
std::vector<SiteTotal> group_site_totals(std::vector<SiteTotal> totals, size_t max_rows);

}  // namespace memledger::report
