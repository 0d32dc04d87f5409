// The CUDA kernels' vector steps of SGD, on the CPU, against the reference
// kernels (tests/vector_steps.hpp).
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/sgd.hpp"
#include "vector_steps.hpp"

using namespace shardopt;
using namespace shardopt::kernels;
using namespace shardopt::test;

TEST_CASE("Vector steps equal the reference kernels: SGD, first step and later",
          "[kernels][vector]") {
  each_grad_and_storage([](DType gt, int storage) {
    for (int mode = 0; mode < 8; ++mode)
      for (std::int64_t step : {1, 2}) {
        const bool mom = mode & 1;
        const auto s = make_sgd_scalars(0.01, mom ? 0.9 : 0.0, 0.0, (mode & 2) ? 0.1 : 0.0,
                                        mom && (mode & 4), mode == 3, step, 0.5);
        compare_step<SGD>("SGD", " mode " + std::to_string(mode) + " step " + std::to_string(step),
                          gt, storage, s,
                          [&](auto& b, Arena& a) { b.momentum_buffer = mom ? a.fp(1) : nullptr; });
      }
  });
}
