// The run as Chrome trace event JSON, for Perfetto's UI (ui.perfetto.dev,
// "Open trace file") and chrome://tracing: one process track per traced
// process, its steps as slices, and counters per step end: live and held
// bytes per kind, fragmentation, RSS against the cgroup limit, device free
// memory; out-of-memory failures and the stop verdict as instant events.
#pragma once

#include <nlohmann/json.hpp>

#include "run_report.h"

namespace memledger::report {

nlohmann::json render_chrome_trace(const RunReport& run);

}  // namespace memledger::report
