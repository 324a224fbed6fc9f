// Stage "retention": who keeps the suspects' memory alive (Python programs).
//
// In:  retention.PID.json, written by the Python module at exit or at
//      memledger.snapshot() (tools/python/memledger/_retention.py): each
//      large owner's address, size and kind, and its path of referrers up
//      to a named root; the replay's live set at the end, by address.
// Out: for each growth suspect (and its merged variants), the paths that
//      hold its live blocks at the end, most bytes first: an owner's data
//      pointer is the address its allocator returned (a torch storage, a
//      NumPy array that owns its data, bytes), so owners and blocks meet
//      by address; a device owner also meets the device block that holds
//      its address (a caching allocator's segment).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis.h"
#include "replay.h"

namespace memledger::report {

struct RetentionOwner {
  uint64_t address = 0;
  uint64_t bytes = 0;
  bool device = false;
  size_t path = 0;  // into RetentionFile::paths
};

struct RetentionFile {
  std::string when;  // "exit", "snapshot"; empty: no file
  // The trace's sequence number when the walk began: the live set of that
  // moment is the one its owners are matched with (UINT64_MAX: the end).
  uint64_t seq = UINT64_MAX;
  double elapsed_seconds = 0;
  std::vector<std::string> skipped;
  std::vector<RetentionOwner> owners;
  // Each path as hops, outermost (the named root) first, the owner last:
  // ready to print.
  std::vector<std::vector<std::string>> paths;
  std::string error;  // the file is there but could not be read
};

// The retention file of process `pid` in `dir`; an empty `when` when there
// is none.
RetentionFile read_retention(const std::string& dir, int pid);

// Fills each suspect's kept_by (at most `max_paths` each), from the live
// set kept at the file's moment (Replay::keep_live_set, every kind).
void attach_retention(const RetentionFile& file, const std::vector<InheritedBlock>& live, const ReplayOutput& replay,
                      std::vector<LeakSuspect>& suspects, size_t max_paths = 3);

}  // namespace memledger::report
