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
  for (DType gt : kGradTypes)
    for (int storage = 0; storage < 4; ++storage) {
      const std::string where =
          " grad " + std::string(dtype_name(gt)) + " storage " + std::to_string(storage);
      for (bool wd : {false, true}) {
        const auto s = make_adagrad_scalars(0.05, 0.01, wd ? 0.1 : 0.0, 1e-10, wd, 3, 0.5);
        compare("Adagrad" + where,
                [&](Arena& a, bool emulate, std::size_t threads, std::size_t chunk) {
                  AdagradBuffers b;
                  set_grad(b, a, gt);
                  b.sum = a.fp(1);
                  set_params(b, a, storage);
                  b.n = a.f[0].size() - 4;
                  if (!emulate) return reference::step<Adagrad>(b, s);
                  return kernels::Kernel<Adagrad>::dispatch(
                      b, s, [&]<class Loop>() { return like_cuda<Loop>(b, s, threads, chunk); });
                });
      }
      const auto s = make_lion_scalars(1e-3, 0.9, 0.99, 0.1, storage == 2, 0.5);
      compare("Lion" + where, [&](Arena& a, bool emulate, std::size_t threads, std::size_t chunk) {
        LionBuffers b;
        set_grad(b, a, gt);
        b.exp_avg = a.fp(1);
        set_params(b, a, storage);
        b.n = a.f[0].size() - 4;
        if (!emulate) return reference::step<Lion>(b, s);
        return kernels::Kernel<Lion>::dispatch(
            b, s, [&]<class Loop>() { return like_cuda<Loop>(b, s, threads, chunk); });
      });
    }
}
