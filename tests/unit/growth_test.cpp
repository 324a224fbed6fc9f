#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "growth.h"
#include "trace_format.h"

using namespace memledger::report;

namespace {

// A site whose live bytes at step ends 1, 2, ... are `live` (one
// allocation per step that changed).
SiteAcc site(uint32_t stack, const std::vector<int64_t>& live, uint8_t kind = 0) {
  SiteAcc acc;
  acc.stack = stack;
  acc.kind = kind;
  int64_t last = 0;
  for (size_t k = 0; k < live.size(); ++k) {
    if (live[k] == last) continue;
    if (live[k] > last) ++acc.allocs;
    acc.changes.push_back(SeriesPoint{static_cast<uint32_t>(k + 1), live[k], acc.allocs, double(acc.allocs)});
    last = live[k];
  }
  acc.live = last;
  return acc;
}

std::vector<int64_t> linear(size_t steps, int64_t per_step) {
  std::vector<int64_t> v;
  for (size_t k = 1; k <= steps; ++k) v.push_back(static_cast<int64_t>(k) * per_step);
  return v;
}

}  // namespace

TEST_CASE("growth: a steady rise is a suspect with its slope, first step and series", "[growth]") {
  Growth g = find_growth({site(1, linear(20, 4096))}, 20, GrowthOptions{});
  CHECK(g.note.empty());
  CHECK(g.warmup_steps == 2);  // a tenth of the steps
  REQUIRE(g.suspects.size() == 1);
  const LeakSuspect& s = g.suspects[0];
  CHECK(s.site.stack == 1);
  CHECK(s.site.frames.empty());  // named later, by the report
  CHECK(s.bytes_per_step == Approx(4096));
  CHECK(s.r_squared == Approx(1.0));
  CHECK(s.monotonicity == Approx(1.0));
  CHECK(s.allocations_per_step == Approx(1.0));
  CHECK(s.first_step == 1);
  CHECK(s.live_at_end == 20 * 4096);
  CHECK(s.series == linear(20, 4096));
}

TEST_CASE("growth: warm-up steps are left out of the fit", "[growth]") {
  // Steps 1..3 grow by 1 MiB each (warm-up), then by 2 KiB per step.
  std::vector<int64_t> live = {1 << 20, 2 << 20, 3 << 20};
  for (int k = 1; k <= 17; ++k) live.push_back((3 << 20) + k * 2048);
  GrowthOptions options;
  options.warmup_steps = 3;
  Growth g = find_growth({site(1, live)}, 20, options);
  REQUIRE(g.suspects.size() == 1);
  CHECK(g.warmup_steps == 3);
  CHECK(g.suspects[0].bytes_per_step == Approx(2048));
  CHECK(g.suspects[0].first_step == 1);
}

TEST_CASE("growth: plateaus, jumps, level series and tiny growth are not suspects", "[growth]") {
  std::vector<int64_t> plateau = linear(10, 8192);
  plateau.resize(20, plateau.back());  // a cache that fills up and stops
  std::vector<int64_t> two_jumps(20, 0);
  for (size_t k = 5; k < 20; ++k) two_jumps[k] = k < 12 ? 1 << 20 : 2 << 20;
  std::vector<int64_t> sawtooth;
  for (int k = 0; k < 20; ++k) sawtooth.push_back(k % 2 ? 10000 + k * 100 : 0);
  Growth g = find_growth({site(1, plateau), site(2, two_jumps), site(3, sawtooth), site(4, linear(20, 10))}, 20,
                         GrowthOptions{});
  CHECK(g.suspects.empty());
}

TEST_CASE("growth: a staircase of segments is growth until a level outlasts the earlier ones", "[growth]") {
  // 4 MiB of device memory kept a step in 20 MiB segments (PyTorch's
  // expandable segments, seen on a GPU): a rise every fifth step, the run
  // ending on a full level.
  constexpr int64_t kMiB = 1 << 20;
  std::vector<int64_t> stairs;
  for (int k = 0; k < 20; ++k) stairs.push_back(238 * kMiB + (k / 5) * 20 * kMiB);
  constexpr auto kDevice = static_cast<uint8_t>(memledger::format::Kind::kDevice);
  Growth g = find_growth({site(1, stairs, kDevice)}, 20, GrowthOptions{});
  REQUIRE(g.suspects.size() == 1);
  CHECK(g.suspects[0].bytes_per_step == Approx(4.0 * kMiB).epsilon(0.25));
  // Host memory comes from malloc block by block: no segments to fill.
  CHECK(find_growth({site(4, stairs)}, 20, GrowthOptions{}).suspects.empty());

  // The same stairs that stop: the last level is longer than those before.
  std::vector<int64_t> stopped;
  for (int k = 0; k < 20; ++k) stopped.push_back(238 * kMiB + (std::min(k, 11) / 3) * 12 * kMiB);
  CHECK(find_growth({site(2, stopped, kDevice)}, 20, GrowthOptions{}).suspects.empty());

  // Stairs that fall back are not a staircase: a temporary caught live.
  std::vector<int64_t> falling = stairs;
  falling[17] -= 20 * kMiB;
  falling[18] -= 20 * kMiB;
  falling[19] -= 20 * kMiB;
  CHECK(find_growth({site(3, falling, kDevice)}, 20, GrowthOptions{}).suspects.empty());
}

TEST_CASE("growth: a leak that zigzags upwards through a temporary of its site is growth", "[growth]") {
  // 512 KiB kept a step; every other step end also catches a 640 KiB
  // temporary of the same site, freed early in the next step: half the
  // changes are decreases, and a line still fits closely.
  std::vector<int64_t> live;
  for (int64_t k = 1; k <= 20; ++k) live.push_back(k * (512 << 10) + (k % 2 == 0 ? 640 << 10 : 0));
  Growth g = find_growth({site(1, live)}, 20, GrowthOptions{});
  REQUIRE(g.suspects.size() == 1);
  CHECK(g.suspects[0].monotonicity < 0.75);
  CHECK(g.suspects[0].bytes_per_step == Approx(512 << 10).epsilon(0.05));
  // Noise as large as the rise: no line fits it, and it is not growth.
  std::vector<int64_t> noisy;
  for (int64_t k = 1; k <= 20; ++k) noisy.push_back(k * (64 << 10) + (k % 2 == 0 ? 2 << 20 : 0));
  CHECK(find_growth({site(1, noisy)}, 20, GrowthOptions{}).suspects.empty());
}

TEST_CASE("growth: a temporary that falls back to where the window began is not growth", "[growth]") {
  // A DataLoader worker's sample tensor in sampled mode over 20 time
  // windows, in samples of 136 KiB: caught live at some window ends, none
  // live at others. Monotone in 13 of its 17 steps after the warm-up (the
  // level ones counted), rising in its last third, gaining four samples.
  GrowthOptions options;
  options.sampled = true;
  options.sample_interval = 139435;
  const std::vector<int64_t> samples = {0, 1, 0, 2, 2, 0, 1, 2, 0, 0, 1, 0, 0, 2, 4, 0, 1, 2, 4, 4};
  std::vector<int64_t> live;
  for (int64_t n : samples) live.push_back(n * 139435);
  CHECK(find_growth({site(1, live)}, 20, options).suspects.empty());
  // A leak of one sample every other window, under the same temporary:
  // what it keeps stays, and it is found.
  std::vector<int64_t> leaking;
  for (size_t k = 0; k < samples.size(); ++k) leaking.push_back((static_cast<int64_t>(k / 2) + samples[k]) * 139435);
  Growth g = find_growth({site(1, leaking)}, 20, options);
  REQUIRE(g.suspects.size() == 1);
  CHECK(g.suspects[0].bytes_per_step > 0.5 * 139435 / 2);
}

TEST_CASE("growth: two jumps are not steady growth, even when most pairs of steps rise", "[growth]") {
  // After the warm-up: 7 steps level, 7 one MiB higher, 4 another MiB higher.
  std::vector<int64_t> live(20, 0);
  for (size_t k = 9; k < 20; ++k) live[k] = k < 16 ? 1 << 20 : 2 << 20;
  CHECK(theil_sen_slope(std::vector<double>(live.begin() + 2, live.end())) > 0);
  CHECK(find_growth({site(1, live)}, 20, GrowthOptions{}).suspects.empty());
}

TEST_CASE("growth: suspects are the steepest first, at most max_suspects", "[growth]") {
  GrowthOptions options;
  options.max_suspects = 2;
  Growth g = find_growth({site(1, linear(20, 4096)), site(2, linear(20, 65536)), site(3, linear(20, 8192))}, 20, options);
  REQUIRE(g.suspects.size() == 2);
  CHECK(g.suspects[0].site.stack == 2);
  CHECK(g.suspects[1].site.stack == 3);
}

TEST_CASE("growth: in sampled mode a host site must gain four sample intervals", "[growth]") {
  GrowthOptions options;
  options.sampled = true;
  options.sample_interval = 512 << 10;
  // 3 intervals' worth over the window: sampling noise.
  Growth small = find_growth({site(1, linear(20, (3 * 512 << 10) / 17))}, 20, options);
  CHECK(small.suspects.empty());
  Growth large = find_growth({site(1, linear(20, 512 << 10))}, 20, options);
  CHECK(large.suspects.size() == 1);
  // The rule is for host sites only: device allocations are all recorded.
  Growth device = find_growth({site(1, linear(20, (3 * 512 << 10) / 17), 1)}, 20, options);
  CHECK(device.suspects.size() == 1);
}

TEST_CASE("growth: a site must gain the options' minimum over the window", "[growth]") {
  GrowthOptions options;
  // 112 B a step over 20 steps (a library's lazily filled cache): growth by
  // the default floor of 1 KiB over the window, not with inferred steps.
  Growth marked = find_growth({site(1, linear(20, 112))}, 20, options);
  CHECK(marked.suspects.size() == 1);
  options.min_growth = kMinAutoStepGrowth;
  Growth automatic = find_growth({site(1, linear(20, 112))}, 20, options);
  CHECK(automatic.suspects.empty());
  Growth leak = find_growth({site(1, linear(20, 4096))}, 20, options);
  CHECK(leak.suspects.size() == 1);
}

// One leak per step made under one line of the program, by one of two
// paths: a library copies the block (site 1) or, now and then, keeps the
// one it was given (site 2, three steps in twenty, none in the last four).
// Site 2 alone is not steady growth; the line's sum is.
TEST_CASE("growth: the stacks of one program line are judged together", "[growth]") {
  const int64_t block = 256 << 10;
  std::vector<int64_t> copied, kept;
  for (int64_t k = 1, c = 0, p = 0; k <= 20; ++k) {
    (k == 6 || k == 11 || k == 16 ? p : c) += block;
    copied.push_back(c);
    kept.push_back(p);
  }
  auto judge = [&](const char* line_of_kept) {
    GrowthOptions options;
    options.line_of = [&](const SiteAcc& s) { return std::string(s.stack == 1 ? "line 87" : line_of_kept); };
    std::vector<std::pair<uint32_t, double>> out;
    for (const LeakSuspect& s : find_growth({site(1, copied), site(2, kept)}, 20, options).suspects) {
      out.emplace_back(s.site.stack, s.bytes_per_step);
    }
    return out;
  };
  CHECK(find_growth({site(2, kept)}, 20, GrowthOptions{}).suspects.empty());
  const auto together = judge("line 87");
  REQUIRE(together.size() == 2);
  CHECK(together[0].first == 1);
  CHECK(together[1].first == 2);
  // The two slopes add up to the line's: one block a step.
  CHECK(together[0].second + together[1].second == Approx(block));
  // Another line, or none known: the copies alone.
  for (const char* other : {"line 42", ""}) {
    const auto apart = judge(other);
    REQUIRE(apart.size() == 1);
    CHECK(apart[0].first == 1);
    CHECK(apart[0].second < 0.9 * block);
  }
}

// A block handed from one stack of a line to another (the first keeps it,
// the second lets its own go at the same steps): the line does not grow,
// and the stack that rose is no suspect for it.
TEST_CASE("growth: a line whose stacks' sum is level adds no suspect", "[growth]") {
  std::vector<int64_t> rose, fell;
  for (int64_t k = 1, r = 0; k <= 20; ++k) {
    r += (k == 6 || k == 11 || k == 16) ? 65536 : 0;
    rose.push_back(r);
    fell.push_back(3 * 65536 - r);
  }
  GrowthOptions options;
  options.line_of = [](const SiteAcc&) { return std::string("line 12"); };
  CHECK(fit_line(std::vector<double>(rose.begin() + 2, rose.end())).slope > 0);
  CHECK(find_growth({site(1, rose), site(2, fell)}, 20, options).suspects.empty());
}

TEST_CASE("growth: too few steps, or none, are said rather than judged", "[growth]") {
  Growth few = find_growth({site(1, linear(3, 1 << 20))}, 3, GrowthOptions{});
  CHECK(few.suspects.empty());
  CHECK(few.note == "only 3 steps after 1 warm-up steps: too few to judge growth (need at least 3 after warm-up)");
  Growth none = find_growth({}, 0, GrowthOptions{});
  CHECK(none.note.find("no steps were recorded") == 0);
}

TEST_CASE("growth: least squares and Theil-Sen slopes", "[growth]") {
  CHECK(fit_line({1, 3, 5, 7}).slope == Approx(2));
  CHECK(fit_line({1, 3, 5, 7}).intercept == Approx(1));
  // One wild point swings least squares, not Theil-Sen.
  const std::vector<double> y = {0, 1, 2, 3, 4, 5, 6, 7, 8, 1000};
  CHECK(theil_sen_slope(y) == Approx(1));
  CHECK(fit_line(y).slope > 30);
  CHECK(theil_sen_slope({5, 5, 5, 9, 5, 5}) == 0);
}
