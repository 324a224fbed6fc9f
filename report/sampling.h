// What one sampled host allocation stands for. Sampled host mode records
// allocations Poisson-by-bytes (interposer/recorder.cpp): with a mean
// interval of T bytes, an allocation of s bytes is recorded with
// probability p = 1 - exp(-s/T), so each recorded one stands for 1/p
// allocations and s/p bytes (the Horvitz-Thompson estimate, unbiased), and
// adds (1-p)/p^2 and s^2 (1-p)/p^2 to the variance of those estimates.
// Allocations of T bytes or more are recorded every time (p = 1).
//
// The one place the report turns a sampled record into figures: the
// replay's estimated bytes and counts, and their uncertainty, come from here.
#pragma once

#include <cstdint>
#include <string>

namespace memledger::report {

struct SampleEstimate {
  double bytes = 0;           // bytes the record stands for
  double count = 1;           // allocations it stands for
  double bytes_variance = 0;  // its share of the variance of a sum of `bytes`
  double count_variance = 0;
};

// A record of `size` bytes made with probability 1 - exp(-size/interval).
SampleEstimate sampled_allocation(double size, uint64_t interval);

// A record whose weight (size / p, as the recorder wrote it) is `weight`:
// its size is found again from the weight (the trace reader keeps the weight).
SampleEstimate sampled_weight(uint64_t weight, uint64_t interval);

// "64 ± 12 KiB" (binary units), the uncertainty (one standard deviation)
// rounded to two significant digits and the value to the same place; just
// the value (human_bytes) when the uncertainty is 0.
std::string bytes_with_error(double value, double error);
// "1.0 ± 0.2", rounded the same way.
std::string number_with_error(double value, double error);

}  // namespace memledger::report
