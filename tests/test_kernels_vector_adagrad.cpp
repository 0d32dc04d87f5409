// The CUDA kernels' vector steps of Adagrad and Lion, on the CPU, against the
// reference kernels (tests/vector_steps.hpp).
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/adagrad.hpp"
#include "kernels/lion.hpp"
#include "vector_steps.hpp"

using namespace shardopt;
using namespace shardopt::kernels;
using namespace shardopt::test;

TEST_CASE("Vector steps equal the reference kernels: Adagrad and Lion", "[kernels][vector]") {
  each_grad_and_storage([](DType gt, int storage) {
    for (bool wd : {false, true}) {
      const auto s = make_adagrad_scalars(0.05, 0.01, wd ? 0.1 : 0.0, 1e-10, wd, 3, 0.5);
      compare_step<Adagrad>("Adagrad", "", gt, storage, s,
                            [](auto& b, Arena& a) { b.sum = a.fp(1); });
    }
    const auto s = make_lion_scalars(1e-3, 0.9, 0.99, 0.1, storage == 2, 0.5);
    compare_step<Lion>("Lion", "", gt, storage, s, [](auto& b, Arena& a) { b.exp_avg = a.fp(1); });
  });
}
