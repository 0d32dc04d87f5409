// The ZeRO engine against the single-process functional optimizers: on exact
// gradients (sums exact in every type and order), stages 0, 1 and 2 at any
// rank count give, after every one of 50 steps, the parameters of
// shardopt::functional::* run on the summed gradients with grad_mul = 1/N,
// bit for bit, and at the end the same optimizer state (gather_state), for
// every optimizer and precision. LAMB sums its per-tensor norms from the
// shards' pieces, so it equals the reference within a tolerance, and the
// three stages bitwise. On random gradients the stages agree bitwise with
// each other and stay within a stated tolerance of the reference.
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/zero.hpp"
#include "zero_helpers.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

namespace {

constexpr int kSteps = 50;

// A parameter of one element, an empty one, primes, one larger than a
// bucket: 491 elements.
Layout equivalence_layout() { return make_layout({1, 7, 0, 130, 61, 257, 2, 33}); }

// Small buckets (0.0005 MiB: about 131 fp32 or 262 16-bit gradients, which
// the engine rounds to a multiple of 16 N), so that parameters straddle
// buckets and several buckets are in flight.
ZeroOptions options_for(int stage) {
  ZeroOptions o;
  o.stage = stage;
  o.bucket_mb = 0.0005;
  return o;
}

// Every stage must equal the reference within `tol` (bitwise by default),
// and the three stages must equal each other bitwise.
void check_stages(const OptimizerConfig& cfg, Precision p, GradKind kind, int steps, Tolerance tol,
                  ZeroOptions base = options_for(0),
                  std::optional<Tolerance> state_tol = std::nullopt) {
  std::vector<Snapshot> snaps;
  for (int stage = 0; stage <= 2; ++stage) {
    Run run;
    run.layout = equivalence_layout();
    run.precision = p;
    run.groups = {cfg};
    run.options = base;
    run.options.stage = stage;
    run.kind = kind;
    run.key = kind == GradKind::exact ? 11 : 12;
    run.steps = steps;
    run.ready = Ready::reverse;
    run.tolerance = tol;
    run.state_tolerance = state_tol;
    snaps.push_back(run_and_compare(run).last);
  }
  INFO(describe(cfg) << ", " << precision_name(p) << ", "
                     << (kind == GradKind::exact ? "exact" : "random") << " gradients, "
                     << world_size() << " ranks: stages 1 and 2 against stage 0, bitwise");
  std::string d;
  for (int stage = 1; stage <= 2 && d.empty(); ++stage) {
    d = compare_snapshots(snaps[static_cast<std::size_t>(stage)], snaps[0]);
    if (!d.empty()) d = "stage " + std::to_string(stage) + ": " + d;
  }
  if (!d.empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << d);
  // Comparable where every stage got as far as its snapshot.
  bool comparable = true;
  for (const Snapshot& snap : snaps) comparable = comparable && !snap.params.empty();
  if (all_ranks_true(comparable)) CHECK(all_ranks_true(d.empty()));
}

void check_exact(const OptimizerConfig& cfg) {
  for (Precision p : all_precisions()) check_stages(cfg, p, GradKind::exact, kSteps, Tolerance{});
}

}  // namespace

TEST_CASE("ZeRO stages 0, 1, 2 equal functional SGD bitwise", "[zero][equivalence][sgd]") {
  check_exact(SGD{.lr = 0.01, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  check_exact(SGD{.lr = 0.01, .momentum = 0.8, .nesterov = true});
  check_exact(SGD{.lr = 0.05, .weight_decay = 0.02, .maximize = true});
}

TEST_CASE("ZeRO stages 0, 1, 2 equal functional Adam bitwise", "[zero][equivalence][adam]") {
  check_exact(Adam{.lr = 2e-3, .weight_decay = 0.01});
  check_exact(Adam{.lr = 1e-3, .betas = {0.8, 0.95}, .amsgrad = true, .maximize = true});
}

TEST_CASE("ZeRO stages 0, 1, 2 equal functional AdamW bitwise", "[zero][equivalence][adamw]") {
  check_exact(AdamW{.lr = 2e-3, .weight_decay = 0.05});
  check_exact(AdamW{.lr = 1e-3, .eps = 1e-6, .weight_decay = 0.01, .amsgrad = true});
}

TEST_CASE("ZeRO stages 0, 1, 2 equal functional Adagrad bitwise", "[zero][equivalence][adagrad]") {
  check_exact(Adagrad{
      .lr = 0.01, .lr_decay = 0.01, .weight_decay = 0.01, .initial_accumulator_value = 0.1});
}

TEST_CASE("ZeRO stages 0, 1, 2 equal functional RMSprop bitwise", "[zero][equivalence][rmsprop]") {
  check_exact(RMSprop{.lr = 5e-3, .weight_decay = 0.01, .momentum = 0.9, .centered = true});
  check_exact(RMSprop{.lr = 1e-2, .alpha = 0.9});
}

TEST_CASE("ZeRO stages 0, 1, 2 equal functional Lion bitwise", "[zero][equivalence][lion]") {
  check_exact(Lion{.lr = 1e-3, .betas = {0.9, 0.99}, .weight_decay = 0.1});
}

// LAMB's trust ratio divides norms summed over the shards' pieces of a
// tensor, not in the single-tensor kernel's order: the parameters (and
// masters and states) stay within 1e-5 relative (+1e-6 absolute, for
// elements near zero) of the single-process run after 50 steps, and the
// three stages, which cut the same shards, agree bitwise.
TEST_CASE("ZeRO LAMB: stages agree bitwise, the reference within 1e-5",
          "[zero][equivalence][lamb]") {
  const Lamb cfg{.lr = 1e-2, .weight_decay = 0.01};
  for (Precision p : all_precisions()) {
    check_stages(cfg, p, GradKind::exact, kSteps, Tolerance{.abs = 1e-6, .rel = 1e-5});
  }
}

// Random gradients: the sums round, in an order that depends on MPI, so the
// reference (which adds the ranks in order) differs in the last bit of some
// reduced gradients. The stages, which reduce with the same operations,
// still agree bitwise. Tolerances, over 20 steps: f32 parameters and states
// within 1e-5 relative + 1e-5 absolute. 16-bit gradients reduced in 16 bits
// may differ by one 16-bit ulp (2^-8 relative for bf16) per step, which
// moves an update of size about lr by lr * 2^-8, and where the ranks'
// gradients nearly cancel may flip the sign of a normalized update (Adam's
// first step is lr * sign(g)), once: parameters within 20 * lr * 2^-4 + two
// of the largest updates absolute (lr, or lr / (sqrt(1 - alpha) * (1 -
// momentum)) for RMSprop, whose first step divides g by sqrt(1 - alpha) |g|)
// + 0.05 relative. The states within 0.02 absolute + 0.1 relative, as
// RMSprop's momentum buffer adds up g / sqrt(square_avg). Reduced in fp32
// (reduce_in_fp32) both are back to the fp32 tolerance.
TEST_CASE("ZeRO on random gradients: stages agree bitwise, the reference within tolerance",
          "[zero][equivalence][random]") {
  constexpr int steps = 20;
  const std::vector<OptimizerConfig> configs = {
      SGD{.lr = 0.01, .momentum = 0.9, .nesterov = true},
      Adam{.lr = 1e-3, .weight_decay = 0.01, .amsgrad = true},
      AdamW{.lr = 1e-3},
      Adagrad{.lr = 0.01, .lr_decay = 0.01},
      // Not centered: sqrt(square_avg - grad_avg^2) cancels where the
      // gradients barely vary, and there the last bit of a sum can move a
      // centered update arbitrarily far (the exact-data tests cover it).
      RMSprop{.lr = 1e-3, .momentum = 0.5},
      Lion{.lr = 1e-4, .weight_decay = 0.1},
      Lamb{.lr = 1e-2},
  };
  for (const OptimizerConfig& cfg : configs) {
    const double lr = lr_of(cfg);
    check_stages(cfg, Precision::f32, GradKind::random, steps, Tolerance{.abs = 1e-5, .rel = 1e-5});
    ZeroOptions fp32_reduce = options_for(0);
    fp32_reduce.reduce_in_fp32 = true;
    check_stages(cfg, Precision::bf16, GradKind::random, steps, Tolerance{.abs = 1e-5, .rel = 1e-5},
                 fp32_reduce);
    double largest_update = lr;
    if (const auto* r = std::get_if<RMSprop>(&cfg)) {
      largest_update = lr / (std::sqrt(1.0 - r->alpha) * (1.0 - r->momentum));
    }
    const Tolerance params16{.abs = steps * lr / 16 + 2 * largest_update, .rel = 0.05};
    const Tolerance states16{.abs = 0.02, .rel = 0.1};
    check_stages(cfg, Precision::bf16, GradKind::random, steps, params16, options_for(0), states16);
    check_stages(cfg, Precision::f16, GradKind::random, steps, params16, options_for(0), states16);
  }
}

// Every element-wise optimizer of shardopt/optimizers.hpp, with its default
// options (the learning rate 1e-3), so that an optimizer added to the table
// is stepped by the engine without a word here: fp32, and bf16 with
// remainders (the masters decoded and encoded around the same step).
TEST_CASE("ZeRO stages 0, 1, 2 equal the functional step bitwise, every optimizer of the table",
          "[zero][equivalence][table]") {
  Optimizers::each([]<class O>() {
    if constexpr (is_elementwise<O>) {
      O o{};
      o.lr = 1e-3;
      for (Precision p : {Precision::f32, Precision::bf16_rem})
        check_stages(o, p, GradKind::exact, kSteps, Tolerance{});
    }
  });
}
