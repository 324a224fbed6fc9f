// Stage "attributed variants": stacks that begin with attributed Python
// frames (a thread that never ran Python, lent the main thread's frames at
// the moment it allocated: trace_format.h, kPythonAttributedBit) are one
// site per place in the program, not one per line the main thread happened
// to be at. XLA or TensorFlow may fill a buffer while the main thread is
// still dispatching the step, or already waiting for it: the same leak
// arrives under several lines of the same function, and none of the
// variants alone grows steadily.
//
// In:  the replay's sites (after the last event: every stack is known) and
//      the trace's stacks and Python code objects.
// Out: the same sites, with the variants of each attributed stack merged
//      into the first: summed live bytes, counts, estimates and series;
//      live allocations moved with them. The merged site keeps the stack of
//      the variant that allocated most, whose line the report then names.
//      Variants differ below the innermost attributed frame in the
//      program's own files (library frames under it vary with timing too)
//      and in that frame's line; the rest of the stack is the same.
#pragma once

#include "replay.h"
#include "trace_reader.h"

namespace memledger::report {

void merge_attributed_variants(const Trace& trace, ReplayOutput& replay);

}  // namespace memledger::report
