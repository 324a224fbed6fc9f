#include "attributed.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "analysis.h"
#include "trace_format.h"

namespace memledger::report {

namespace fmt = memledger::format;

namespace {

// The key of an attributed stack's place (empty for any other stack): its
// kind, then its words from the innermost attributed frame in the
// program's own files (the innermost attributed frame when none is), that
// frame without its instruction offset.
std::string variant_key(const Trace& trace, const SiteAcc& site) {
  uint64_t innermost = 0;
  trace.stacks.visit(site.stack, [&](uint64_t word) {
    innermost = word;
    return false;
  });
  if (!fmt::is_attributed_python_frame(innermost)) return {};  // most stacks: no need to read them whole
  std::vector<uint64_t> words;
  trace.stacks.get(site.stack, words);
  size_t user = 0;
  for (size_t i = 0; i < words.size() && fmt::is_attributed_python_frame(words[i]); ++i) {
    auto code = trace.python_codes.find(fmt::python_code_id(words[i]));
    if (code != trace.python_codes.end() && !is_library_python_file(code->second.filename)) {
      user = i;
      break;
    }
  }
  std::string key(1, static_cast<char>(site.kind));
  auto append = [&key](uint64_t w) { key.append(reinterpret_cast<const char*>(&w), sizeof w); };
  append(words[user] | 0xffffffffu);
  for (size_t i = user + 1; i < words.size(); ++i) append(words[i]);
  return key;
}

// The series of a site made of two: at each step end where either changed,
// the sum of both as they stood then.
std::vector<SeriesPoint> sum_series(const std::vector<SeriesPoint>& a, const std::vector<SeriesPoint>& b) {
  std::vector<SeriesPoint> out;
  SeriesPoint last_a{0, 0, 0, 0}, last_b{0, 0, 0, 0};
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    const uint32_t step = std::min(i < a.size() ? a[i].step : UINT32_MAX, j < b.size() ? b[j].step : UINT32_MAX);
    if (i < a.size() && a[i].step == step) last_a = a[i++];
    if (j < b.size() && b[j].step == step) last_b = b[j++];
    out.push_back({step, last_a.live + last_b.live, last_a.allocs + last_b.allocs,
                   last_a.est_allocs + last_b.est_allocs});
  }
  return out;
}

void absorb(SiteAcc& into, SiteAcc& from, uint64_t peak_epoch) {
  // A site that has not changed since the running peak holds its share of
  // it in `live` (replay.h).
  auto peak_live = [peak_epoch](const SiteAcc& s) { return s.peak_epoch == peak_epoch ? s.peak_live : s.live; };
  auto peak_count = [peak_epoch](const SiteAcc& s) { return s.peak_epoch == peak_epoch ? s.peak_count : s.count; };
  into.peak_live = peak_live(into) + peak_live(from);
  into.peak_count = peak_count(into) + peak_count(from);
  into.peak_epoch = peak_epoch;
  into.live += from.live;
  into.count += from.count;
  if (from.allocs > 0) {
    into.first_alloc_ns = into.allocs > 0 ? std::min(into.first_alloc_ns, from.first_alloc_ns) : from.first_alloc_ns;
    into.last_alloc_ns = std::max(into.last_alloc_ns, from.last_alloc_ns);
  }
  into.allocs += from.allocs;
  into.allocated.bytes += from.allocated.bytes;
  into.allocated.bytes_variance += from.allocated.bytes_variance;
  into.allocated.count += from.allocated.count;
  into.allocated.count_variance += from.allocated.count_variance;
  into.changes = sum_series(into.changes, from.changes);
  SiteAcc emptied;
  emptied.stack = from.stack;
  emptied.kind = from.kind;
  emptied.peak_epoch = peak_epoch;
  from = std::move(emptied);
}

}  // namespace

void merge_attributed_variants(const Trace& trace, ReplayOutput& replay) {
  // The variant that keeps most is the one the report names: its line is
  // where the main thread most often was when the kept blocks were made
  // (temporaries come mostly while it waits for the step to finish).
  auto kept = [](const SiteAcc& s) { return s.changes.empty() ? int64_t{0} : s.changes.back().live; };
  struct Group {
    uint32_t site;
    uint32_t stack;  // the variant that keeps most so far
    int64_t kept;
  };
  absl::flat_hash_map<std::string, Group> groups;
  std::vector<uint32_t> moved_to(replay.sites.size(), UINT32_MAX);
  for (uint32_t s = 0; s < replay.sites.size(); ++s) {
    SiteAcc& site = replay.sites[s];
    const std::string key = variant_key(trace, site);
    if (key.empty()) continue;
    auto [it, inserted] = groups.try_emplace(key, Group{s, site.stack, kept(site)});
    if (inserted) continue;
    Group& g = it->second;
    if (kept(site) > g.kept) {
      g.stack = site.stack;
      g.kept = kept(site);
    }
    absorb(replay.sites[g.site], site, replay.peak_epoch);
    moved_to[s] = g.site;
  }
  for (const auto& [key, g] : groups) replay.sites[g.site].stack = g.stack;
  for (auto& [addr, alloc] : replay.live) {
    if (moved_to[alloc.site] != UINT32_MAX) alloc.site = moved_to[alloc.site];
  }
}

}  // namespace memledger::report
