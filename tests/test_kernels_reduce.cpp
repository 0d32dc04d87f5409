// The element-wise reductions of the shared-memory collectives
// (reduce_arrays), against a plain left-to-right fold computed here: every
// dtype and op, 1 to 9 sources (the one-pass groups of up to four and the
// passes after them), counts around the tiles and pieces, a destination
// off its alignment, written through the caches or past them. The
// collectives' own tests run at 1-4 ranks; this one covers more sources
// than ranks there, and runs again with the vector unit capped
// (kernels-avx2, kernels-baseline).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/reduce.hpp"
#include "shardopt/half.hpp"

using namespace shardopt;

namespace {

// One NaN for every input, so that which operand's NaN survives cannot
// change a bit.
const float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class A>
A fold(ReduceOp op, A x, A y) {
  switch (op) {
    case ReduceOp::max:
      if constexpr (std::is_floating_point_v<A>) {
        if (std::isnan(x)) return x;
        if (std::isnan(y)) return y;
      }
      return x > y ? x : y;
    case ReduceOp::min:
      if constexpr (std::is_floating_point_v<A>) {
        if (std::isnan(x)) return x;
        if (std::isnan(y)) return y;
      }
      return x < y ? x : y;
    default:
      return x + y;
  }
}

// Element i of every source folded left to right in A (the type's own
// arithmetic, f32 for the 16-bit types), avg dividing at the end.
template <class T, class A>
A expect(const std::vector<std::vector<T>>& in, std::size_t i, ReduceOp op, A (*widen)(T)) {
  A acc = widen(in[0][i]);
  for (std::size_t q = 1; q < in.size(); ++q) acc = fold(op, acc, widen(in[q][i]));
  if constexpr (std::is_floating_point_v<A>) {
    if (op == ReduceOp::avg) acc /= static_cast<A>(in.size());
  }
  return acc;
}

template <class T>
T draw(std::mt19937_64& rng, bool nan) {
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  const float x = nan ? kNaN : d(rng);
  if constexpr (std::is_same_v<T, bfloat16>)
    return bf16_from_float(x);
  else if constexpr (std::is_same_v<T, float16>)
    return f16_from_float(x);
  else if constexpr (std::is_integral_v<T>)
    return static_cast<T>(std::uniform_int_distribution<int>(-1000, 1000)(rng));
  else
    return static_cast<T>(x);
}

template <class T>
void check_type(DType t) {
  std::mt19937_64 rng(7 + static_cast<int>(t));
  const bool is_float = !std::is_integral_v<T>;
  for (int n = 1; n <= 9; ++n) {
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{255}, std::size_t{257},
          std::size_t{1025}, std::size_t{8193}, std::size_t{20011}}) {
      std::vector<std::vector<T>> in(static_cast<std::size_t>(n), std::vector<T>(count));
      std::bernoulli_distribution nan(0.01);
      for (auto& v : in)
        for (T& x : v) x = draw<T>(rng, is_float && nan(rng));
      std::vector<const void*> src;
      for (const auto& v : in) src.push_back(v.data());
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        if (op == ReduceOp::avg && !is_float) continue;
        for (bool stream : {false, true}) {
          INFO(dtype_name(t) << " " << reduce_op_name(op) << ", " << n << " sources, " << count
                             << " elements" << (stream ? ", streamed" : ""));
          // One element in: the destination off its alignment.
          std::vector<T> out(count + 1);
          kernels::cpu::reduce_arrays(t, op, src.data(), n, out.data() + 1, count, stream);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < count; ++i) {
            T want;
            if constexpr (std::is_same_v<T, bfloat16>) {
              want = bf16_from_float(expect<T, float>(in, i, op, [](T x) { return to_float(x); }));
            } else if constexpr (std::is_same_v<T, float16>) {
              want = f16_from_float(expect<T, float>(in, i, op, [](T x) { return to_float(x); }));
            } else {
              want = expect<T, T>(in, i, op, [](T x) { return x; });
            }
            if (std::memcmp(&want, &out[i + 1], sizeof(T)) != 0) ++wrong;
          }
          CHECK(wrong == 0);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("shared-memory reductions fold every source left to right, bitwise",
          "[kernels][shm-reduce]") {
  check_type<float>(DType::f32);
  check_type<double>(DType::f64);
  check_type<std::int32_t>(DType::i32);
  check_type<std::int64_t>(DType::i64);
  check_type<bfloat16>(DType::bf16);
  check_type<float16>(DType::f16);
}
