// shardopt-bench-comm: the element types and the input data, which every
// rank can compute for every rank, so that each checks its output alone.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../support/optim_steps.hpp"
#include "options.hpp"

namespace bench_comm {

// ---------------------------------------------------------------------------
// Element types

// The largest magnitude M such that every integer in [-M, M] is exact in T.
template <class T>
constexpr std::int64_t exact_integer_limit() {
  if constexpr (std::is_same_v<T, float>) {
    return std::int64_t{1} << 24;
  } else if constexpr (std::is_same_v<T, double>) {
    return std::int64_t{1} << 53;
  } else if constexpr (std::is_same_v<T, shardopt::bfloat16>) {
    return 256;
  } else if constexpr (std::is_same_v<T, shardopt::float16>) {
    return 2048;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return std::numeric_limits<std::int32_t>::max();
  } else {
    return std::int64_t{1} << 62;
  }
}

// Exact for |v| <= exact_integer_limit<T>().
template <class T>
T from_integer(std::int64_t v) {
  if constexpr (std::is_same_v<T, shardopt::bfloat16>) {
    return shardopt::bf16_from_float(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, shardopt::float16>) {
    return shardopt::f16_from_float(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// A value outside every input and result: NaN for floating types, the most
// negative value for integers. Output buffers are filled with it before the
// checked run, so an element the collective did not write is counted wrong.
template <class T>
T sentinel() {
  if constexpr (std::is_same_v<T, shardopt::bfloat16>) {
    return shardopt::bfloat16{0x7fc0};
  } else if constexpr (std::is_same_v<T, shardopt::float16>) {
    return shardopt::float16{0x7e00};
  } else if constexpr (std::is_floating_point_v<T>) {
    return std::numeric_limits<T>::quiet_NaN();
  } else {
    return std::numeric_limits<T>::min();
  }
}

template <class T>
bool equals_integer(T got, std::int64_t expected) {
  if constexpr (std::is_same_v<T, shardopt::bfloat16> || std::is_same_v<T, shardopt::float16>) {
    return shardopt::to_float(got) == static_cast<float>(expected);
  } else if constexpr (std::is_floating_point_v<T>) {
    return got == static_cast<T>(expected);  // NaN never equals
  } else {
    return static_cast<std::int64_t>(got) == expected;
  }
}

// ---------------------------------------------------------------------------
// Input data

// Rank r's input element i is value(r, i): a random integer u in
// [-range, range] times `scale`, zero unless (i + r) % stride == 0. Any rank
// can compute any rank's input, so each checks its output on its own.
//
// The range is chosen so that every partial sum over the ranks is an integer
// exact in the type, whatever the order of the reduction: for sum, ranks *
// range <= limit; for avg, inputs are multiples of the number of ranks
// (scale = ranks), so the average sum / ranks is the integer sum of the u.
// Where even range 1 is too much (bf16 beyond 256 ranks), only every
// stride-th rank contributes to an element.
class InputData {
 public:
  InputData(int nranks, std::int64_t exact_limit, ReduceOp op) {
    scale_ = op == ReduceOp::avg ? nranks : 1;
    const std::int64_t per_term = exact_limit / (static_cast<std::int64_t>(nranks) * scale_);
    if (per_term >= 1) {
      range_ = per_term;
    } else {
      const std::int64_t terms = std::max<std::int64_t>(1, exact_limit / scale_);
      stride_ = (nranks + terms - 1) / terms;
    }
    keys_.resize(static_cast<std::size_t>(nranks));
    for (int r = 0; r < nranks; ++r)
      keys_[r] = bench::mix64(kSeed ^ bench::mix64(static_cast<std::uint64_t>(r)));
  }

  std::int64_t value(int rank, std::size_t i) const {
    if (stride_ > 1 && (i + static_cast<std::size_t>(rank)) % stride_ != 0) return 0;
    const std::uint64_t h = bench::mix64(keys_[rank] + i);
    const auto span = static_cast<std::uint64_t>(2 * range_ + 1);
    // Multiply-shift maps the top 32 bits onto [0, span) without a division.
    const std::uint64_t u = span <= (std::uint64_t{1} << 32) ? ((h >> 32) * span) >> 32 : h % span;
    return (static_cast<std::int64_t>(u) - range_) * scale_;
  }

 private:
  std::int64_t range_ = 1;
  std::int64_t scale_ = 1;
  std::int64_t stride_ = 1;
  std::vector<std::uint64_t> keys_;
};

}  // namespace bench_comm
