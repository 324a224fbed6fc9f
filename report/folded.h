// Stacks as flame graphs draw them, and the folded-stacks export
// ("frame;frame;frame bytes" lines, root first) read by flamegraph.pl,
// inferno, speedscope and most flame graph tools.
#pragma once

#include <string>
#include <vector>

#include "run_report.h"

namespace memledger::report {

// Which live set: at the moment the live total peaked, or at the end; or
// what grew between two step ends (ProcessReport::growth_view).
enum class Snapshot { kPeak, kEnd, kGrowth };

const std::vector<SiteTotal>& snapshot_sites(const ProcessReport& p, Snapshot at);

// A frame of Python code (marked so by the symbolizer, or its file is a
// .py source) rather than native code.
bool is_python_frame(const Frame& f);

// The frames of a stack from the root to the allocation. With Python frames,
// those come first (outermost first), followed by the native frames below the
// interpreter (the innermost native frames up to the first frame of the
// interpreter itself); without, every native frame, outermost first.
std::vector<const Frame*> flame_path(const std::vector<Frame>& frames);

// A frame's name in a flame graph: the function; Python frames add
// "(file.py:line)"; an unknown function names its module.
std::string frame_label(const Frame& f);

// The root frame that names the memory kind: "[host]", "[device]", ...
std::string kind_label(uint8_t kind);

// Folded stacks of the live set: one line per site, "[process;][kind];frames BYTES".
// The process frame is added when the run has several processes.
std::string render_folded(const RunReport& run, Snapshot at);

}  // namespace memledger::report
