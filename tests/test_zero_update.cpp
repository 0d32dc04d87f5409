// The ZeRO engine's update options, each against the functional reference
// on exact gradients (bitwise unless a case says otherwise): the loss
// scaler, learning-rate changes and parameter groups, a custom optimizer,
// and the reductions.
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
#include "shardopt/zero.hpp"
#include "zero_helpers.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

namespace {

// One loss-scaler scenario: `overflow[s]` puts an inf (even s) or a nan
// (odd s) into one gradient element of the last rank only.
struct ScalerCase {
  LossScaler scaler;
  std::vector<bool> overflow;
};

// The documented rule: after `hysteresis` consecutive overflowing steps the
// scale is multiplied by backoff_factor, and again at each further one in a
// row (docs/zero.md), never below min_scale; after growth_interval steps in
// a row without overflow, by growth_factor.
std::vector<double> expected_scales(const ScalerCase& c) {
  std::vector<double> scales;
  double scale = c.scaler.init_scale;
  int bad = 0, good = 0;
  for (bool o : c.overflow) {
    scales.push_back(scale);
    if (o) {
      good = 0;
      if (++bad >= c.scaler.hysteresis) {
        scale = std::max(scale * c.scaler.backoff_factor, c.scaler.min_scale);
      }
    } else {
      bad = 0;
      if (++good == c.scaler.growth_interval) {
        scale *= c.scaler.growth_factor;
        good = 0;
      }
    }
  }
  scales.push_back(scale);
  return scales;
}

void check_loss_scaler(Precision p, int stage, const ScalerCase& c) {
  const Layout layout = make_layout({7, 300, 1, 64});
  const int n = world_size();
  const int rank = world_rank();
  const DType dtype = param_dtype(p);
  const std::uint64_t key = 61;
  const std::vector<double> scales = expected_scales(c);
  const std::vector<OptimizerConfig> groups = {Adam{.lr = 1e-2, .weight_decay = 0.01}};
  ZeroOptions options;
  options.stage = stage;
  options.bucket_mb = 0.0005;
  options.param_remainders = p == Precision::bf16_rem;
  options.loss_scaler = c.scaler;
  Model model(layout, dtype, false, false, key);
  Reference ref(model, p, groups);
  INFO("loss scaler, hysteresis " << c.scaler.hysteresis << ", ZeRO stage " << stage << " at " << n
                                  << " ranks, " << precision_name(p));
  std::string failure;
  auto fail = [&](const std::string& s) {
    if (failure.empty()) failure = s;
  };
  std::unique_ptr<ZeroRedundancyOptimizer> opt;
  const bool made = no_throw([&] {
    opt = std::make_unique<ZeroRedundancyOptimizer>(world(), model.params(), groups, options);
  });
  if (!all_ranks_true(made)) {
    CHECK(made);
    return;
  }
  const std::vector<std::string> names = opt->state_names();
  const bool names_same = same_on_all_ranks([&] {
    std::string s;
    for (const std::string& x : names) s += x + ",";
    return s;
  }());
  if (!names_same) fail("state_names() differ between ranks");
  for (std::size_t s = 0; s < c.overflow.size() && names_same; ++s) {
    const bool overflow = c.overflow[s];
    StepInfo info;
    double scale = -1.0, norm = 0.0;
    std::vector<std::vector<std::uint32_t>> before;
    std::vector<std::vector<float>> states_before, states_after;
    bool ran = no_throw([&] {
      scale = opt->loss_scale();
      const float fs = static_cast<float>(scale);
      opt->zero_grad();
      for (std::size_t i = 0; i < layout.size(); ++i) {
        fill_grad(model.grad_host(i), dtype, layout.sizes[i], GradKind::exact, key,
                  static_cast<std::int64_t>(s), rank, i, false, fs);
      }
      if (overflow && rank == n - 1) {
        const float bad = s % 2 == 0 ? std::numeric_limits<float>::infinity()
                                     : std::numeric_limits<float>::quiet_NaN();
        const std::size_t i = 1 + s % 3;
        store(dtype, model.grad_host(i), layout.sizes[i] / 2, bad);
      }
      // A device run copies the host-written gradients to the device.
      for (std::size_t i = 0; i < layout.size(); ++i)
        Model::upload(model.grad_data(i), model.grad_host(i), layout.sizes[i] * dtype_size(dtype));
      for (std::size_t i = layout.size(); i-- > 0;) opt->grad_ready(i);
      if (overflow) {
        model.pull();
        for (std::size_t i = 0; i < layout.size(); ++i) before.push_back(model.all_bits(i));
        for (const std::string& name : names)
          for (std::size_t i = 0; i < layout.size(); ++i)
            states_before.push_back(opt->gather_state(name, i));
      }
      // With a max_norm no gradient reaches, clipping only reports the norm
      // of the unscaled gradients (inf or nan after an overflow).
      norm = opt->clip_grad_norm(1e30);
      info = settled(*opt, opt->step(), true);
      if (overflow) {
        for (const std::string& name : names)
          for (std::size_t i = 0; i < layout.size(); ++i)
            states_after.push_back(opt->gather_state(name, i));
      }
    });
    if (!ran) fail("step " + std::to_string(s + 1) + " threw");
    if (!all_ranks_true(ran)) break;
    const std::string at = "step " + std::to_string(s + 1) + ": ";
    if (scale != scales[s]) {
      fail(at + "loss_scale() " + std::to_string(scale) + ", expected " +
           std::to_string(scales[s]));
    }
    if (info.loss_scale != scales[s])
      fail(at + "StepInfo::loss_scale " + std::to_string(info.loss_scale));
    if (info.applied == overflow || info.grads_finite == overflow) {
      fail(at + "applied " + std::to_string(info.applied) + ", grads_finite " +
           std::to_string(info.grads_finite) + ", overflow on the last rank " +
           std::to_string(overflow));
    }
    if (overflow) {
      if (std::isfinite(norm)) fail(at + "clip_grad_norm returned finite " + std::to_string(norm));
      model.pull();
      for (std::size_t i = 0; i < layout.size(); ++i) {
        const std::string d = compare_bits(model.all_bits(i), before[i]);
        if (!d.empty()) fail(at + "skipped step changed " + layout.names[i] + ": " + d);
      }
      for (std::size_t k = 0; k < states_before.size(); ++k) {
        const std::string d = compare_floats(states_after[k], states_before[k], Tolerance{});
        if (!d.empty())
          fail(at + "skipped step changed state " + names[k / layout.size()] + ": " + d);
      }
    } else {
      const Grads summed =
          reduced_grads(layout, dtype, GradKind::exact, key, static_cast<std::int64_t>(s), n,
                        static_cast<float>(scale));
      const double want_norm = averaged_norm(summed, n) / scale;
      if (!(std::fabs(norm - want_norm) <= 1e-6 * want_norm)) {
        fail(at + "clip_grad_norm " + std::to_string(norm) + ", expected " +
             std::to_string(want_norm));
      }
      ref.step(summed, 1.0 / n / scale);
      model.pull();
      for (std::size_t i = 0; i < layout.size(); ++i) {
        const std::string d = compare_bits(model.all_bits(i), ref.param_bits(i));
        if (!d.empty()) fail(at + layout.names[i] + ": " + d);
      }
    }
    if (info.step != ref.steps() || opt->steps() != ref.steps()) {
      fail(at + "StepInfo::step " + std::to_string(info.step) + ", steps() " +
           std::to_string(opt->steps()) + ", expected " + std::to_string(ref.steps()));
    }
  }
  if (opt->loss_scale() != scales.back()) {
    fail("final loss_scale() " + std::to_string(opt->loss_scale()) + ", expected " +
         std::to_string(scales.back()));
  }
  if (!failure.empty()) UNSCOPED_INFO("rank " << rank << ": " << failure);
  CHECK(all_ranks_true(failure.empty()));
}

}  // namespace

TEST_CASE("ZeRO loss scaler: an overflow on one rank skips the step everywhere; scale rule",
          "[zero][loss_scaler]") {
  // Backs off at every overflow, down to min_scale; grows after 3 good steps.
  const ScalerCase every{
      .scaler = {.init_scale = 1024, .growth_interval = 3, .hysteresis = 1, .min_scale = 512},
      .overflow = {false, true, false, false, false, true, true, false, false, false, false}};
  // Backs off from the second overflow in a row on; a good step in between
  // starts the count again.
  const ScalerCase hysteresis{
      .scaler = {.init_scale = 256, .growth_interval = 2, .hysteresis = 2, .min_scale = 1},
      .overflow = {true, false, true, true, false, false, true, true, true, false}};
  for (Precision p : all_precisions())
    for (int stage = 0; stage <= 2; ++stage) {
      check_loss_scaler(p, stage, every);
      check_loss_scaler(p, stage, hysteresis);
    }
}

namespace {

void set_lr_of(OptimizerConfig& c, double lr) {
  std::visit([lr](auto& o) { o.lr = lr; }, c);
}

}  // namespace

TEST_CASE("ZeRO: set_lr and param_group edits between steps", "[zero][lr]") {
  const Layout layout = make_layout({7, 300, 1, 64});
  for (Precision p : {Precision::f32, Precision::bf16})
    for (int stage = 0; stage <= 2; ++stage) {
      Run run = base_run(layout, p, AdamW{.lr = 1e-2, .weight_decay = 0.01}, stage, 6);
      run.key = 71;
      auto ok = std::make_shared<bool>(true);
      run.before_step = [ok](ZeroRedundancyOptimizer& opt, Reference& ref, int s) {
        const double lr = 1e-2 * (1.0 - 0.15 * s);
        opt.set_lr(lr);
        set_lr_of(ref.groups()[0], lr);
        *ok = *ok && lr_of(opt.param_group(0)) == lr;
        if (s == 2) {
          // Edit the variant in place: weight decay and betas.
          auto& cfg = std::get<AdamW>(opt.param_group(0));
          cfg.weight_decay = 0.2;
          cfg.betas = {0.8, 0.99};
          auto& want = std::get<AdamW>(ref.groups()[0]);
          want.weight_decay = 0.2;
          want.betas = {0.8, 0.99};
        }
        if (s == 4) {
          std::get<AdamW>(opt.param_group(0)).lr = 3e-2;
          std::get<AdamW>(ref.groups()[0]).lr = 3e-2;
        }
      };
      run_and_compare(run);
      CHECK(all_ranks_true(*ok));
    }
}

TEST_CASE("ZeRO: two parameter groups with their own hyper-parameters", "[zero][groups]") {
  const Layout layout = make_layout({7, 300, 1, 64, 129, 2}, {0, 1, 0, 1, 1, 0});
  const std::vector<OptimizerConfig> adam = {
      Adam{.lr = 1e-2}, Adam{.lr = 5e-3, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 0.1}};
  const std::vector<OptimizerConfig> sgd = {
      SGD{.lr = 0.05, .momentum = 0.9},
      SGD{.lr = 0.01, .momentum = 0.5, .dampening = 0.5, .weight_decay = 0.01}};
  for (const auto& groups : {adam, sgd})
    for (Precision p : {Precision::f32, Precision::bf16})
      for (int stage = 0; stage <= 2; ++stage) {
        Run run = base_run(layout, p, groups[0], stage, 5);
        run.groups = groups;
        run.options.bucket_mb = 0.0005;
        run.key = 81;
        auto ok = std::make_shared<bool>(true);
        run.before_step = [ok](ZeroRedundancyOptimizer& opt, Reference& ref, int s) {
          *ok = *ok && opt.num_groups() == 2;
          if (s == 2) {  // group 1 only
            opt.set_lr(2e-3, 1);
            set_lr_of(ref.groups()[1], 2e-3);
            *ok = *ok && lr_of(opt.param_group(1)) == 2e-3 &&
                  lr_of(opt.param_group(0)) == lr_of(ref.groups()[0]);
          }
          if (s == 4) {  // every group
            opt.set_lr(1e-3);
            set_lr_of(ref.groups()[0], 1e-3);
            set_lr_of(ref.groups()[1], 1e-3);
          }
        };
        run_and_compare(run);
        CHECK(all_ranks_true(*ok));
      }
}

namespace {

// What the custom optimizer saw, on this rank.
struct CustomLog {
  bool ok = true;
  std::string problem;
  std::size_t elements = 0;  // elements updated since the last reset
  double lr = -1.0;          // of the first call since the last reset: the engine's
  std::int64_t step = 0;     // the step count the calls must pass
  void fail(const std::string& s) {
    if (ok) problem = s;
    ok = false;
  }
};

// SGD with momentum as a custom optimizer: buf = 0.9 buf + g, p -= lr buf.
CustomOptimizer momentum_sgd(std::shared_ptr<CustomLog> log) {
  CustomOptimizer c;
  c.name = "momentum_sgd";
  c.state_names = {"momentum"};
  c.lr = 0.05;
  c.update = [log](const CustomStep& st, double lr) {
    if (st.grads.size() != st.params.size() || st.states.size() != 1 ||
        st.states[0].size() != st.params.size()) {
      log->fail("spans of different sizes");
      return;
    }
    if (st.group != 0) log->fail("group " + std::to_string(st.group));
    if (st.step != log->step) {
      log->fail("CustomStep::step " + std::to_string(st.step) + ", expected " +
                std::to_string(log->step));
    }
    if (log->lr < 0.0) log->lr = lr;
    const float flr = static_cast<float>(lr);
    for (std::size_t k = 0; k < st.params.size(); ++k) {
      if (st.step == 1 && st.states[0][k] != 0.0f) log->fail("a state is not zero before step 1");
      st.states[0][k] = 0.9f * st.states[0][k] + st.grads[k];
      st.params[k] -= flr * st.states[0][k];
    }
    log->elements += st.params.size();
  };
  return c;
}

}  // namespace

// The engine hands the custom update the averaged gradients, which it may
// compute as sum * (float)(1/N) or sum / N: within one rounding of the
// reference's, so the parameters are compared within 1e-6 relative (+1e-7
// absolute).
TEST_CASE("ZeRO: a custom element-wise optimizer", "[zero][custom][host-memory]") {
  const Layout layout = make_layout({7, 300, 1, 0, 64, 129});
  for (Precision p : {Precision::f32, Precision::bf16})
    for (int stage = 0; stage <= 2; ++stage) {
      auto log = std::make_shared<CustomLog>();
      Run run = base_run(layout, p, momentum_sgd(log), stage, 5);
      run.options.bucket_mb = 0.0005;
      run.key = 91;
      run.tolerance = Tolerance{.abs = 1e-7, .rel = 1e-6};
      auto problem = std::make_shared<std::string>();
      run.before_step = [](ZeroRedundancyOptimizer& opt, Reference& ref, int s) {
        if (s == 3) {
          opt.set_lr(0.02);
          set_lr_of(ref.groups()[0], 0.02);
        }
      };
      run.before_update = [log](ZeroRedundancyOptimizer&, const Grads&, int s, double grad_mul) {
        log->elements = 0;
        log->lr = -1.0;
        log->step = s + 1;
        return grad_mul;
      };
      // The reference also runs the update, over every element, after step().
      const std::size_t total = layout.total();
      run.after_step = [log, problem, total](ZeroRedundancyOptimizer& opt, const StepInfo&,
                                             const Grads&, int s) {
        const std::size_t engine = log->elements - total;
        const std::size_t want = opt.stage() == 0 ? total : shard_elements(opt);
        if (engine != want && problem->empty()) {
          *problem = "step " + std::to_string(s + 1) + ": the update saw " +
                     std::to_string(engine) + " elements on this rank, expected " +
                     std::to_string(want);
        }
        const double lr = s >= 3 ? 0.02 : 0.05;
        if (log->lr != lr && problem->empty())
          *problem = "update got lr " + std::to_string(log->lr);
      };
      run_and_compare(run);
      INFO("custom optimizer, stage " << stage << ", " << precision_name(p));
      if (!log->ok) UNSCOPED_INFO("rank " << world_rank() << ": " << log->problem);
      if (!problem->empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << *problem);
      CHECK(all_ranks_true(log->ok && problem->empty()));
    }
}

// With exact data the sum, the predivided sum (a power of two: exact) and a
// reduction in fp32 all give the reference's gradients bitwise.
TEST_CASE("ZeRO: reduction sum, predivide_factor, reduce_in_fp32", "[zero][reduction]") {
  const Layout layout = make_layout({7, 300, 1, 64, 129});
  for (int stage = 0; stage <= 2; ++stage) {
    for (Precision p : {Precision::f32, Precision::bf16}) {
      Run sum = base_run(layout, p, Adam{.lr = 1e-2}, stage, 3);
      sum.options.reduction = GradReduction::sum;
      sum.key = 101;
      run_and_compare(sum);
      for (GradReduction red : {GradReduction::avg, GradReduction::sum}) {
        Run pre = base_run(layout, p, SGD{.lr = 0.01, .momentum = 0.9}, stage, 3);
        pre.options.reduction = red;
        pre.options.predivide_factor = 2.0;
        pre.key = 102;
        run_and_compare(pre);
      }
    }
    for (Precision p : {Precision::bf16, Precision::f16, Precision::bf16_rem}) {
      Run fp32 = base_run(layout, p, Adam{.lr = 1e-2}, stage, 3);
      fp32.options.reduce_in_fp32 = true;
      fp32.options.bucket_mb = 0.0005;
      fp32.key = 103;
      run_and_compare(fp32);
    }
  }
}
