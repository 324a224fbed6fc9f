#include "exit_leaks.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include <absl/container/flat_hash_map.h>

#include "sampling.h"

namespace memledger::report {
namespace {

// What a site holds: bytes, allocations, and in sampled mode the variance
// of the bytes' estimate.
struct Held {
  int64_t bytes = 0;
  double count = 0;
  double bytes_variance = 0;
};
using BySite = absl::flat_hash_map<uint32_t, Held>;

// The order of the rows: more bytes first, then the lower stack id.
bool comes_first(int64_t a_bytes, uint32_t a_stack, int64_t b_bytes, uint32_t b_stack) {
  return a_bytes != b_bytes ? a_bytes > b_bytes : a_stack < b_stack;
}

bool larger(const SiteTotal& a, const SiteTotal& b) {
  return comes_first(a.bytes, a.site.stack, b.bytes, b.site.stack);
}

// Keeps the `max_sites` first of `ranked` (entries with `bytes` and
// `stack`, in any order) before rows are made of them: a row is some 170
// bytes, and a million sites of an `import torch` took 187 MiB for the 20
// shown. Returns how many went.
template <typename Ranked>
size_t keep_largest(std::vector<Ranked>& ranked, size_t max_sites) {
  if (ranked.size() <= max_sites) return 0;
  const size_t gone = ranked.size() - max_sites;
  std::nth_element(ranked.begin(), ranked.begin() + static_cast<ptrdiff_t>(max_sites), ranked.end(),
                   [](const Ranked& a, const Ranked& b) { return comes_first(a.bytes, a.stack, b.bytes, b.stack); });
  ranked.resize(max_sites);
  return gone;
}

// The rows of the largest sites into `out` (empty), the totals over all.
void collect(const BySite& by_site, const SiteAccs& sites, size_t max_sites, std::vector<SiteTotal>& out,
             int64_t& bytes, uint64_t& count, double& bytes_error) {
  struct Ranked {
    int64_t bytes;
    uint32_t stack;
    uint32_t site;
    const Held* held;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(by_site.size());
  std::vector<std::pair<uint32_t, double>> variances;  // summed by site, in order (a hash map's order varies)
  for (const auto& [s, v] : by_site) {
    bytes += v.bytes;
    count += static_cast<uint64_t>(std::llround(v.count));
    if (v.bytes_variance != 0) variances.emplace_back(s, v.bytes_variance);
    ranked.push_back({v.bytes, sites[s].stack, s, &v});
  }
  std::sort(variances.begin(), variances.end());
  double variance = 0;
  for (const auto& [s, v] : variances) variance += v;
  bytes_error = std::sqrt(variance);
  keep_largest(ranked, max_sites);
  for (const Ranked& r : ranked) {
    SiteTotal t;
    t.site.stack = r.stack;
    t.site.kind = sites[r.site].kind;
    t.bytes = r.bytes;
    t.count = static_cast<uint64_t>(std::llround(r.held->count));
    t.estimated = r.held->bytes_variance > 0;
    t.bytes_error = std::sqrt(r.held->bytes_variance);
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), larger);
}

}  // namespace

double allocations_per_sample(uint64_t weight, uint64_t interval) {
  const double w = static_cast<double>(weight);
  const double mean = static_cast<double>(interval);
  if (interval == 0 || w <= mean) return std::max(1.0, w);  // a block of about one byte
  auto weight_of = [&](double size) { return size / -std::expm1(-size / mean); };
  double lo = 0, hi = w;  // weight_of rises from `mean` (size 0) and weight_of(w) > w
  for (int i = 0; i < 64 && hi - lo > 1e-3; ++i) {
    const double mid = (lo + hi) / 2;
    (weight_of(mid) < w ? lo : hi) = mid;
  }
  return w / std::max(1.0, (lo + hi) / 2);
}

ExitLeaks find_exit_leaks(const ReplayOutput& replay, size_t max_sites, uint64_t sample_interval, bool steps_are_time,
                          const std::function<bool(uint32_t stack)>& made_by_import,
                          const std::function<bool(uint32_t stack)>& made_by_memledger) {
  BySite exit_by_site, startup_by_site;
  const bool first_step_is_startup = !replay.steps.empty() && !steps_are_time;
  std::unordered_map<uint32_t, bool> imported;  // by site index
  auto startup = [&](const auto& a) {
    if (first_step_is_startup) return a.step_born == 1;
    if (!made_by_import) return false;
    auto [it, inserted] = imported.try_emplace(a.site, false);
    if (inserted) it->second = made_by_import(replay.sites[a.site].stack);
    return it->second;
  };
  std::unordered_map<uint32_t, bool> own;  // by site index
  auto memledgers = [&](const auto& a) {
    if (!made_by_memledger) return false;
    auto [it, inserted] = own.try_emplace(a.site, false);
    if (inserted) it->second = made_by_memledger(replay.sites[a.site].stack);
    return it->second;
  };
  ExitLeaks out;
  auto by_chance = [&](const LiveAlloc& a) { return sample_interval != 0 && (a.flags & kAllocByChance); };
  // The sampled allocations' estimates never add up to more than the host
  // held at the end, which is known exactly: in a short process a few
  // samples can stand for more than it ever allocated.
  double scale = 1;
  if (sample_interval != 0 && replay.host_live_at_end >= 0) {
    double estimated = 0, exact = 0;
    for (const auto& [addr, a] : replay.live) {
      if (a.kind != static_cast<uint8_t>(format::Kind::kHost)) continue;
      (by_chance(a) ? estimated : exact) += static_cast<double>(a.weight);
    }
    const double room = std::max(0.0, static_cast<double>(replay.host_live_at_end) - exact);
    if (estimated > room) {
      scale = room / estimated;
      out.scaled_from = static_cast<int64_t>(std::llround(estimated));
      out.scaled_to = static_cast<int64_t>(std::llround(room));
    }
  }
  auto add = [&](const LiveAlloc& a, bool sampled) {
    Held& bucket = startup(a) ? startup_by_site[a.site] : exit_by_site[a.site];
    // A sampled allocation smaller than the interval stands for many.
    const double share = sampled && a.kind == static_cast<uint8_t>(format::Kind::kHost) ? scale : 1.0;
    bucket.bytes += static_cast<int64_t>(std::llround(static_cast<double>(a.weight) * share));
    bucket.count += sampled ? allocations_per_sample(a.weight, sample_interval) * share : 1.0;
    if (sampled) bucket.bytes_variance += sampled_weight(a.weight, sample_interval).bytes_variance * share * share;
    out.counts_estimated = out.counts_estimated || sampled;
  };
  // The sampled allocations' estimates are fractions, added in address
  // order: a sum of doubles depends on its order, and the live map's is a
  // hash's, seeded anew in each process. The others add whole numbers.
  std::vector<std::pair<uint64_t, const LiveAlloc*>> sampled;
  for (const auto& [addr, a] : replay.live) {
    if (memledgers(a)) continue;
    if (by_chance(a)) {
      sampled.emplace_back(addr, &a);
    } else {
      add(a, false);
    }
  }
  std::sort(sampled.begin(), sampled.end());
  for (const auto& [addr, a] : sampled) add(*a, true);
  collect(exit_by_site, replay.sites, max_sites, out.leaks, out.leak_bytes, out.leak_count, out.leak_bytes_error);
  collect(startup_by_site, replay.sites, max_sites, out.startup, out.startup_bytes, out.startup_count,
          out.startup_bytes_error);
  return out;
}

namespace {

std::vector<SiteTotal> snapshot(const ReplayOutput& replay, bool at_peak, size_t max_sites, uint64_t& dropped) {
  struct Ranked {
    int64_t bytes;
    uint32_t stack;
    uint8_t kind;
    uint64_t count;
  };
  std::vector<Ranked> ranked;
  for (const SiteAcc& acc : replay.sites) {
    const bool saved = at_peak && acc.peak_epoch == replay.peak_epoch;
    const int64_t bytes = saved ? acc.peak_live : acc.live;
    const uint64_t count = saved ? acc.peak_count : acc.count;
    if (bytes <= 0 && count == 0) continue;
    ranked.push_back({bytes, acc.stack, acc.kind, count});
  }
  dropped = std::max<uint64_t>(dropped, keep_largest(ranked, max_sites));
  std::vector<SiteTotal> out;
  out.reserve(ranked.size());
  for (const Ranked& r : ranked) {
    SiteTotal t;
    t.site.stack = r.stack;
    t.site.kind = r.kind;
    t.bytes = r.bytes;
    t.count = r.count;
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), larger);
  return out;
}

}  // namespace

LiveSets live_sets(const ReplayOutput& replay, size_t max_sites) {
  LiveSets out;
  if (replay.peak.bytes > 0) out.at_peak = snapshot(replay, true, max_sites, out.sites_dropped);
  out.at_end = snapshot(replay, false, max_sites, out.sites_dropped);
  return out;
}

}  // namespace memledger::report
