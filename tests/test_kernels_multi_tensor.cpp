// The host parts of the CUDA kernels, on the CPU: the launch tables of the
// multi-tensor kernels cover every element exactly once within their limits,
// and the 4-element vector steps (kernels/vector_step.hpp), run over ranges
// and chunks the way the CUDA kernels run them (memcpy standing in for the
// vector loads and stores), give the reference kernels' results bitwise for
// every optimizer, gradient type, storage, mode and alignment.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/adagrad_loop.hpp"
#include "kernels/adam_loop.hpp"
#include "kernels/lamb_loop.hpp"
#include "kernels/lion_loop.hpp"
#include "kernels/multi_tensor.hpp"
#include "kernels/rmsprop_loop.hpp"
#include "kernels/sgd_loop.hpp"
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

TEST_CASE("Multi-tensor plan: every element of every tensor once, within the limits",
          "[kernels][multi]") {
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

TEST_CASE("Multi-tensor plan rejects limits that hold no chunk", "[kernels][multi]") {
  const std::vector<std::size_t> sizes = {5};
  CHECK_THROWS_AS(plan_multi_tensor(sizes, {0, 1, 1}), std::invalid_argument);
  CHECK_THROWS_AS(plan_multi_tensor(sizes, {6, 1, 1}), std::invalid_argument);
  CHECK_THROWS_AS(plan_multi_tensor(sizes, {4, 0, 1}), std::invalid_argument);
  CHECK_THROWS_AS(plan_multi_tensor(sizes, {4, 1, 0}), std::invalid_argument);
}

namespace {

// Buffers of n elements (plus room to shift them): floats 0 param, 1-3
// states, 4 f32 gradients, 5 LAMB's update; 16-bit 0 bf16 and 1 f16
// gradients, 2 the parameter copy, 3 bf16 parameters and 4 their
// remainders. Each buffer starts `shift` elements into its storage.
struct Arena {
  std::vector<std::vector<float>> f;
  std::vector<std::vector<std::uint16_t>> h;
  std::vector<std::size_t> f_shift, h_shift;

  Arena(std::size_t n, std::uint64_t seed, std::size_t shift, int odd_one) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> sym(-1.0f, 1.0f), pos(0.01f, 1.0f);
    const std::size_t room = n + 4;
    f.assign(6, std::vector<float>(room));
    h.assign(5, std::vector<std::uint16_t>(room));
    for (std::size_t i = 0; i < room; ++i) {
      f[0][i] = sym(rng);
      for (int k = 1; k <= 3; ++k) f[k][i] = pos(rng);
      f[4][i] = sym(rng);
      f[5][i] = sym(rng);
      h[0][i] = bf16_from_float(f[4][i]).bits;
      h[1][i] = f16_from_float(f[4][i]).bits;
      h[2][i] = static_cast<std::uint16_t>(rng());
      bfloat16 hi;
      encode_remainder(sym(rng), hi, h[4][i]);
      h[3][i] = hi.bits;
    }
    f_shift.assign(6, shift);
    h_shift.assign(5, shift);
    // One buffer out of step with the others: the scalar path.
    if (odd_one >= 0) f_shift[static_cast<std::size_t>(odd_one)] = shift + 1;
    if (odd_one == -2) h_shift[3] = h_shift[4] = shift + 1;
  }
  float* fp(int k) { return f[k].data() + f_shift[k]; }
  std::uint16_t* hp(int k) { return h[k].data() + h_shift[k]; }
  bool operator==(const Arena& o) const {
    for (std::size_t k = 0; k < f.size(); ++k)
      if (std::memcmp(f[k].data(), o.f[k].data(), f[k].size() * 4) != 0) return false;
    for (std::size_t k = 0; k < h.size(); ++k)
      if (std::memcmp(h[k].data(), o.h[k].data(), h[k].size() * 2) != 0) return false;
    return true;
  }
};

// Storage 0: fp32; 1: fp32 with a bf16 copy; 2: with an f16 copy; 3: bf16
// parameters with remainders.
template <class B>
void set_params(B& b, Arena& a, int storage) {
  if (storage == 3) {
    b.param = nullptr;
    b.param_out = a.hp(3);
    b.param_out_type = DType::bf16;
    b.remainder = a.hp(4);
  } else {
    b.param = a.fp(0);
    b.param_out = storage != 0 ? a.hp(2) : nullptr;
    b.param_out_type = storage == 2 ? DType::f16 : DType::bf16;
    b.remainder = nullptr;
  }
}

template <class B>
void set_grad(B& b, Arena& a, DType gt) {
  b.grad = gt == DType::f32    ? static_cast<const void*>(a.fp(4))
           : gt == DType::bf16 ? static_cast<const void*>(a.hp(0))
                               : static_cast<const void*>(a.hp(1));
  b.grad_type = gt;
}

int g_vector_ranges = 0;  // ranges that took the vector path

// Runs Loop over b as the CUDA kernels do with `threads` threads: the vector
// kernel's shares when the buffers align, else the scalar kernel's; with
// chunk > 0, in chunks of that many elements as the multi-tensor kernel.
template <class Loop, class B, class S>
bool like_cuda(const B& b, const S& s, std::size_t threads, std::size_t chunk) {
  const int head = kd::vector_head<Loop>(b, s);
  if (head >= 0 && (chunk > 0 || b.n >= static_cast<std::size_t>(head) + 4)) ++g_vector_ranges;
  bool finite = true;
  const std::size_t step = chunk > 0 ? chunk : (b.n == 0 ? 1 : b.n);
  for (std::size_t begin = 0; begin < b.n; begin += step) {
    const std::size_t end = std::min(b.n, begin + step);
    for (std::size_t t = 0; t < threads; ++t) {
      const bool ok = head >= 0 && (chunk > 0 || b.n >= static_cast<std::size_t>(head) + 4)
                          ? kd::vector_share<Loop>(b, s, begin, end, head, t, threads)
                          : kd::scalar_share<Loop>(b, s, begin, end, t, threads);
      finite = ok && finite;
    }
  }
  return finite;
}

// One configuration of a kernel: run(arena, emulate, threads, chunk) runs
// the reference kernel (emulate false) or like_cuda on the arena's buffers.
using Run = std::function<bool(Arena&, bool, std::size_t, std::size_t)>;

void compare(const std::string& what, const Run& run) {
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{7},
                        std::size_t{64}, std::size_t{1003}}) {
    for (std::size_t shift : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      for (int odd_one : {-1, 1, 4, -2}) {
        for (std::size_t chunk : {std::size_t{0}, std::size_t{12}}) {
          const std::uint64_t seed = n * 131 + shift * 7 + static_cast<std::uint64_t>(odd_one + 2);
          Arena ref(n, seed, shift, odd_one), cuda(n, seed, shift, odd_one);
          if (n > 5 && seed % 3 == 0) {  // a gradient that is not finite
            for (Arena* a : {&ref, &cuda}) {
              a->f[4][a->f_shift[4] + 5] = std::numeric_limits<float>::infinity();
              a->h[0][a->h_shift[0] + 5] = bf16_from_float(a->f[4][a->f_shift[4] + 5]).bits;
              a->h[1][a->h_shift[1] + 5] = f16_from_float(a->f[4][a->f_shift[4] + 5]).bits;
            }
          }
          const bool want = run(ref, false, 1, 0);
          const bool got = run(cuda, true, 5, chunk);
          INFO(what << ", n " << n << ", shift " << shift << ", odd buffer " << odd_one
                    << ", chunk " << chunk);
          CHECK(got == want);
          CHECK(cuda == ref);
        }
      }
    }
  }
}

const DType kGradTypes[] = {DType::f32, DType::bf16, DType::f16};

}  // namespace

TEST_CASE("Vector steps equal the reference kernels: Adam", "[kernels][vector]") {
  g_vector_ranges = 0;
  for (DType gt : kGradTypes)
    for (int storage = 0; storage < 4; ++storage)
      for (int wd = 0; wd < 3; ++wd)
        for (bool ams : {false, true}) {
          const auto s = make_adam_scalars(0.01, 0.9, 0.999, 1e-8, wd ? 0.1 : 0.0, wd == 2, ams,
                                           storage == 1, 3, 0.5);
          compare("Adam grad " + std::string(dtype_name(gt)) + " storage " +
                      std::to_string(storage) + " wd " + std::to_string(wd) + " ams " +
                      std::to_string(ams),
                  [&](Arena& a, bool emulate, std::size_t threads, std::size_t chunk) {
                    AdamBuffers b;
                    set_grad(b, a, gt);
                    b.exp_avg = a.fp(1);
                    b.exp_avg_sq = a.fp(2);
                    b.max_exp_avg_sq = ams ? a.fp(3) : nullptr;
                    set_params(b, a, storage);
                    b.n = a.f[0].size() - 4;
                    if (!emulate) return reference::adam(b, s);
                    return kd::dispatch_adam(
                        b, s, [&]<class Loop>() { return like_cuda<Loop>(b, s, threads, chunk); });
                  });
        }
  CHECK(g_vector_ranges > 0);
}

TEST_CASE("Vector steps equal the reference kernels: SGD, first step and later",
          "[kernels][vector]") {
  for (DType gt : kGradTypes)
    for (int storage = 0; storage < 4; ++storage)
      for (int mode = 0; mode < 8; ++mode)
        for (std::int64_t step : {1, 2}) {
          const bool mom = mode & 1;
          const auto s = make_sgd_scalars(0.01, mom ? 0.9 : 0.0, 0.0, (mode & 2) ? 0.1 : 0.0,
                                          mom && (mode & 4), mode == 3, step, 0.5);
          compare("SGD grad " + std::string(dtype_name(gt)) + " storage " +
                      std::to_string(storage) + " mode " + std::to_string(mode) + " step " +
                      std::to_string(step),
                  [&](Arena& a, bool emulate, std::size_t threads, std::size_t chunk) {
                    SgdBuffers b;
                    set_grad(b, a, gt);
                    b.momentum_buffer = mom ? a.fp(1) : nullptr;
                    set_params(b, a, storage);
                    b.n = a.f[0].size() - 4;
                    if (!emulate) return reference::sgd(b, s);
                    return kd::dispatch_sgd(
                        b, s, [&]<class Loop>() { return like_cuda<Loop>(b, s, threads, chunk); });
                  });
        }
}

TEST_CASE("Vector steps equal the reference kernels: Adagrad, RMSprop, Lion", "[kernels][vector]") {
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
                  if (!emulate) return reference::adagrad(b, s);
                  return kd::dispatch_adagrad(
                      b, s, [&]<class Loop>() { return like_cuda<Loop>(b, s, threads, chunk); });
                });
      }
      for (int mode = 0; mode < 8; ++mode) {
        const bool centered = mode & 1, mom = mode & 2;
        const auto s = make_rmsprop_scalars(0.01, 0.99, 1e-8, (mode & 4) ? 0.1 : 0.0,
                                            mom ? 0.9 : 0.0, centered, mode == 5, 0.5);
        compare("RMSprop" + where + " mode " + std::to_string(mode),
                [&](Arena& a, bool emulate, std::size_t threads, std::size_t chunk) {
                  RmspropBuffers b;
                  set_grad(b, a, gt);
                  b.square_avg = a.fp(1);
                  b.grad_avg = centered ? a.fp(2) : nullptr;
                  b.momentum_buffer = mom ? a.fp(3) : nullptr;
                  set_params(b, a, storage);
                  b.n = a.f[0].size() - 4;
                  if (!emulate) return reference::rmsprop(b, s);
                  return kd::dispatch_rmsprop(
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
        if (!emulate) return reference::lion(b, s);
        return kd::dispatch_lion(
            b, s, [&]<class Loop>() { return like_cuda<Loop>(b, s, threads, chunk); });
      });
    }
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

TEST_CASE("Vector head: the common start of aligned groups, or none", "[kernels][vector]") {
  using Loop = kd::AdamLoop<bfloat16, MasterParams<bfloat16>, WeightDecay::none, false>;
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
  using Mom = kd::SgdLoop<float, MasterParams<float>, false, true>;
  using NoMom = kd::SgdLoop<float, MasterParams<float>, false, false>;
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
