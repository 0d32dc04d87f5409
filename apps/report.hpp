// shardopt apps: the numbers the benchmarks report: medians of timed
// samples, and numbers for their JSON rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace report {

// The median of t (the mean of the middle two for an even count); t must
// not be empty.
inline double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  const std::size_t n = t.size();
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

// Median, min and max of samples in seconds, in microseconds; all 0 for no
// samples.
struct Stats {
  double median_us = 0, min_us = 0, max_us = 0;
};

inline Stats stats_of(std::vector<double> t) {
  Stats s;
  if (t.empty()) return s;
  const auto [lo, hi] = std::minmax_element(t.begin(), t.end());
  s.min_us = 1e6 * *lo;
  s.max_us = 1e6 * *hi;
  s.median_us = 1e6 * median(std::move(t));
  return s;
}

// Fixed-notation number for JSON (finite only; null otherwise).
inline std::string num(double x, int digits) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace report
