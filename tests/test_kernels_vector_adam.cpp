// The CUDA kernels' vector steps of Adam, AdamW and LAMB (both passes), on the
// CPU, against the reference kernels (tests/vector_steps.hpp).
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/adam.hpp"
#include "kernels/lamb_loop.hpp"
#include "vector_steps.hpp"

using namespace shardopt;
using namespace shardopt::kernels;
using namespace shardopt::test;

TEST_CASE("Vector steps equal the reference kernels: Adam", "[kernels][vector]") {
  g_vector_ranges = 0;
  each_grad_and_storage([](DType gt, int storage) {
    for (int wd = 0; wd < 3; ++wd)
      for (bool ams : {false, true}) {
        const auto s = make_adam_scalars(0.01, 0.9, 0.999, 1e-8, wd ? 0.1 : 0.0, wd == 2, ams,
                                         storage == 1, 3, 0.5);
        compare_step<Adam>("Adam", " wd " + std::to_string(wd) + " ams " + std::to_string(ams), gt,
                           storage, s, [&](auto& b, Arena& a) {
                             b.exp_avg = a.fp(1);
                             b.exp_avg_sq = a.fp(2);
                             b.max_exp_avg_sq = ams ? a.fp(3) : nullptr;
                           });
      }
  });
  CHECK(g_vector_ranges > 0);
}

TEST_CASE("Vector steps equal the reference kernels: LAMB's two passes", "[kernels][vector]") {
  for (DType gt : kGradTypes)
    for (bool remainders : {false, true}) {
      const auto s = make_lamb_scalars(0.9, 0.999, 1e-6, 0.01, remainders, 3, 0.5);
      compare("LAMB direction grad " + std::string(dtype_name(gt)) + " remainders " +
                  std::to_string(remainders),
              [&](Arena& a, bool emulate, std::size_t threads, std::size_t chunk) {
                LambBuffers b;
                b.param = remainders ? nullptr : a.fp(0);
                b.param_bf16 = remainders ? reinterpret_cast<const bfloat16*>(a.hp(3)) : nullptr;
                b.remainder = remainders ? a.hp(4) : nullptr;
                set_grad(b, a, gt);
                b.exp_avg = a.fp(1);
                b.exp_avg_sq = a.fp(2);
                b.update = a.fp(5);
                b.n = a.f[0].size() - 4;
                if (!emulate) return reference::lamb_direction(b, s).grads_finite;
                return kd::dispatch_lamb_direction(
                    b, [&]<class Loop>() { return like_cuda<Loop>(b, s, threads, chunk); });
              });
    }
  for (int storage = 0; storage < 4; ++storage) {
    const float neg_step = -0.0123f;
    compare("LAMB apply storage " + std::to_string(storage),
            [&](Arena& a, bool emulate, std::size_t threads, std::size_t chunk) {
              LambApplyBuffers b;
              set_params(b, a, storage);
              b.update = a.fp(5);
              b.n = a.f[0].size() - 4;
              if (!emulate) {
                reference::lamb_apply(b, neg_step);
                return true;
              }
              return kd::dispatch_lamb_apply(
                  b, [&]<class Loop>() { return like_cuda<Loop>(b, neg_step, threads, chunk); });
            });
  }
}
