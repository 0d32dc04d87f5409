// ZeroOptions::non_finite: an inf or a NaN in one rank's gradient, at every
// stage. skip: every rank skips the step (parameters, every state and the
// step count bitwise untouched, the skip counted) and the run goes on
// bitwise as one that never saw the bad batch; error: NonFiniteError on
// every rank naming the first parameter and element, nothing updated, and
// the optimizer usable after zero_grad(); ignore (the default without a
// loss scaler): no check, the NaN reaches the parameter. Bad combinations
// and disagreeing values are errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/zero.hpp"
#include "zero_helpers.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

namespace {

const Layout& nf_layout() {
  static const Layout l = make_layout({5, 300, 1, 77, 1000});
  return l;
}

// This rank's exact gradients of batch `batch`; with `poison`, element
// `elem` of parameter `param` on rank `on` is set to `value`.
void fill(Model& m, std::int64_t batch, int on = -1, std::size_t param = 0, std::size_t elem = 0,
          float value = 0.0f) {
  const Layout& l = m.layout();
  for (std::size_t i = 0; i < l.size(); ++i)
    fill_grad(m.grad_host(i), m.dtype(), l.sizes[i], GradKind::exact, 31, batch, world_rank(), i,
              false);
  if (world_rank() == on) store(m.dtype(), m.grad_host(param), elem, value);
  for (std::size_t i = 0; i < l.size(); ++i)
    Model::upload(m.grad_data(i), m.grad_host(i), l.sizes[i] * dtype_size(m.dtype()));
}

// Element `elem` of gradient `param` set to `value` (host mirror and buffer).
void poison(Model& m, std::size_t param, std::size_t elem, float value) {
  store(m.dtype(), m.grad_host(param), elem, value);
  Model::upload(m.grad_data(param), m.grad_host(param),
                m.layout().sizes[param] * dtype_size(m.dtype()));
}

// Every parameter's bits and every state, gathered: what must not change.
struct Frozen {
  std::vector<std::vector<std::uint32_t>> params;
  std::vector<std::vector<float>> states;
  std::int64_t steps = 0;
  bool operator==(const Frozen&) const = default;
};
Frozen frozen(ZeroRedundancyOptimizer& opt, Model& m) {
  m.pull();
  Frozen s;
  for (std::size_t i = 0; i < m.layout().size(); ++i) {
    s.params.push_back(m.all_bits(i));
    for (const std::string& name : opt.state_names()) s.states.push_back(opt.gather_state(name, i));
  }
  s.steps = opt.steps();
  return s;
}

}  // namespace

TEST_CASE("non_finite skip: the step is skipped on every rank, nothing changes",
          "[zero][nonfinite]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int stage : {0, 1, 2}) {
    for (float bad : {nan, -inf}) {
      INFO("stage " << stage << ", " << bad);
      Model m(nf_layout(), DType::f32, false, false, 3),
          clean(nf_layout(), DType::f32, false, false, 3);
      const ZeroOptions o{.stage = stage, .bucket_mb = 0.001, .non_finite = NonFinite::skip};
      ZeroRedundancyOptimizer opt(world(), m.params(), AdamW{.lr = 0.01}, o);
      ZeroRedundancyOptimizer ref(world(), clean.params(), AdamW{.lr = 0.01}, o);
      // Step 1 on both; then a bad batch on the last rank for opt only.
      fill(m, 0);
      fill(clean, 0);
      CHECK(settled(opt, opt.step(), true).applied);
      ref.step();
      const Frozen before = frozen(opt, m);
      fill(m, 1, world_size() - 1, 4, 999, bad);
      const StepInfo info = settled(opt, opt.step(), true);
      CHECK(all_ranks_true(!info.applied && !info.grads_finite && info.step == 1));
      CHECK(opt.skipped_steps() == 1);
      CHECK(all_ranks_true(frozen(opt, m) == before));
      // Then the same good batches on both: bitwise the same run.
      for (std::int64_t b = 2; b < 4; ++b) {
        fill(m, b);
        fill(clean, b);
        CHECK(settled(opt, opt.step(), true).applied);
        ref.step();
      }
      CHECK(all_ranks_true(frozen(opt, m) == frozen(ref, clean)));
    }
  }
}

TEST_CASE("non_finite error: NonFiniteError on every rank naming the parameter and element",
          "[zero][nonfinite]") {
  for (int stage : {0, 1, 2}) {
    for (DType t : {DType::f32, DType::bf16}) {
      INFO("stage " << stage << ", " << dtype_name(t));
      Model m(nf_layout(), t, false, false, 3);
      ZeroRedundancyOptimizer opt(
          world(), m.params(), Adam{.lr = 0.01},
          ZeroOptions{.stage = stage, .bucket_mb = 0.001, .non_finite = NonFinite::error});
      fill(m, 0);
      opt.step();
      const Frozen before = frozen(opt, m);
      // Two bad values on different ranks: parameter 1 element 250 (on rank
      // 0) comes before parameter 3 element 2 (on the last rank).
      fill(m, 1, 0, 1, 250, std::numeric_limits<float>::quiet_NaN());
      if (world_rank() == world_size() - 1) poison(m, 3, 2, std::numeric_limits<float>::infinity());
      CHECK(all_ranks_true(throws_error<NonFiniteError>(
          [&] { opt.step(); }, ErrorCode::non_finite,
          "step 2: the gradient of parameter '" + nf_layout().names[1] +
              "' (index 1) is nan at element 250 after the reduction over ranks")));
      CHECK(all_ranks_true(frozen(opt, m) == before));
      CHECK(opt.skipped_steps() == 0);
      // Only the later one: it is named.
      fill(m, 1, world_size() - 1, 3, 2, std::numeric_limits<float>::infinity());
      CHECK(all_ranks_true(throws_error<NonFiniteError>(
          [&] { opt.step(); }, ErrorCode::non_finite,
          "parameter '" + nf_layout().names[3] + "' (index 3) is inf at element 2")));
      // After zero_grad() and good gradients the optimizer steps.
      opt.zero_grad();
      fill(m, 2);
      StepInfo info;
      CHECK(all_ranks_true(no_throw([&] { info = opt.step(); })));
      CHECK(info.applied);
      CHECK(opt.steps() == 2);
    }
  }
}

TEST_CASE("non_finite ignore (the default without a loss scaler): no check", "[zero][nonfinite]") {
  for (NonFinite p : {NonFinite::automatic, NonFinite::ignore}) {
    Model m(nf_layout(), DType::f32, false, false, 3);
    ZeroRedundancyOptimizer opt(world(), m.params(), SGD{.lr = 0.1},
                                ZeroOptions{.stage = 2, .bucket_mb = 0.001, .non_finite = p});
    fill(m, 0, 0, 2, 0, std::numeric_limits<float>::quiet_NaN());
    const StepInfo info = opt.step();
    m.pull();
    CHECK(info.applied);
    CHECK(std::isnan(m.param(2, 0)));  // on every rank, after the allgather
    CHECK(std::isfinite(m.param(1, 0)));
    CHECK(opt.skipped_steps() == 0);
  }
}

TEST_CASE("non_finite: bad values and disagreement are errors", "[zero][nonfinite]") {
  Model m(nf_layout(), DType::f32, false, false, 3);
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] {
        ZeroRedundancyOptimizer opt(
            world(), m.params(), Adam{},
            ZeroOptions{.loss_scaler = LossScaler{}, .non_finite = NonFinite::ignore});
      },
      ErrorCode::invalid_argument, "NonFinite::ignore with a loss scaler")));
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] {
        ZeroRedundancyOptimizer opt(world(), m.params(), Adam{},
                                    ZeroOptions{.non_finite = static_cast<NonFinite>(7)});
      },
      ErrorCode::invalid_argument, "non_finite is 7")));
  if (world_size() > 1) {
    const NonFinite p = world_rank() == 0 ? NonFinite::skip : NonFinite::error;
    CHECK(all_ranks_true(throws_error<Error>(
        [&] { ZeroRedundancyOptimizer opt(world(), m.params(), Adam{}, {.non_finite = p}); },
        ErrorCode::layout_mismatch, "non_finite")));
  }
}
