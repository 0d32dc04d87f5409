// shardopt apps: the numbers the programs report: medians of timed
// samples, numbers for their JSON rows, and a hash of their parameters to
// compare across ranks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
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

// A JSON number in a printf format for one double, or null for inf and
// nan (which JSON cannot represent).
inline std::string json_number(double x, const char* format = "%.6g") {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

// Fixed-notation number for JSON (finite only; null otherwise).
inline std::string num(double x, int digits) {
  char format[16];
  std::snprintf(format, sizeof format, "%%.%df", digits);
  return json_number(x, format);
}

// FNV-1a over `bytes` bytes, continuing from h (kFnv1aBasis to start):
// equal parameters on every rank give equal hashes.
constexpr std::uint64_t kFnv1aBasis = 0xcbf29ce484222325ULL;

inline std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t h = kFnv1aBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace report
