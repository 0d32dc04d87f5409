// The ZeRO engine's features, each against the functional reference on
// exact gradients (bitwise unless a case says otherwise): awkward parameter
// sizes and tiny buckets, both buffer layouts, optimizer-owned gradients,
// every order of grad_ready and a reused scratch buffer, gradient
// accumulation, clipping, the gradient buffers after a step, memory_report,
// DistributedOptimizer and moves. The update options (loss scaler, learning
// rates, groups, custom optimizer, reductions): test_zero_update.cpp.
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/config.hpp"
#include "shardopt/zero.hpp"
#include "zero_helpers.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

namespace {

// Sizes 1, 2, 3 (fewer elements than ranks), empty parameters, primes, one
// of 1000 elements (larger than a shard at 2 ranks and more), and 60 small
// parameters of 1 to 4 elements: 1539 elements in 71 parameters.
Layout awkward_layout() {
  std::vector<std::size_t> sizes = {1, 2, 3, 0, 7, 13, 1000, 101, 0, 257, 5};
  for (std::size_t k = 0; k < 60; ++k) sizes.push_back(1 + k % 4);
  return make_layout(sizes);
}

// 104 bytes a bucket (26 fp32 or 52 16-bit gradients, rounded up to a
// multiple of 16 N elements): dozens of buckets, most parameters straddling
// two or more.
constexpr double kTinyBucket = 0.0001;

// Checks owned_ranges() on every rank: the runs lie within their
// parameters, do not overlap in the shard, and together cover every
// element once (stage 1 and 2: over all ranks; stage 0: on each rank).
// Collective. Returns this rank's problem, "" if none.
std::string check_owned_ranges(const ZeroRedundancyOptimizer& opt, const Layout& layout) {
  const auto all = all_owned_ranges(opt);
  const int stage = opt.stage();
  std::vector<std::vector<int>> cover(layout.size());
  for (std::size_t i = 0; i < layout.size(); ++i) cover[i].assign(layout.sizes[i], 0);
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::vector<std::pair<std::size_t, std::size_t>> slots;  // shard_offset, count
    for (const ShardRange& x : all[r]) {
      if (x.param >= layout.size() || x.offset + x.count > layout.sizes[x.param]) {
        return "rank " + std::to_string(r) + ": range of param " + std::to_string(x.param) +
               " at " + std::to_string(x.offset) + "+" + std::to_string(x.count) + " is outside it";
      }
      for (std::size_t j = x.offset; j < x.offset + x.count; ++j) ++cover[x.param][j];
      slots.emplace_back(x.shard_offset, x.count);
    }
    std::sort(slots.begin(), slots.end());
    for (std::size_t k = 1; k < slots.size(); ++k) {
      if (slots[k - 1].first + slots[k - 1].second > slots[k].first) {
        return "rank " + std::to_string(r) + ": ranges overlap in the shard at shard_offset " +
               std::to_string(slots[k].first);
      }
    }
  }
  const int want = stage == 0 ? world_size() : 1;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    for (std::size_t j = 0; j < layout.sizes[i]; ++j) {
      if (cover[i][j] != want) {
        return "element " + std::to_string(j) + " of " + layout.names[i] + " is owned " +
               std::to_string(cover[i][j]) + " times, expected " + std::to_string(want);
      }
    }
  }
  return "";
}

// A hook that checks owned_ranges() after the first step; `problem` is set
// on the rank that found one.
std::function<void(ZeroRedundancyOptimizer&, const StepInfo&, const Grads&, int)> ranges_check(
    const Layout& layout, std::shared_ptr<std::string> problem) {
  return [layout, problem](ZeroRedundancyOptimizer& opt, const StepInfo&, const Grads&, int s) {
    if (s == 0) *problem = check_owned_ranges(opt, layout);
  };
}

}  // namespace

TEST_CASE("ZeRO: awkward sizes, tiny buckets, separate or contiguous buffers, owned gradients",
          "[zero][layout]") {
  const Layout layout = awkward_layout();
  for (Precision p : {Precision::f32, Precision::bf16})
    for (int stage = 0; stage <= 2; ++stage)
      for (bool contiguous : {false, true})
        for (bool owned : {false, true}) {
          Run run = base_run(layout, p, AdamW{.lr = 1e-2, .weight_decay = 0.1}, stage, 3);
          run.options.bucket_mb = kTinyBucket;
          run.contiguous = contiguous;
          run.owned_grads = owned;
          run.key = 21;
          auto problem = std::make_shared<std::string>();
          run.after_step = ranges_check(layout, problem);
          run_and_compare(run);
          INFO(describe(run) << ": owned_ranges()");
          if (!problem->empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << *problem);
          CHECK(all_ranks_true(problem->empty()));
        }
}

TEST_CASE("ZeRO: one parameter, or a single element, or nothing but empty parameters",
          "[zero][layout]") {
  for (int stage = 0; stage <= 2; ++stage) {
    run_and_compare(base_run(make_layout({1}), Precision::f32, Adam{}, stage, 3));
    run_and_compare(
        base_run(make_layout({4097}), Precision::bf16, SGD{.lr = 0.1, .momentum = 0.5}, stage, 3));
    Run empty = base_run(make_layout({0, 0}), Precision::f32, Adam{}, stage, 2);
    empty.ready = Ready::forward;
    run_and_compare(empty);
  }
}

TEST_CASE("ZeRO: grad_ready in forward, reverse or no order, or from a reused scratch buffer",
          "[zero][ready]") {
  const Layout layout = make_layout({7, 130, 1, 61, 0, 257});
  for (Precision p : {Precision::f32, Precision::bf16})
    for (int stage = 0; stage <= 2; ++stage)
      for (Ready ready : {Ready::none, Ready::forward, Ready::reverse, Ready::scratch})
        for (bool owned : {false, true}) {
          // grad_ready(i, scratch) copies into grad(i), registered or owned.
          if (owned && ready != Ready::scratch) continue;
          Run run = base_run(layout, p, SGD{.lr = 0.05, .momentum = 0.9}, stage, 4);
          run.options.bucket_mb = 0.0002;
          run.ready = ready;
          run.owned_grads = owned;
          run.key = 31;
          run_and_compare(run);
        }
}

// Stage 2 with stream_grads: parameters registered without gradient
// buffers get none; each gradient goes from one reused scratch buffer
// straight into its bucket. In reverse order the buckets fill one by one;
// in forward order every bucket is open at once and the engine adds bucket
// buffers; in an order drawn per rank the ranks disagree on which buffers
// hold the last two buckets (on one node they stay in shared memory for the
// update to reduce when every rank has them there, else they are reduced
// through the communicator). Bitwise the reference either way, micro-batches
// and LAMB (nothing held) included, with no full-size gradient anywhere
// (memory_report and grad(i)).
TEST_CASE("ZeRO: stage 2 streams gradients into their buckets (stream_grads)", "[zero][stream]") {
  const Layout layout = make_layout({7, 300, 1, 64, 0, 129, 33});
  for (Precision p : {Precision::f32, Precision::bf16, Precision::f16, Precision::bf16_rem})
    for (Ready ready : {Ready::scratch, Ready::scratch_forward, Ready::scratch_shuffled})
      for (int micro : {1, 3})
        for (bool contiguous : {false, true}) {
          if (ready == Ready::scratch_shuffled && contiguous) continue;
          const bool lamb = ready == Ready::scratch_shuffled && p == Precision::bf16;
          Run run = lamb ? base_run(layout, p, Lamb{.lr = 1e-2}, 2, 3)
                         : base_run(layout, p, Adam{.lr = 1e-2}, 2, 3);
          run.options.bucket_mb = 0.0003;
          run.options.stream_grads = true;
          run.owned_grads = true;
          run.contiguous = contiguous;
          run.ready = ready;
          run.micro_batches = micro;
          run.key = 61;
          auto problem = std::make_shared<std::string>();
          run.after_step = [=](ZeroRedundancyOptimizer& opt, const StepInfo&, const Grads&, int) {
            const MemoryReport m = opt.memory_report();
            if (m.owned_grads != 0 || m.user_grads != 0)
              *problem = "gradient buffers exist: owned " + std::to_string(m.owned_grads) +
                         " B, user " + std::to_string(m.user_grads) + " B";
            for (std::size_t i = 0; i < opt.num_params(); ++i)
              if (opt.grad(i) != nullptr) *problem = "grad(" + std::to_string(i) + ") is not null";
          };
          run_and_compare(run);
          INFO(describe(run));
          if (!problem->empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << *problem);
          CHECK(all_ranks_true(problem->empty()));
        }
}

// Stage 2: each micro-batch reduced into the fp32 shard by
// reduce_gradients(), the last one by step() itself (as docs/zero.md
// describes the pattern) or, with gradients marked ready, by
// reduce_gradients() too; or accumulated locally. Stages 0 and 1: added up
// in the gradient buffers. Either way the step equals one step on the sum of
// every micro-batch's gradients.
TEST_CASE("ZeRO: gradient accumulation equals one step on the summed gradients",
          "[zero][accumulation]") {
  const Layout layout = make_layout({13, 300, 1, 64, 0, 33});
  for (Precision p : {Precision::f32, Precision::bf16, Precision::f16})
    for (int stage = 0; stage <= 2; ++stage)
      for (Ready ready : {Ready::reverse, Ready::none, Ready::scratch})
        for (int mode = 0; mode < 3; ++mode) {
          // 0: reduce_gradients() after each micro-batch but the last (stage
          // 2), or local accumulation (stages 0 and 1); 1: after each one,
          // the last too; 2: local accumulation in stage 2.
          if (mode > 0 && stage != 2) continue;
          if (ready == Ready::scratch && (stage != 2 || mode == 2)) continue;
          // Mode 1 unmarked: reduce_gradients() zeroed the buffers, so the
          // reduction step() adds after the last one adds nothing.
          Run run = base_run(layout, p, Adam{.lr = 1e-2}, stage, 3);
          run.options.bucket_mb = 0.0005;
          run.micro_batches = 3;
          run.reduce_last = mode == 1;
          run.accumulate_locally = mode == 2;
          run.ready = ready;
          run.key = 41;
          run_and_compare(run);
        }
}

// The norm against one computed here in float64 from the regenerated
// averaged gradients (relative 1e-6); the clipped step against the
// functional step with grad_mul = (1/N) * min(1, max_norm / (norm + 1e-6)),
// computed in double from the engine's own norm as torch computes the
// coefficient: bitwise.
TEST_CASE("ZeRO: clip_grad_norm returns the global norm and clips in the fused update",
          "[zero][clip]") {
  const Layout layout = make_layout({7, 300, 1, 64, 129});
  const int n = world_size();
  const double norm0 =
      averaged_norm(reduced_grads(layout, DType::f32, GradKind::exact, 51, 0, n), n);
  for (Precision p : {Precision::f32, Precision::bf16})
    for (int stage = 0; stage <= 2; ++stage)
      for (double max_norm : {0.5 * norm0, 10.0 * norm0}) {
        Run run = base_run(layout, p, SGD{.lr = 0.1, .momentum = 0.9}, stage, 3);
        run.options.bucket_mb = 0.0005;
        run.key = 51;
        auto problem = std::make_shared<std::string>();
        auto last_norm = std::make_shared<double>(-2.0);
        run.before_update = [=](ZeroRedundancyOptimizer& opt, const Grads& summed, int s,
                                double grad_mul) {
          const double norm = opt.clip_grad_norm(max_norm);
          *last_norm = norm;
          const double want = averaged_norm(summed, n);
          if (!(std::fabs(norm - want) <= 1e-6 * want) && problem->empty()) {
            *problem = "step " + std::to_string(s + 1) + ": clip_grad_norm returned " +
                       std::to_string(norm) + ", expected " + std::to_string(want);
          }
          const double coef = max_norm / (norm + 1e-6);
          return coef < 1.0 ? grad_mul * coef : grad_mul;
        };
        run.after_step = [=](ZeroRedundancyOptimizer&, const StepInfo& info, const Grads&, int s) {
          if (info.grad_norm != *last_norm && problem->empty()) {
            *problem = "step " + std::to_string(s + 1) + ": StepInfo::grad_norm " +
                       std::to_string(info.grad_norm) + ", clip_grad_norm returned " +
                       std::to_string(*last_norm);
          }
        };
        run_and_compare(run);
        INFO(describe(run) << ", max_norm " << max_norm);
        if (!problem->empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << *problem);
        CHECK(all_ranks_true(problem->empty()));
      }
}

TEST_CASE("ZeRO: StepInfo::grad_norm is -1 without clip_grad_norm", "[zero][clip]") {
  auto ok = std::make_shared<bool>(true);
  Run run = base_run(make_layout({5, 9}), Precision::f32, Adam{}, 1, 2);
  run.after_step = [ok](ZeroRedundancyOptimizer&, const StepInfo& info, const Grads&, int) {
    *ok = *ok && info.grad_norm == -1.0 && info.loss_scale == 1.0 && info.grads_finite;
  };
  run_and_compare(run);
  CHECK(all_ranks_true(*ok));
}

// After step() the gradient buffers hold, in stages 0 and 1, the reduced
// sums over ranks of the predivided gradients, bitwise, for avg as for sum
// (docs/zero.md: not averaged, not unscaled); in stage 2, and for 16-bit
// gradients reduced in fp32, what this rank wrote.
TEST_CASE("ZeRO: the gradient buffers after a step", "[zero][grads]") {
  const Layout layout = make_layout({7, 300, 1, 64});
  const int rank = world_rank();
  for (Precision p : {Precision::f32, Precision::bf16})
    for (int stage = 0; stage <= 2; ++stage)
      for (GradReduction red : {GradReduction::avg, GradReduction::sum})
        for (bool owned : {false, true})
          for (int variant = 0; variant < 3; ++variant) {
            // 0: plain; 1: predivide_factor 4; 2: reduce_in_fp32 (16-bit only).
            if (variant == 2 && p == Precision::f32) continue;
            Run run = base_run(layout, p, SGD{.lr = 0.01}, stage, 2);
            run.options.reduction = red;
            run.options.predivide_factor = variant == 1 ? 4.0 : 1.0;
            run.options.reduce_in_fp32 = variant == 2;
            run.owned_grads = owned;
            run.key = 111;
            const DType t = param_dtype(p);
            const bool untouched = stage == 2 || variant == 2;
            const float predivide = static_cast<float>(run.options.predivide_factor);
            auto problem = std::make_shared<std::string>();
            run.after_step = [=](ZeroRedundancyOptimizer& opt, const StepInfo&, const Grads& summed,
                                 int s) {
              for (std::size_t i = 0; i < layout.size() && problem->empty(); ++i) {
                std::vector<std::byte> host(layout.sizes[i] * dtype_size(t));
                Model::download(host.data(), opt.grad(i), host.size());
                const void* g = host.data();
                for (std::size_t j = 0; j < layout.sizes[i]; ++j) {
                  const float got = load(t, g, j);
                  const float want = untouched ? stored_grad(t, GradKind::exact, 111, s, rank, i, j)
                                               : summed[i][j] / predivide;
                  if (float_bits(got) != float_bits(want)) {
                    *problem = "step " + std::to_string(s + 1) + ": gradient of " +
                               layout.names[i] + "[" + std::to_string(j) + "] is " +
                               fmt_float(got) + ", expected " + fmt_float(want);
                    break;
                  }
                }
              }
            };
            run_and_compare(run);
            INFO(describe(run) << ": gradient buffers after step()");
            if (!problem->empty()) UNSCOPED_INFO("rank " << rank << ": " << *problem);
            CHECK(all_ranks_true(problem->empty()));
          }
}

TEST_CASE("ZeRO: accessors, zero_grad, owned gradient buffers", "[zero][basics][host-memory]") {
  const Layout layout = make_layout({7, 300, 0, 64}, {0, 1, 0, 1});
  for (int stage = 0; stage <= 2; ++stage)
    for (bool owned : {false, true}) {
      Model model(layout, DType::bf16, false, owned, 121);
      const std::vector<OptimizerConfig> groups = {Adam{.lr = 1e-3}, Adam{.lr = 2e-3}};
      ZeroOptions options;
      options.stage = stage;
      std::string failure;
      auto fail = [&](const std::string& s) {
        if (failure.empty()) failure = s;
      };
      const bool ran = no_throw([&] {
        ZeroRedundancyOptimizer opt(world(), model.params(), groups, options);
        if (opt.stage() != stage) fail("stage() " + std::to_string(opt.stage()));
        if (opt.num_params() != layout.size()) fail("num_params()");
        if (opt.num_groups() != 2) fail("num_groups()");
        if (opt.steps() != 0) fail("steps() before any step");
        if (opt.loss_scale() != 1.0) fail("loss_scale() without a scaler");
        if (!std::holds_alternative<Adam>(opt.param_group(1)) ||
            lr_of(opt.param_group(1)) != 2e-3) {
          fail("param_group(1)");
        }
        std::vector<std::pair<const std::byte*, std::size_t>> spans;
        for (std::size_t i = 0; i < layout.size(); ++i) {
          const Param& q = opt.param(i);
          if (q.name != layout.names[i] || q.numel != layout.sizes[i] || q.dtype != DType::bf16 ||
              q.data != model.param_data(i) || q.group != layout.group(i)) {
            fail("param(" + std::to_string(i) + ") is not the registered parameter");
          }
          void* g = opt.grad(i);
          if (!owned && g != model.grad_data(i)) fail("grad(i) is not the registered buffer");
          if (layout.sizes[i] > 0 && g == nullptr) fail("grad(i) is null");
          if (layout.sizes[i] > 0)
            spans.emplace_back(static_cast<const std::byte*>(g), 2 * layout.sizes[i]);
          // Something in every gradient, for zero_grad() to clear.
          for (std::size_t j = 0; j < layout.sizes[i]; ++j) store(DType::bf16, g, j, 1.5f);
        }
        std::sort(spans.begin(), spans.end());
        for (std::size_t k = 1; k < spans.size(); ++k) {
          if (spans[k - 1].first + spans[k - 1].second > spans[k].first)
            fail("gradient buffers overlap");
        }
        opt.zero_grad();
        for (std::size_t i = 0; i < layout.size(); ++i)
          for (std::size_t j = 0; j < layout.sizes[i]; ++j)
            if (load_bits(DType::bf16, opt.grad(i), j) != 0) {
              fail("zero_grad() left " + layout.names[i] + "[" + std::to_string(j) + "]");
              break;
            }
        opt.set_lr(0.25);
        if (lr_of(opt.param_group(0)) != 0.25 || lr_of(opt.param_group(1)) != 0.25) fail("set_lr");
      });
      if (!ran) fail("threw");
      INFO("stage " << stage << (owned ? ", owned gradients" : ", registered gradients"));
      if (!failure.empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << failure);
      CHECK(all_ranks_true(failure.empty()));
    }
}

// zero_grad() forgets what was marked ready and, in stage 2, what was
// reduced into the shard since the last step: a step after it equals a
// step on the gradients written after it alone.
TEST_CASE("ZeRO: zero_grad() forgets marked and accumulated gradients",
          "[zero][basics][host-memory]") {
  const Layout layout = make_layout({7, 300, 1, 64});
  const int n = world_size();
  const int rank = world_rank();
  const std::uint64_t key = 125;
  for (int stage = 0; stage <= 2; ++stage)
    for (bool reduce : {false, true}) {
      if (reduce && stage != 2) continue;
      Model model(layout, DType::f32, false, false, key);
      const std::vector<OptimizerConfig> groups = {SGD{.lr = 0.1, .momentum = 0.9}};
      Reference ref(model, Precision::f32, groups);
      ZeroOptions options;
      options.stage = stage;
      options.bucket_mb = 0.0005;
      std::string failure;
      auto write = [&](std::int64_t batch) {
        for (std::size_t i = 0; i < layout.size(); ++i) {
          fill_grad(model.grad_data(i), DType::f32, layout.sizes[i], GradKind::exact, key, batch,
                    rank, i, false);
        }
      };
      const bool ran = no_throw([&] {
        ZeroRedundancyOptimizer opt(world(), model.params(), groups, options);
        for (int s = 0; s < 2; ++s) {
          // A micro-batch that is thrown away: partly marked ready, or (stage
          // 2) wholly reduced into the shard.
          write(100 + s);
          if (reduce) {
            opt.reduce_gradients();
          } else {
            opt.grad_ready(3);
            opt.grad_ready(2);
          }
          opt.zero_grad();
          write(s);
          opt.step();
          ref.step(reduced_grads(layout, DType::f32, GradKind::exact, key, s, n), 1.0 / n);
          for (std::size_t i = 0; i < layout.size() && failure.empty(); ++i) {
            const std::string d = compare_bits(model.all_bits(i), ref.param_bits(i));
            if (!d.empty())
              failure = "step " + std::to_string(s + 1) + ", " + layout.names[i] + ": " + d;
          }
        }
      });
      if (!ran && failure.empty()) failure = "threw";
      INFO("stage " << stage << ": zero_grad() after "
                    << (reduce ? "reduce_gradients()" : "grad_ready() of two parameters"));
      if (!failure.empty()) UNSCOPED_INFO("rank " << rank << ": " << failure);
      CHECK(all_ranks_true(failure.empty()));
    }
}

// The bytes each category holds against the shard: stage 0 the whole
// model, stages 1 and 2 this rank's owned elements, which add up to the
// model over the ranks, each within 64 elements a rank of 1/N. Each fp32
// or 16-bit buffer may be padded for alignment by up to 16 elements a rank
// (the engine pads every rank's piece).
TEST_CASE("ZeRO: memory_report against the shard sizes", "[zero][memory]") {
  const Layout layout = make_layout({1000, 333, 7, 2000, 1, 0});
  const std::size_t total = layout.total();
  const int n = world_size();
  const std::size_t pad = 16 * static_cast<std::size_t>(n);
  for (Precision p : {Precision::f32, Precision::bf16, Precision::bf16_rem})
    for (int stage = 0; stage <= 2; ++stage)
      for (bool owned : {false, true})
        for (bool fp32_reduce : {false, true}) {
          if (fp32_reduce && p == Precision::f32) continue;
          const DType t = param_dtype(p);
          const std::size_t es = dtype_size(t);
          Model model(layout, t, false, owned, 131);
          ZeroOptions options;
          options.stage = stage;
          options.param_remainders = p == Precision::bf16_rem;
          options.reduce_in_fp32 = fp32_reduce;
          std::string failure;
          auto fail = [&](const std::string& what, std::size_t got, std::size_t want) {
            if (failure.empty()) {
              failure = what + " " + std::to_string(got) + ", expected " + std::to_string(want);
            }
          };
          // `buffers` buffers of `elements` elements of `bytes` each, padded.
          auto check = [&](const char* what, std::size_t got, std::size_t buffers,
                           std::size_t elements, std::size_t bytes) {
            const std::size_t want = buffers * elements * bytes;
            if (got < want || got > want + buffers * pad * bytes) fail(what, got, want);
          };
          std::size_t shard = 0;
          const bool ran = no_throw([&] {
            ZeroRedundancyOptimizer opt(world(), model.params(), Adam{}, options);
            const MemoryReport m = opt.memory_report();
            shard = shard_elements(opt);
            if (stage == 0 && shard != total) fail("stage 0 shard elements", shard, total);
            if (stage > 0 && (shard * n + 64 * n < total || shard * n > total + 64 * n)) {
              fail("shard elements", shard, total / n);
            }
            check("optimizer_state", m.optimizer_state, 2, shard, 4);
            if (p == Precision::bf16) check("master_params", m.master_params, 1, shard, 4);
            if (p == Precision::bf16_rem) {
              check("master_params (remainders)", m.master_params, 1, shard, 2);
            }
            // fp32 parameters are their own master: nothing, or the shard's copy.
            if (p == Precision::f32 && m.master_params != 0) {
              check("master_params (fp32)", m.master_params, 1, shard, 4);
            }
            check("grad_shard", m.grad_shard, stage == 2 ? 1 : 0, shard, 4);
            check("reduced_grads", m.reduced_grads, fp32_reduce && stage < 2 ? 1 : 0, total, 4);
            if (owned) check("owned_grads", m.owned_grads, 1, total, es);
            if (!owned && m.owned_grads != 0) fail("owned_grads", m.owned_grads, 0);
            if (m.user_params != es * total) fail("user_params", m.user_params, es * total);
            const std::size_t user_grads = owned ? 0 : es * total;
            if (m.user_grads != user_grads) fail("user_grads", m.user_grads, user_grads);
            const std::size_t sum = m.master_params + m.optimizer_state + m.grad_shard +
                                    m.reduced_grads + m.owned_grads + m.buckets;
            if (m.allocated() != sum) fail("allocated()", m.allocated(), sum);
            // Stage 0 reduces owned gradients (contiguous) in place and
            // gathers no parameters: no bucket buffers (docs/zero.md).
            if (stage == 0 && owned && !fp32_reduce && m.buckets != 0) {
              fail("buckets (stage 0, owned gradients)", m.buckets, 0);
            }
          });
          if (!ran && failure.empty()) failure = "threw";
          unsigned long long mine = shard, all = 0;
          MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
          const unsigned long long want_all = stage == 0 ? total * n : total;
          if (ran && all != want_all) fail("shard elements over all ranks", all, want_all);
          INFO("memory_report, stage " << stage << ", " << precision_name(p)
                                       << (owned ? ", owned gradients" : "")
                                       << (fp32_reduce ? ", reduce_in_fp32" : ""));
          if (!failure.empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << failure);
          CHECK(all_ranks_true(failure.empty()));
        }
}

// docs/zero.md's table: the ZeRO paper's accounting, except stage 2, whose
// gradient shard is fp32 (2 Psi + 16 Psi / N, where the paper has 14 Psi / N
// for a 16-bit shard).
TEST_CASE(
    "ZeRO: zero_memory_formula is docs/zero.md's table, stages 2 and 3 with an fp32 gradient shard",
    "[zero][memory]") {
  const double psi = 1e6;
  for (int n = 1; n <= 8; ++n) {
    INFO(n << " ranks");
    CHECK(zero_memory_formula(0, psi, n, DType::bf16, 8) == Approx(16 * psi));
    CHECK(zero_memory_formula(1, psi, n, DType::bf16, 8) == Approx(4 * psi + 12 * psi / n));
    CHECK(zero_memory_formula(2, psi, n, DType::bf16, 8) == Approx(2 * psi + 16 * psi / n));
    CHECK(zero_memory_formula(3, psi, n, DType::bf16, 8) == Approx(18 * psi / n));
    CHECK(zero_memory_formula(3, psi, n, DType::f32, 8) == Approx(16 * psi / n));
  }
}

TEST_CASE("ZeRO: DistributedOptimizer is stage 0", "[zero][distributed]") {
  const Layout layout = make_layout({7, 300, 1, 64, 129});
  for (Precision p : {Precision::f32, Precision::bf16}) {
    Run zero = base_run(layout, p, Adam{.lr = 1e-2, .amsgrad = true}, 0, 5);
    zero.options.bucket_mb = 0.0005;
    zero.key = 141;
    Run dist = zero;
    dist.distributed = true;
    dist.options.stage = 2;  // ignored
    auto stage = std::make_shared<int>(-1);
    dist.after_step = [stage](ZeroRedundancyOptimizer& opt, const StepInfo&, const Grads&, int) {
      *stage = opt.stage();
    };
    const Outcome a = run_and_compare(zero);
    const Outcome b = run_and_compare(dist);
    INFO("DistributedOptimizer against ZeroRedundancyOptimizer stage 0, " << precision_name(p));
    CHECK(all_ranks_true(*stage == 0));
    const std::string d = compare_snapshots(b.last, a.last);
    if (!d.empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << d);
    CHECK(all_ranks_true(d.empty()));
  }
}

TEST_CASE("ZeRO: a moved optimizer steps on", "[zero][basics][host-memory]") {
  const Layout layout = make_layout({7, 300, 1, 64});
  const int n = world_size();
  const int rank = world_rank();
  for (int stage = 0; stage <= 2; ++stage) {
    Model model(layout, DType::f32, false, false, 151);
    const std::vector<OptimizerConfig> groups = {Adam{.lr = 1e-2}};
    Reference ref(model, Precision::f32, groups);
    ZeroOptions options;
    options.stage = stage;
    std::string failure;
    const bool ran = no_throw([&] {
      ZeroRedundancyOptimizer a(world(), model.params(), groups, options);
      auto step = [&](ZeroRedundancyOptimizer& opt, int s) {
        for (std::size_t i = 0; i < layout.size(); ++i) {
          fill_grad(model.grad_data(i), DType::f32, layout.sizes[i], GradKind::exact, 151, s, rank,
                    i, false);
        }
        opt.step();
        ref.step(reduced_grads(layout, DType::f32, GradKind::exact, 151, s, n), 1.0 / n);
        for (std::size_t i = 0; i < layout.size() && failure.empty(); ++i) {
          const std::string d = compare_bits(model.all_bits(i), ref.param_bits(i));
          if (!d.empty()) failure = "step " + std::to_string(s + 1) + ": " + d;
        }
      };
      step(a, 0);
      ZeroRedundancyOptimizer b(std::move(a));
      step(b, 1);
      ZeroRedundancyOptimizer c(world(), model.params(), groups, options);
      c = std::move(b);  // the moved-to optimizer's own state is released
      step(c, 2);
      if (c.steps() != 3) failure = "steps() " + std::to_string(c.steps());
    });
    if (!ran && failure.empty()) failure = "threw";
    INFO("move construction and assignment, stage " << stage);
    if (!failure.empty()) UNSCOPED_INFO("rank " << rank << ": " << failure);
    CHECK(all_ranks_true(failure.empty()));
  }
}

// Stage 2 with gradient buffers the optimizer owns, every rank on one node
// with the shm transport, host buffers: the owned gradients live in shared
// memory and step() runs the fused reduce-scatter + update
// (SHARDOPT_FUSED_UPDATE), reading every rank's gradients of the shard
// block by block. Bitwise the functional step: every element-wise optimizer
// of the table on tiny buckets (blocks that cross buckets), fp32 and bf16
// with remainders; Adam on pieces larger than the update's blocks, in every
// precision, with micro-batches (the shard accumulating the earlier ones,
// the last one fused or reduced by reduce_gradients()); clipping and a
// non-finite check, which need the reduced gradients before the update.
// memory_report counts this rank's part of the shared gradients in
// node_shared (0 where the step is not fused: one rank, the mpi transport,
// a device). Also on the user's gradient buffers (read from the other
// ranks' memory; nothing shared).
TEST_CASE("ZeRO stage 2: the fused reduce-scatter + update of owned gradients", "[zero][fused]") {
  Communicator world(MPI_COMM_WORLD);
  const bool fused = world_size() > 1 && !Model::on_device &&
                     std::string(world.backend_name()) == "shm" && settings().fused_update;
  auto memory_check = [fused](std::shared_ptr<std::string> problem) {
    return [fused, problem](ZeroRedundancyOptimizer& opt, const StepInfo&, const Grads&, int) {
      const MemoryReport m = opt.memory_report();
      const std::size_t want = fused ? m.owned_grads : 0;
      if (m.node_shared != want || m.owned_grads == 0)
        *problem = "memory_report: node_shared " + std::to_string(m.node_shared) +
                   ", owned_grads " + std::to_string(m.owned_grads) + ", expected node_shared " +
                   std::to_string(want);
    };
  };
  auto run_checked = [&](Run run) {
    run.owned_grads = true;
    auto problem = std::make_shared<std::string>();
    if (!run.after_step) run.after_step = memory_check(problem);
    run_and_compare(run);
    INFO(describe(run) << (fused ? ": fused" : ": not fused"));
    if (!problem->empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << *problem);
    CHECK(all_ranks_true(problem->empty()));
  };
  Optimizers::each([&]<class O>() {
    if constexpr (is_elementwise<O>) {
      O o{};
      o.lr = 1e-3;
      for (Precision p : {Precision::f32, Precision::bf16_rem}) {
        Run run = base_run(awkward_layout(), p, o, 2, 2);
        run.options.bucket_mb = kTinyBucket;
        run.key = 61;
        run_checked(run);
      }
    }
  });
  // The same on the user's gradient buffers, which the fused update reads
  // from the other ranks' memory (process_vm_readv): blocks that span
  // several parameters and a bucket's padding (tiny buckets), and below
  // pieces larger than a block, micro-batches. Nothing is shared
  // (node_shared 0).
  auto run_user = [&](Run run) {
    auto problem = std::make_shared<std::string>();
    run.after_step = [problem](ZeroRedundancyOptimizer& opt, const StepInfo&, const Grads&, int) {
      if (opt.memory_report().node_shared != 0) *problem = "node_shared is not 0";
    };
    run_and_compare(run);
    INFO(describe(run) << ", the user's gradient buffers");
    CHECK(all_ranks_true(problem->empty()));
  };
  for (Precision p : {Precision::f32, Precision::bf16_rem}) {
    Run run = base_run(awkward_layout(), p, Adam{.lr = 1e-3}, 2, 2);
    run.options.bucket_mb = kTinyBucket;
    run.key = 64;
    run_user(run);
  }
  // 110007 elements: pieces of 36669 at 3 ranks, more than one block.
  const Layout large = make_layout({70000, 3, 40001, 0, 3});
  for (Precision p : {Precision::f32, Precision::bf16, Precision::f16})
    for (int mode = 0; mode < 3; ++mode) {
      // 0: one micro-batch; 1: three, reduce_gradients() after each but
      // the last; 2: three, after each, the last too.
      Run run = base_run(large, p, Adam{.lr = 1e-2}, 2, 3);
      run.micro_batches = mode == 0 ? 1 : 3;
      run.reduce_last = mode == 2;
      run.ready = mode == 1 ? Ready::none : Ready::reverse;
      run.key = 62;
      run_checked(run);  // owned gradients
      run_user(run);
    }
  const int n = world_size();
  const double norm0 =
      averaged_norm(reduced_grads(large, DType::f32, GradKind::exact, 63, 0, n), n);
  for (NonFinite policy : {NonFinite::ignore, NonFinite::skip, NonFinite::error}) {
    Run run = base_run(large, Precision::f32, SGD{.lr = 0.1, .momentum = 0.9}, 2, 3);
    run.options.non_finite = policy;
    run.key = 63;
    if (policy == NonFinite::skip)
      run.before_update = [=](ZeroRedundancyOptimizer& opt, const Grads&, int, double grad_mul) {
        const double norm = opt.clip_grad_norm(0.5 * norm0);
        const double coef = 0.5 * norm0 / (norm + 1e-6);
        return coef < 1.0 ? grad_mul * coef : grad_mul;
      };
    run_checked(run);
  }
}
