// What one stretch of a process did to its memory: the window between two
// trace sequence numbers (memledger_live's `seq`, read at the window's ends),
// replayed from the trace. Per kind, the net growth and the peak above the
// window's start; per allocation site, the net growth and the bytes live at
// that peak. It answers "which line grew?" for one test or one phase
// (`memledger window`, the pytest plugin), where the run report judges
// growth over steps. Sampled host mode: host figures are estimates.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis.h"
#include "trace_format.h"
#include "trace_reader.h"

namespace memledger::report {

struct WindowSite {
  Site site;
  int64_t growth = 0;      // net bytes allocated and not freed inside the window
  uint64_t allocations = 0;
  int64_t at_peak = 0;     // bytes allocated inside the window and live at the kind's peak
};

struct WindowKind {
  int64_t growth = 0;  // net over the window
  int64_t peak = 0;    // the highest running net, relative to the window's start
  uint64_t allocations = 0;
  uint64_t frees = 0;
  std::vector<WindowSite> sites;  // largest growth first (growth > 0), then by bytes at the peak
};

struct WindowReport {
  uint64_t from_seq = 0;
  uint64_t to_seq = 0;  // 0: the end of the trace
  bool host_sampled = false;
  WindowKind kinds[format::kKindCount];
  WindowKind total;  // every kind together (its sites: of any kind)
};

// Replays `trace` (read with its events) over [from_seq, to_seq); frees
// inside the window of blocks allocated before it count against their sites.
// Keeps the `top` largest sites per kind, symbolized.
WindowReport analyze_window(const Trace& trace, uint64_t from_seq, uint64_t to_seq, size_t top,
                            const SymbolizerOptions& symbolizer);

nlohmann::json render_window_json(const WindowReport& window);

}  // namespace memledger::report
