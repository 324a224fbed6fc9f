#include "growth.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "check.h"
#include "trace_format.h"

namespace memledger::report {

namespace fmt = memledger::format;

LinearFit fit_line(const std::vector<double>& y) {
  LinearFit fit;
  const size_t n = y.size();
  if (n < 2) return fit;
  double mean_x = (static_cast<double>(n) - 1) / 2;
  double mean_y = 0;
  for (double v : y) mean_y += v;
  mean_y /= static_cast<double>(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    double dx = static_cast<double>(i) - mean_x;
    double dy = y[i] - mean_y;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  fit.slope = sxy / sxx;
  fit.intercept = mean_y - fit.slope * mean_x;
  fit.r_squared = syy == 0 ? 1.0 : (sxy * sxy) / (sxx * syy);
  return fit;
}

double monotone_share(const std::vector<double>& y) {
  size_t non_decreasing = 0;
  for (size_t i = 1; i < y.size(); ++i) non_decreasing += y[i] >= y[i - 1];
  return static_cast<double>(non_decreasing) / static_cast<double>(y.size() - 1);
}

namespace {

// Past this many points a series is thinned evenly before the pairwise
// slopes are taken (n^2/2 pairs: 2M at 2000 points).
constexpr size_t kTheilSenPoints = 2000;

}  // namespace

double theil_sen_slope(const std::vector<double>& y) {
  std::vector<size_t> xs;
  const size_t n = y.size();
  if (n <= kTheilSenPoints) {
    for (size_t i = 0; i < n; ++i) xs.push_back(i);
  } else {
    for (size_t i = 0; i < kTheilSenPoints; ++i) xs.push_back(i * (n - 1) / (kTheilSenPoints - 1));
  }
  std::vector<double> slopes;
  slopes.reserve(xs.size() * (xs.size() - 1) / 2);
  for (size_t a = 0; a < xs.size(); ++a) {
    for (size_t b = a + 1; b < xs.size(); ++b) {
      slopes.push_back((y[xs[b]] - y[xs[a]]) / static_cast<double>(xs[b] - xs[a]));
    }
  }
  if (slopes.empty()) return 0;
  const size_t mid = slopes.size() / 2;
  std::nth_element(slopes.begin(), slopes.begin() + static_cast<long>(mid), slopes.end());
  const double upper = slopes[mid];
  if (slopes.size() % 2) return upper;
  const double lower = *std::max_element(slopes.begin(), slopes.begin() + static_cast<long>(mid));
  return (lower + upper) / 2;
}

namespace {

// A site's live bytes and cumulative allocations at every step end, from
// the step ends where they changed.
struct DenseSeries {
  std::vector<int64_t> live;
  std::vector<double> allocs;  // allocations made (sampled mode: estimated)
};

DenseSeries dense_series(const SiteAcc& acc, size_t n_steps) {
  DenseSeries d{std::vector<int64_t>(n_steps, 0), std::vector<double>(n_steps, 0)};
  size_t c = 0;
  int64_t value = 0;
  double count = 0;
  for (size_t k = 1; k <= n_steps; ++k) {
    while (c < acc.changes.size() && acc.changes[c].step == k) {
      value = acc.changes[c].live;
      count = acc.changes[c].est_allocs;
      ++c;
    }
    d.live[k - 1] = value;
    d.allocs[k - 1] = count;
  }
  return d;
}

// The judgement on the window after the warm-up (y: live bytes at its step
// ends): the least-squares fit and monotone share of a steady growth, or
// nothing when the site plateaus, jumps, or is sampling noise.
constexpr double kSteadyRiseR2 = 0.9;

// The frameworks' caching allocators take device, managed and pinned
// memory in segments larger than what leaks each step: PyTorch's 20 MiB
// segments hold five steps of a 4 MiB leak, so the site rises every fifth
// step and stays level in between (seen on a GPU, with expandable segments
// as without). Such a staircase, never falling, whose last level is no
// longer than the levels between its earlier rises, has not stopped: its
// next rise is not due yet. Its last third may hold a single rise, or none.
// Host memory comes from malloc block by block: there, a site that rose
// now and then and stayed level since is no steady growth.
bool segment_kind(uint8_t kind) {
  return kind == static_cast<uint8_t>(fmt::Kind::kDevice) || kind == static_cast<uint8_t>(fmt::Kind::kManaged) ||
         kind == static_cast<uint8_t>(fmt::Kind::kPinnedHost);
}

bool staircase_before_its_next_rise(const std::vector<double>& y) {
  size_t level = 0;          // steps without a rise since the last rise
  size_t longest_inner = 0;  // the longest level between two rises
  size_t rises = 0;
  for (size_t i = 1; i < y.size(); ++i) {
    if (y[i] < y[i - 1]) return false;
    if (y[i] > y[i - 1]) {
      if (rises > 0) longest_inner = std::max(longest_inner, level);
      ++rises;
      level = 0;
    } else {
      ++level;
    }
  }
  return rises >= 3 && longest_inner > 0 && level <= longest_inner;
}

struct SteadyGrowth {
  LinearFit fit;
  double monotonicity = 0;
};

std::optional<SteadyGrowth> steady_growth(const std::vector<double>& y, uint8_t kind, const GrowthOptions& options) {
  const double growth = y.back() - y.front();
  if (growth <= 0) return std::nullopt;
  // In sampled mode one sampled allocation weighs about the sample
  // interval: a site whose estimate moves by a few samples between step
  // ends may be sampling noise (a per-step temporary caught live at some
  // step ends and not others, a bounded prefetch queue), not growth. A
  // leak must gain at least four samples' worth over the window.
  if (options.sampled && kind == static_cast<uint8_t>(fmt::Kind::kHost) &&
      growth < 4.0 * static_cast<double>(options.sample_interval)) {
    return std::nullopt;
  }
  const LinearFit fit = fit_line(y);
  if (fit.slope <= 0 || fit.slope * static_cast<double>(y.size()) < static_cast<double>(options.min_growth)) {
    return std::nullopt;
  }
  const double monotonicity = monotone_share(y);
  // A steady rise through noise is growth too: a temporary of the same site
  // caught live at some step ends (in sampled mode, a sample of it) makes a
  // leak zigzag upwards, and a line fits it closely all the same.
  if (monotonicity < 0.75 && fit.r_squared < kSteadyRiseR2) return std::nullopt;
  // One or two jumps are not steady growth: a long-lived object made late
  // (in sampled mode, one sample weighs a whole interval) looks like one.
  size_t rises = 0;
  for (size_t i = 1; i < y.size(); ++i) rises += y[i] > y[i - 1];
  if (rises < 3) return std::nullopt;
  // A cache that fills up and stops is not a leak: the last third must still
  // grow. Its slope is the median of its pairwise slopes: a temporary caught
  // live at one step end of the tail (a buffer of the next step made early)
  // must not hide a leak, nor one jump make a plateau look like growth.
  if (!segment_kind(kind) || !staircase_before_its_next_rise(y)) {
    const size_t tail = std::max<size_t>(2, y.size() / 3);
    const std::vector<double> last(y.end() - static_cast<long>(tail), y.end());
    const double tail_slope = theil_sen_slope(last);
    if (tail_slope <= 0 || tail_slope < 0.25 * fit.slope) return std::nullopt;
  }
  // What leaks stays: the least a leaking site holds rises over the window.
  // A temporary caught live at some step ends and not at others (in
  // sampled mode, a sample of it weighs a whole interval) falls back to
  // where the window began, however its highs happen to line up: a
  // DataLoader worker's sample tensor read 0, 1, 0, 2, 2, 0, 1, 2 ... 4, 4
  // samples over 20 windows: monotone in 13 of the 17 steps after the
  // warm-up (its level ones counted) and rising in its last third.
  {
    const size_t third = std::max<size_t>(1, y.size() / 3);
    const double first_floor = *std::min_element(y.begin(), y.begin() + static_cast<long>(third));
    const double last_floor = *std::min_element(y.end() - static_cast<long>(third), y.end());
    if (last_floor <= first_floor) return std::nullopt;
  }
  // Most pairs of steps must show growth: a series that stays level
  // between a few jumps (the last step ending as teardown begins, a
  // worker's burst caught live twice) has a Theil-Sen slope of zero.
  if (theil_sen_slope(y) <= 0) return std::nullopt;
  return SteadyGrowth{fit, monotonicity};
}

// Sampled mode: the growth over the window is made of allocations like the
// site's others, so its Poisson variance is the site's variance per byte
// (and per allocation) times what it gained; one standard deviation of the
// rates follows.
void sampling_error(const SiteAcc& acc, size_t window, LeakSuspect& s) {
  const SiteEstimate& a = acc.allocated;
  if (a.bytes_variance <= 0 || a.bytes <= 0 || a.count <= 0) return;
  const double w = static_cast<double>(window);
  s.estimated = true;
  s.bytes_per_step_error = std::sqrt(std::max(0.0, s.bytes_per_step) * w * a.bytes_variance / a.bytes) / w;
  s.allocations_per_step_error = std::sqrt(std::max(0.0, s.allocations_per_step) * w * a.count_variance / a.count) / w;
}

// A site's figures over the window from `first` (1-based): `fit` and
// `monotonicity` are those of its live bytes at the window's step ends.
LeakSuspect describe(const SiteAcc& acc, const DenseSeries& d, size_t first, const LinearFit& fit,
                     double monotonicity) {
  const size_t n_steps = d.live.size();
  const size_t window = n_steps - first + 1;
  LeakSuspect s;
  s.site.stack = acc.stack;
  s.site.kind = acc.kind;
  s.bytes_per_step = fit.slope;
  s.r_squared = fit.r_squared;
  s.monotonicity = monotonicity;
  s.allocations_per_step = (d.allocs[n_steps - 1] - d.allocs[first - 2 < n_steps ? first - 2 : 0]) /
                           static_cast<double>(window);
  sampling_error(acc, window, s);
  for (size_t k = 0; k < n_steps; ++k) {
    if (d.live[k] > (k == 0 ? 0 : d.live[k - 1])) {
      s.first_step = k + 1;
      break;
    }
  }
  s.live_at_end = acc.live;
  return s;
}

std::vector<double> window_of(const DenseSeries& d, size_t first) {
  return std::vector<double>(d.live.begin() + static_cast<long>(first - 1), d.live.end());
}

// `first`: the first step of the window (1-based).
std::optional<LeakSuspect> judge_site(const SiteAcc& acc, size_t n_steps, size_t first, const GrowthOptions& options) {
  const DenseSeries d = dense_series(acc, n_steps);
  const std::optional<SteadyGrowth> g = steady_growth(window_of(d, first), acc.kind, options);
  if (!g) return std::nullopt;
  return describe(acc, d, first, g->fit, g->monotonicity);
}

// A suspect found while judging, with the index of its site: its series is
// made once it is known to be among the steepest.
struct Candidate {
  LeakSuspect suspect;
  size_t site = 0;
};

void keep_steepest(std::vector<Candidate>& candidates, size_t keep) {
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.suspect.bytes_per_step > b.suspect.bytes_per_step;
  });
  if (candidates.size() > keep) candidates.resize(keep);
}

// Stacks made under one line of the program share its growth: a leak that
// a library makes now by one path and now by another (XLA copying a host
// array, or keeping it when it is aligned) grows steadily only as the
// line's sum. Where the sum of a line's stacks grows steadily, each of its
// stacks that rose over the window is a suspect, so that the line's row
// (site_groups.h) holds the whole of its growth.
void add_growing_lines(const SiteAccs& sites, size_t n_steps, size_t first, const GrowthOptions& options,
                       std::vector<Candidate>& candidates) {
  absl::flat_hash_map<std::string, std::vector<size_t>> lines;
  for (size_t i = 0; i < sites.size(); ++i) {
    // A site that did not change after the window's first step is level in
    // it: it adds nothing to a line's sum.
    if (sites[i].changes.empty() || sites[i].changes.back().step <= first) continue;
    std::string key = options.line_of(sites[i]);
    if (!key.empty()) lines[std::move(key)].push_back(i);
  }
  absl::flat_hash_set<size_t> judged;
  for (const Candidate& c : candidates) judged.insert(c.site);
  for (const auto& [key, members] : lines) {
    if (members.size() < 2) continue;
    std::vector<DenseSeries> series;
    std::vector<std::vector<double>> windows;
    std::vector<double> sum(n_steps - first + 1, 0);
    for (size_t i : members) {
      series.push_back(dense_series(sites[i], n_steps));
      windows.push_back(window_of(series.back(), first));
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += windows.back()[k];
    }
    if (!steady_growth(sum, sites[members.front()].kind, options)) continue;
    for (size_t m = 0; m < members.size(); ++m) {
      if (judged.contains(members[m])) continue;
      const LinearFit fit = fit_line(windows[m]);
      if (fit.slope <= 0) continue;
      candidates.push_back(
          Candidate{describe(sites[members[m]], series[m], first, fit, monotone_share(windows[m])), members[m]});
    }
  }
}

}  // namespace

Growth find_growth(const SiteAccs& sites, size_t n_steps, const GrowthOptions& options) {
  Growth out;
  int warmup = options.warmup_steps;
  if (warmup < 0) warmup = std::clamp(static_cast<int>(n_steps / 10), 1, 10);
  out.warmup_steps = warmup;
  if (n_steps == 0) {
    out.note =
        "no steps were recorded: growth per step cannot be judged. Mark steps with memledger_step() / "
        "memledger.step(), or use --step-interval SECONDS";
    return out;
  }
  if (n_steps < static_cast<size_t>(warmup) + 3) {
    out.note = "only " + std::to_string(n_steps) + " steps after " + std::to_string(warmup) +
               " warm-up steps: too few to judge growth (need at least 3 after warm-up)";
    return out;
  }
  const size_t first = static_cast<size_t>(warmup) + 1;
  // Only the steepest suspects are kept while judging, and only they get a
  // series (one value per step): a long run with many growing sites holds
  // at most twice max_suspects candidates and max_suspects series.
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < sites.size(); ++i) {
    if (sites[i].changes.empty()) continue;
    if (std::optional<LeakSuspect> s = judge_site(sites[i], n_steps, first, options)) {
      candidates.push_back(Candidate{std::move(*s), i});
      if (candidates.size() >= 2 * options.max_suspects + 16) keep_steepest(candidates, options.max_suspects);
    }
  }
  if (options.line_of) add_growing_lines(sites, n_steps, first, options, candidates);
  keep_steepest(candidates, options.max_suspects);
  for (Candidate& c : candidates) {
    c.suspect.series = dense_series(sites[c.site], n_steps).live;
    out.suspects.push_back(std::move(c.suspect));
  }
  return out;
}

TotalGrowth total_growth(const std::vector<StepStats>& steps, int warmup_steps) {
  std::vector<double> series;
  series.reserve(steps.size());
  for (const StepStats& st : steps) series.push_back(double(st.live[0] + st.live[1] + st.live[2] + st.live[3] + st.live[4]));
  const GrowthFit fit = fit_growth(series, warmup_steps);
  TotalGrowth out;
  out.judged = fit.judged;
  out.per_step = fit.slope;
  out.r_squared = fit.r_squared;
  out.first_step = fit.first_step;
  out.last_step = fit.last_step;
  out.plateau = fit.plateau;
  return out;
}

}  // namespace memledger::report
