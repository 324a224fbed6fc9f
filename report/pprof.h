// The live sets as a pprof heap profile (profile.proto from google/pprof,
// gzip-compressed as pprof expects): loadable by `go tool pprof`, speedscope,
// Pyroscope and other pprof readers.
//
// Sample types, one value each per site:
//   peak_objects/count, peak_space/bytes  live at the moment the total peaked
//   exit_objects/count, exit_space/bytes  live at the end
// peak_space is the default. Each sample carries labels: kind (host, device,
// managed, pinned_host), pid, and rank when a launcher set one. Locations are
// symbolized already (every mapping says has_functions), one per recorded
// address with its inline chain as lines.
#pragma once

#include <string>

#include "run_report.h"

namespace memledger::report {

// The serialized perftools.profiles.Profile, uncompressed.
std::string build_pprof(const RunReport& run);

// build_pprof, gzip-compressed: the file pprof tools read.
std::string render_pprof(const RunReport& run);

// gzip (RFC 1952) of `data` with zlib.
std::string gzip_compress(const std::string& data);

}  // namespace memledger::report
