// The CUDA kernels' vector steps of RMSprop, on the CPU, against the reference
// kernels (tests/vector_steps.hpp).
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/rmsprop.hpp"
#include "vector_steps.hpp"

using namespace shardopt;
using namespace shardopt::kernels;
using namespace shardopt::test;

TEST_CASE("Vector steps equal the reference kernels: RMSprop", "[kernels][vector]") {
  each_grad_and_storage([](DType gt, int storage) {
    for (int mode = 0; mode < 8; ++mode) {
      const bool centered = mode & 1, mom = mode & 2;
      const auto s = make_rmsprop_scalars(0.01, 0.99, 1e-8, (mode & 4) ? 0.1 : 0.0, mom ? 0.9 : 0.0,
                                          centered, mode == 5, 0.5);
      compare_step<RMSprop>("RMSprop", " mode " + std::to_string(mode), gt, storage, s,
                            [&](auto& b, Arena& a) {
                              b.square_avg = a.fp(1);
                              b.grad_avg = centered ? a.fp(2) : nullptr;
                              b.momentum_buffer = mom ? a.fp(3) : nullptr;
                            });
    }
  });
}
