// The host parts of the CUDA kernels, on the CPU: the launch tables of the
// multi-tensor kernels cover every element exactly once within their limits;
// the vector steps' common start of aligned buffers, and each buffer's
// access. The vector steps themselves against the reference kernels:
// tests/test_kernels_vector_*.cpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/adam.hpp"
#include "kernels/lamb_loop.hpp"
#include "kernels/multi_tensor.hpp"
#include "kernels/sgd.hpp"
#include "kernels/vector_step.hpp"
#include "optim_helpers.hpp"

using namespace shardopt;
using namespace shardopt::kernels;
namespace kd = shardopt::kernels::detail;

namespace {

// Checks a plan against the sizes and limits; returns the number of launches.
std::size_t check_plan(const std::vector<std::size_t>& sizes, const MultiTensorLimits& limits) {
  const std::vector<MultiTensorLaunch> plan = plan_multi_tensor(sizes, limits);
  std::vector<std::vector<int>> seen(sizes.size());
  for (std::size_t t = 0; t < sizes.size(); ++t) seen[t].assign(sizes[t], 0);
  std::size_t last_tensor = 0, last_index = 0;
  bool any = false;
  for (const MultiTensorLaunch& l : plan) {
    REQUIRE(!l.chunks.empty());
    REQUIRE(l.chunks.size() <= limits.max_chunks);
    REQUIRE(!l.tensors.empty());
    REQUIRE(l.tensors.size() <= limits.max_tensors);
    for (std::size_t t = 0; t < l.tensors.size(); ++t) {
      REQUIRE(l.tensors[t] < sizes.size());
      REQUIRE(sizes[l.tensors[t]] > 0);
      if (t > 0) REQUIRE(l.tensors[t] > l.tensors[t - 1]);
    }
    std::vector<bool> used(l.tensors.size(), false);
    for (const TensorChunk& c : l.chunks) {
      REQUIRE(c.tensor < l.tensors.size());
      used[c.tensor] = true;
      const std::size_t t = l.tensors[c.tensor];
      const std::size_t begin = static_cast<std::size_t>(c.index) * limits.chunk_elements;
      REQUIRE(begin < sizes[t]);
      // Chunks come in list order, each tensor's in order.
      if (any) REQUIRE((t > last_tensor || (t == last_tensor && c.index > last_index)));
      any = true;
      last_tensor = t;
      last_index = c.index;
      const std::size_t end = std::min(sizes[t], begin + limits.chunk_elements);
      for (std::size_t i = begin; i < end; ++i) ++seen[t][i];
    }
    for (bool u : used) REQUIRE(u);  // no table entry without a chunk
  }
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    std::size_t wrong = 0;
    for (int k : seen[t]) wrong += k != 1;
    INFO("tensor " << t << " of " << sizes[t] << " elements");
    REQUIRE(wrong == 0);
  }
  return plan.size();
}

}  // namespace

// Host code of the CUDA launches, the same on every CPU: tagged [plan], not
// [kernels], so that the reruns of the kernel tests at other vector units
// (tests/meson.build) leave them out.
TEST_CASE("Multi-tensor plan: every element of every tensor once, within the limits",
          "[plan][multi]") {
  std::mt19937_64 rng(3);
  std::vector<std::vector<std::size_t>> lists = {
      {},
      {0},
      {0, 0, 5},
      {1},
      {kMultiTensorChunk},
      {kMultiTensorChunk + 1},
      {1, 7, 1000, 65537, 0, 200000},
  };
  std::vector<std::size_t> many(300);
  for (std::size_t& n : many) n = std::uniform_int_distribution<std::size_t>(0, 3000)(rng);
  lists.push_back(many);
  const std::vector<MultiTensorLimits> limits = {
      {kMultiTensorChunk, 24, 253}, {8, 3, 5}, {4, 1, 1}, {16, 100, 2}, {1024, 7, 64}};
  for (const auto& sizes : lists) {
    for (const MultiTensorLimits& l : limits) {
      INFO(sizes.size() << " tensors, chunk " << l.chunk_elements << ", tensors " << l.max_tensors
                        << ", chunks " << l.max_chunks);
      check_plan(sizes, l);
    }
  }
  // A table full of tensors starts a new launch; so does a full chunk list.
  CHECK(check_plan({4, 4, 4, 4, 4}, {4, 2, 100}) == 3);
  CHECK(check_plan({40}, {4, 2, 3}) == 4);
  CHECK(plan_multi_tensor(std::vector<std::size_t>{0, 0}, {4, 1, 1}).empty());
}

TEST_CASE("Multi-tensor plan rejects limits that hold no chunk", "[plan][multi]") {
  const std::vector<std::size_t> sizes = {5};
  CHECK_THROWS_AS(plan_multi_tensor(sizes, {0, 1, 1}), std::invalid_argument);
  CHECK_THROWS_AS(plan_multi_tensor(sizes, {6, 1, 1}), std::invalid_argument);
  CHECK_THROWS_AS(plan_multi_tensor(sizes, {4, 0, 1}), std::invalid_argument);
  CHECK_THROWS_AS(plan_multi_tensor(sizes, {4, 1, 0}), std::invalid_argument);
}

TEST_CASE("Vector head: the common start of aligned groups, or none", "[kernels][vector]") {
  using Loop = kd::ElementLoop<kernels::AdamStep<WeightDecay::none, false>, bfloat16,
                               MasterParams<bfloat16>>;
  alignas(16) float f[3][12] = {};
  alignas(16) std::uint16_t h[2][12] = {};
  const AdamScalars s{};
  AdamBuffers b;
  b.grad_type = DType::bf16;
  b.n = 8;
  const auto at = [&](std::size_t pf, std::size_t ph) {
    b.param = f[0] + pf;
    b.exp_avg = f[1] + pf;
    b.exp_avg_sq = f[2] + pf;
    b.grad = h[0] + ph;
    b.param_out = h[1] + ph;
    return kd::vector_head<Loop>(b, s);
  };
  CHECK(at(0, 0) == 0);
  CHECK(at(1, 1) == 3);
  CHECK(at(2, 2) == 2);
  CHECK(at(3, 3) == 1);
  CHECK(at(4, 0) == 0);  // 16 bytes further: still aligned
  CHECK(at(1, 0) == -1);
  CHECK(at(0, 2) == -1);
  b.exp_avg = reinterpret_cast<float*>(reinterpret_cast<char*>(f[1]) + 2);  // not even a float
  b.param = f[0];
  b.exp_avg_sq = f[2];
  b.grad = h[0];
  b.param_out = h[1];
  CHECK(kd::vector_head<Loop>(b, s) == -1);
  // Null buffers do not count; gradients whose size disagrees with the loop's
  // type never take the vector path.
  AdamBuffers none;
  none.n = 8;
  CHECK(kd::vector_head<Loop>(none, s) == 0);
  b.exp_avg = f[1];
  b.grad_type = DType::f32;
  CHECK(kd::vector_head<Loop>(b, s) == -1);
}

TEST_CASE("Each buffer's access: write-only and read-only buffers", "[kernels][vector]") {
  const auto accesses = [](auto& b, auto visit) {
    std::vector<Access> out;
    visit(b, [&](auto*&, std::size_t, Access a) { out.push_back(a); });
    return out;
  };
  AdamBuffers adam;
  const auto plain = accesses(adam, [](auto& b, auto f) { b.each_buffer(f); });
  CHECK(plain.size() == static_cast<std::size_t>(buffer_count<AdamBuffers>()));
  CHECK(plain[1] == Access::read);   // grad
  CHECK(plain[5] == Access::write);  // param_out: the copy
  std::uint16_t rem = 0;
  adam.remainder = &rem;
  CHECK(accesses(adam, [](auto& b, auto f) { b.each_buffer(f); })[5] == Access::read_write);
  // SGD with momentum: the first step only writes the buffer.
  using Mom = kd::ElementLoop<kernels::SgdStep<false, true>, float, MasterParams<float>>;
  using NoMom = kd::ElementLoop<kernels::SgdStep<false, false>, float, MasterParams<float>>;
  SgdBuffers sgd;
  const auto first = make_sgd_scalars(0.1, 0.9, 0, 0, false, false, 1, 1);
  const auto later = make_sgd_scalars(0.1, 0.9, 0, 0, false, false, 2, 1);
  const auto momentum = [&]<class Loop>(const SgdScalars& s) {
    std::vector<Access> out;
    kd::visit_buffers<Loop>(sgd, s, [&](auto*&, std::size_t, Access a) { out.push_back(a); });
    return out[2];
  };
  CHECK(momentum.template operator()<Mom>(first) == Access::write);
  CHECK(momentum.template operator()<Mom>(later) == Access::read_write);
  CHECK(momentum.template operator()<NoMom>(first) == Access::read_write);
  LambBuffers dir;
  const auto d = accesses(dir, [](auto& b, auto f) { b.each_buffer(f); });
  CHECK(d[0] == Access::read);   // param
  CHECK(d[4] == Access::write);  // update
}
