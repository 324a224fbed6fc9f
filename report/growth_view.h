// Stage "growth view": what grew between two step ends, by site, for the
// flame graph the report shows first (and the JSON's growth_view).
//
// In:  the replay's site accumulators (each site's live bytes and
//      allocation count at the step ends where it changed) and the window:
//      by default from the end of the warm-up to the last step, or two step
//      ends the user chose (memledger report --growth-window A:B).
// Out: per site, the live bytes it gained between the two step ends (sites
//      that shrank or stayed level are left out) and the allocations it made
//      in between, largest first. Start-up is never part of it: the window
//      starts at a step end. Sites are unnamed (stack id and kind).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "analysis.h"
#include "replay.h"

namespace memledger::report {

// Reads "A:B" (1 <= A < B); false, with `error` set, when it is not that.
bool parse_growth_window(const std::string& text, GrowthWindow& window, std::string& error);

GrowthView growth_view(const ReplayOutput& replay, int warmup_steps, GrowthWindow window, size_t max_sites);

}  // namespace memledger::report
