#include "site_groups.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace memledger::report {

std::string user_line_key(const Site& site) {
  std::string key = std::to_string(site.kind) + '\n';
  if (site.frames.empty()) return key + "#" + std::to_string(site.stack);
  const Frame& f = site.frames[user_frame_index(site.frames)];
  key += f.function + '\n';
  // Work a thread with no Python did while the main thread was in a
  // function stays apart from the function's own allocations, and is one
  // row per function: the line the main thread was at when the other thread
  // allocated is a matter of timing.
  if (f.attributed) return key + "(attributed)\n" + f.file;
  if (!f.file.empty()) return key + f.file + ':' + std::to_string(f.line);
  return key + f.module;
}

namespace {

// Rows in first-seen order, each with the indexes of its members.
template <typename T>
std::vector<std::vector<size_t>> rows_by_line(const std::vector<T>& items) {
  std::map<std::string, size_t> row_of;
  std::vector<std::vector<size_t>> rows;
  for (size_t i = 0; i < items.size(); ++i) {
    auto [it, added] = row_of.emplace(user_line_key(items[i].site), rows.size());
    if (added) rows.emplace_back();
    rows[it->second].push_back(i);
  }
  return rows;
}

// The fit's r² and monotone share of a row's summed series, over the same
// window as each member's (growth.h): the steps after the warm-up.
void refit(LeakSuspect& row, int warmup_steps) {
  const size_t first = std::min(row.series.size(), static_cast<size_t>(std::max(0, warmup_steps)));
  const std::vector<double> y(row.series.begin() + static_cast<long>(first), row.series.end());
  if (y.size() < 2) return;
  row.r_squared = fit_line(y).r_squared;
  row.monotonicity = monotone_share(y);
}

LeakSuspect merge_suspects(std::vector<LeakSuspect> members, int warmup_steps) {
  std::stable_sort(members.begin(), members.end(),
                   [](const LeakSuspect& a, const LeakSuspect& b) { return a.bytes_per_step > b.bytes_per_step; });
  LeakSuspect row = members.front();
  row.bytes_per_step_error *= row.bytes_per_step_error;
  row.allocations_per_step_error *= row.allocations_per_step_error;
  for (size_t i = 1; i < members.size(); ++i) {
    const LeakSuspect& m = members[i];
    row.bytes_per_step += m.bytes_per_step;
    row.allocations_per_step += m.allocations_per_step;
    row.bytes_per_step_error += m.bytes_per_step_error * m.bytes_per_step_error;
    row.allocations_per_step_error += m.allocations_per_step_error * m.allocations_per_step_error;
    row.estimated = row.estimated || m.estimated;
    row.site.graph = row.site.graph || m.site.graph;
    row.first_step = std::min(row.first_step, m.first_step);
    row.live_at_end += m.live_at_end;
    row.series.resize(std::max(row.series.size(), m.series.size()), 0);
    for (size_t k = 0; k < m.series.size(); ++k) row.series[k] += m.series[k];
  }
  row.bytes_per_step_error = std::sqrt(row.bytes_per_step_error);
  row.allocations_per_step_error = std::sqrt(row.allocations_per_step_error);
  refit(row, warmup_steps);
  row.stacks_merged = members.size();
  if (members.size() > kMaxVariants) members.resize(kMaxVariants);
  row.variants = std::move(members);
  return row;
}

SiteTotal merge_totals(std::vector<SiteTotal> members) {
  std::stable_sort(members.begin(), members.end(), [](const SiteTotal& a, const SiteTotal& b) { return a.bytes > b.bytes; });
  SiteTotal row = members.front();
  double variance = row.bytes_error * row.bytes_error;
  for (size_t i = 1; i < members.size(); ++i) {
    row.bytes += members[i].bytes;
    row.count += members[i].count;
    row.estimated = row.estimated || members[i].estimated;
    row.site.graph = row.site.graph || members[i].site.graph;
    variance += members[i].bytes_error * members[i].bytes_error;
  }
  row.bytes_error = std::sqrt(variance);
  row.stacks_merged = members.size();
  if (members.size() > kMaxVariants) members.resize(kMaxVariants);
  row.variants = std::move(members);
  return row;
}

// One row per line: the members of each row merged, the rows sorted by
// `larger` and cut to max_rows.
template <typename T, typename Merge, typename Larger>
std::vector<T> group_rows(std::vector<T> items, size_t max_rows, Merge merge, Larger larger) {
  std::vector<T> out;
  for (const std::vector<size_t>& members : rows_by_line(items)) {
    if (members.size() == 1) {
      out.push_back(std::move(items[members.front()]));
      continue;
    }
    std::vector<T> merged;
    for (size_t i : members) merged.push_back(std::move(items[i]));
    out.push_back(merge(std::move(merged)));
  }
  std::stable_sort(out.begin(), out.end(), larger);
  if (out.size() > max_rows) out.resize(max_rows);
  return out;
}

}  // namespace

std::vector<LeakSuspect> group_suspects(std::vector<LeakSuspect> suspects, int warmup_steps, size_t max_rows) {
  return group_rows(
      std::move(suspects), max_rows,
      [&](std::vector<LeakSuspect> members) { return merge_suspects(std::move(members), warmup_steps); },
      [](const LeakSuspect& a, const LeakSuspect& b) { return a.bytes_per_step > b.bytes_per_step; });
}

std::vector<SiteTotal> group_site_totals(std::vector<SiteTotal> totals, size_t max_rows) {
  return group_rows(std::move(totals), max_rows, merge_totals,
                    [](const SiteTotal& a, const SiteTotal& b) { return a.bytes > b.bytes; });
}

}  // namespace memledger::report
