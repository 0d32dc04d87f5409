// The sum of squares: bitwise the same for any thread count, equal to the
// reference, and close to an exact sum.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/norm.hpp"

using namespace shardopt;

TEST_CASE("sum of squares: CPU equals reference bitwise for 1, 2 and 3 threads",
          "[kernels][norm]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  const int saved = omp_get_max_threads();
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{17}, kernels::kNormBlock - 1,
        kernels::kNormBlock + 1, std::size_t{3} * kernels::kNormBlock + 5, std::size_t{1000003}}) {
    std::vector<float> x(n);
    for (auto& v : x) v = u(rng);
    std::vector<bfloat16> xb;
    std::vector<float16> xh;
    for (float v : x) {
      xb.push_back(bf16_from_float(v));
      xh.push_back(f16_from_float(v));
    }
    const std::pair<const void*, DType> inputs[] = {
        {x.data(), DType::f32}, {xb.data(), DType::bf16}, {xh.data(), DType::f16}};
    for (const auto& [data, type] : inputs) {
      const double ref = kernels::reference::sum_squares(data, type, n);
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        const double got = kernels::cpu::sum_squares(data, type, n);
        INFO("n " << n << " type " << dtype_name(type) << " threads " << threads);
        CHECK(std::memcmp(&got, &ref, sizeof got) == 0);
      }
    }
    // Against a long double sum of exact squares: relative 1e-13 at most.
    long double exact = 0;
    for (float v : x) exact += static_cast<long double>(v) * v;
    const double got = kernels::reference::sum_squares(x.data(), DType::f32, n);
    CHECK(std::fabs(static_cast<long double>(got) - exact) <= 1e-13L * exact);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("sum of squares: non-finite values propagate", "[kernels][norm]") {
  std::vector<float> x(100000, 1.0f);
  x[54321] = INFINITY;
  CHECK(std::isinf(kernels::cpu::sum_squares(x.data(), DType::f32, x.size())));
  x[54321] = NAN;
  CHECK(std::isnan(kernels::cpu::sum_squares(x.data(), DType::f32, x.size())));
  CHECK(std::isnan(kernels::reference::sum_squares(x.data(), DType::f32, x.size())));
}

TEST_CASE("two sums of squares in one pass equal two single sums bitwise", "[kernels][norm]") {
  // lane_sum_squares2 keeps float arrays' lanes in vector registers; any
  // other indexable type takes the element loop. Both must give the lane
  // order of lane_sum_squares (which the CUDA LAMB kernel uses).
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  struct Indexed {  // not a pointer: the element loop
    const float* p;
    float operator[](std::size_t i) const { return p[i]; }
  };
  for (std::size_t count : {0, 1, 15, 16, 17, 33, 255, 2048, 2047}) {
    std::vector<float> x(count + 3), y(count + 3);
    for (auto& v : x) v = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (auto& v : y) v = u(rng);
    for (std::size_t begin : {0, 3}) {
      if (begin + count > x.size()) continue;
      const double want_x = kernels::lane_sum_squares(x.data(), begin, count);
      const double want_y = kernels::lane_sum_squares(y.data(), begin, count);
      double sx = -1, sy = -1;
      kernels::lane_sum_squares2(static_cast<const float*>(x.data()), y.data(), begin, count, sx,
                                 sy);
      INFO("count " << count << " begin " << begin);
      CHECK(std::memcmp(&sx, &want_x, sizeof sx) == 0);
      CHECK(std::memcmp(&sy, &want_y, sizeof sy) == 0);
      kernels::lane_sum_squares2(Indexed{x.data()}, Indexed{y.data()}, begin, count, sx, sy);
      CHECK(std::memcmp(&sx, &want_x, sizeof sx) == 0);
      CHECK(std::memcmp(&sy, &want_y, sizeof sy) == 0);
    }
  }
}
