#include "sampling.h"

#include <cmath>
#include <cstdio>

#include "analysis.h"

namespace memledger::report {

SampleEstimate sampled_allocation(double size, uint64_t interval) {
  SampleEstimate e;
  e.bytes = size;
  if (interval == 0 || size >= static_cast<double>(interval) || size <= 0) return e;
  const double p = -std::expm1(-size / static_cast<double>(interval));
  e.count = 1 / p;
  e.bytes = size / p;
  e.count_variance = (1 - p) / (p * p);
  e.bytes_variance = size * size * e.count_variance;
  return e;
}

SampleEstimate sampled_weight(uint64_t weight, uint64_t interval) {
  if (interval == 0 || weight == 0) return sampled_allocation(static_cast<double>(weight), interval);
  // weight / interval = x / (1 - exp(-x)) with x = size / interval, which
  // rises from 1 at x = 0 and lies between x and x + 1: bisect.
  const double y = static_cast<double>(weight) / static_cast<double>(interval);
  double lo = std::max(0.0, y - 1), hi = y;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    const double f = mid <= 0 ? 1 : mid / -std::expm1(-mid);
    (f < y ? lo : hi) = mid;
  }
  return sampled_allocation((lo + hi) / 2 * static_cast<double>(interval), interval);
}

namespace {

// Decimals that keep two significant digits of `error`.
int decimals_for(double error) {
  if (error <= 0) return 1;
  const int d = 1 - static_cast<int>(std::floor(std::log10(error)));
  return d < 0 ? 0 : d > 3 ? 3 : d;
}

// `value` and `error` rounded to the place of the error's second digit
// (whole units at least, where the error is 10 or more).
std::string with_error(double value, double error, const char* unit) {
  char buf[96];
  const int d = decimals_for(error);
  if (d == 0) {
    const double place = std::pow(10, std::floor(std::log10(error)) - 1);
    value = std::round(value / place) * place;
    error = std::round(error / place) * place;
  }
  std::snprintf(buf, sizeof buf, "%.*f \u00b1 %.*f%s", d, value, d, error, unit);
  return buf;
}

}  // namespace

std::string bytes_with_error(double value, double error) {
  if (!(error > 0)) return human_bytes(value);
  const char* units[] = {" B", " KiB", " MiB", " GiB", " TiB"};
  int u = 0;
  double scale = 1;
  while (std::fabs(value) / scale >= 1024 && u < 4) {
    scale *= 1024;
    ++u;
  }
  return with_error(value / scale, error / scale, units[u]);
}

std::string number_with_error(double value, double error) {
  if (!(error > 0)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", value);
    return buf;
  }
  return with_error(value, error, "");
}

}  // namespace memledger::report
