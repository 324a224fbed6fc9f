#include "growth_view.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace memledger::report {
namespace {

// A site's live bytes and allocations made, as they stood at the end of step k.
SeriesPoint at_step(const SiteAcc& site, uint64_t k) {
  SeriesPoint last{0, 0, 0, 0};
  for (const SeriesPoint& p : site.changes) {
    if (p.step > k) break;
    last = p;
  }
  return last;
}

bool parse_step(std::string_view text, uint64_t& value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && ptr == end && !text.empty();
}

}  // namespace

bool parse_growth_window(const std::string& text, GrowthWindow& window, std::string& error) {
  const size_t colon = text.find(':');
  GrowthWindow w;
  if (colon == std::string::npos || !parse_step(std::string_view(text).substr(0, colon), w.from) ||
      !parse_step(std::string_view(text).substr(colon + 1), w.to)) {
    error = "--growth-window takes two step numbers, FROM:TO (such as 5:40), not '" + text + "'";
    return false;
  }
  if (w.from < 1 || w.from >= w.to) {
    error = "--growth-window FROM:TO needs 1 <= FROM < TO, not " + text;
    return false;
  }
  window = w;
  return true;
}

GrowthView growth_view(const ReplayOutput& replay, int warmup_steps, GrowthWindow window, size_t max_sites) {
  GrowthView out;
  const uint64_t steps = replay.steps.size();
  if (window.from == 0) {
    window.from = static_cast<uint64_t>(std::max(1, warmup_steps));
    window.to = steps;
  }
  out.from_step = window.from;
  out.to_step = window.to;
  if (steps < 2) {
    out.note = steps == 0 ? "no steps: nothing to compare" : "one step: nothing to compare";
    return out;
  }
  if (window.to > steps || window.from >= window.to) {
    out.note = "steps " + std::to_string(window.from) + " to " + std::to_string(window.to) + " are not within its " +
               std::to_string(steps) + " steps";
    return out;
  }
  for (const SiteAcc& site : replay.sites) {
    const SeriesPoint a = at_step(site, window.from), b = at_step(site, window.to);
    if (b.live <= a.live) continue;
    SiteTotal t;
    t.site.stack = site.stack;
    t.site.kind = site.kind;
    t.bytes = b.live - a.live;
    t.count = static_cast<uint64_t>(std::max(0.0, std::round(b.est_allocs - a.est_allocs)));
    out.bytes += t.bytes;
    out.sites.push_back(std::move(t));
  }
  std::sort(out.sites.begin(), out.sites.end(), [](const SiteTotal& x, const SiteTotal& y) { return x.bytes > y.bytes; });
  if (out.sites.size() > max_sites) out.sites.resize(max_sites);
  return out;
}

}  // namespace memledger::report
