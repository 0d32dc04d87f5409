// The ZeRO engine against the single-process functional optimizers: on exact
// gradients (sums exact in every type and order), stages 0, 1 and 2 at any
// rank count give, after every one of 50 steps, the parameters of
// shardopt::functional::* run on the summed gradients with grad_mul = 1/N,
// bit for bit, and at the end the same optimizer state (gather_state), for
// every optimizer and precision. LAMB sums its per-tensor norms from the
// shards' pieces, so it equals the reference within a tolerance, and the
// three stages bitwise. On random gradients the stages agree bitwise with
// each other and stay within a bound of the reference derived from the
// rounding of the sums (below).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
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
// The data of the exact and of the random runs (Run::key).
constexpr std::uint64_t kExactKey = 11;
constexpr std::uint64_t kRandomKey = 12;

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
                  std::optional<Tolerance> state_tol = std::nullopt,
                  std::shared_ptr<const ElementBounds> bounds = nullptr) {
  std::vector<Snapshot> snaps;
  for (int stage = 0; stage <= 2; ++stage) {
    Run run;
    run.layout = equivalence_layout();
    run.precision = p;
    run.groups = {cfg};
    run.options = base;
    run.options.stage = stage;
    run.kind = kind;
    run.key = kind == GradKind::exact ? kExactKey : kRandomKey;
    run.steps = steps;
    run.ready = Ready::reverse;
    run.tolerance = tol;
    run.state_tolerance = state_tol;
    run.bounds = bounds;
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

// ------------------------------------------------------------ random data
//
// Random gradients (uniform in [-1, 1), rounded to the gradient type): the
// sums round, so the reference equals the engine only as far as the two
// reduce alike. The three stages, which reduce with the same operations,
// still agree bitwise. Reduced in fp32 (f32 models, and reduce_in_fp32), the
// parameters and states stay within 1e-5 relative + 1e-5 absolute of the
// reference.
//
// Reduced in 16 bits, the bound comes from the rounding. What differs: each
// rank's gradient x_r is a 16-bit value in [-1, 1]; the engine and the
// reference both add the N of them with N - 1 additions, each of which takes
// two 16-bit values to f32, adds them (rounded to f32) and rounds the sum to
// the 16-bit type; the engine adds in the order MPI picks (the MPI op is
// commutative, and MPI's algorithms change with N), the reference in rank
// order. From the same reduced gradients every step of the engine is the
// reference's bit for bit (the exact-data tests above), so the runs differ
// only where the two orders round differently:
//
//  - N <= 2: one addition, and x_0 + x_1 is x_1 + x_0: the same bits, so no
//    difference for any optimizer; the bound is 0.
//  - N >= 3: an addition whose result holds k of the gradients has a sum of
//    at most k in magnitude and rounds it twice, by at most half an f32 ulp
//    and half a 16-bit ulp: k u, with u = 2^-24 + 2^-8 for bf16 and
//    2^-24 + 2^-11 for f16 (8 and 11 significant bits; f16 subnormals round
//    by 2^-25, less). Any order makes N - 1 additions holding at most 2, 3,
//    ..., N gradients (a chain; a tree's hold fewer), so its sum is within
//    u (N (N + 1) / 2 - 1) of the exact sum, and two orders differ by at
//    most delta = u (N - 1) (N + 2): 10 u at 3 ranks, 18 u at 4 (bf16: 0.039
//    and 0.070), which grad_mul = 1/N divides by N.
//
// So every reduced gradient of every step may be off by up to delta, and how
// far that moves the parameters and states is the optimizer's doing. The
// reference measures it: it runs again with all reduced gradients of one
// step s moved by +delta, and again by -delta; the largest change of an
// element (of the master after any later step, of each state at the end) is
// step s's share, and the element's bound is the sum of its 20 shares. To
// first order in delta that bounds every mix of errors of at most delta
// (exactly, for SGD, which is linear in the gradients). The shares are small
// where the update follows the gradient smoothly: SGD, and Adam, AdamW,
// Adagrad, RMSprop and LAMB once their second moments have grown. They are
// up to two whole updates for an element whose reduced gradient lies within
// delta of a sign change of a normalized update: the first step of Adam,
// AdamW, Adagrad, RMSprop and LAMB is a multiple of sign(g), and every step
// of Lion is lr * sign(c). Only those elements get that much. LAMB also sums
// each tensor's norms from the shards' pieces in fp32, in another order than
// the reference: the exact-data test's 1e-6 absolute + 1e-5 relative come on
// top. The bound holds for the masters after every step and at the end, and
// for the states at the end; the 16-bit parameters are their masters rounded
// (within one 16-bit ulp of the reference's master after each step, and
// bitwise the engine's own masters rounded at the end).
//
// A bound must also reject optimizers that do not work: masters left where
// they started (a do-nothing update) and masters moved by the opposite of the
// reference's update (a wrong-sign update) must both fail it for more than
// half of the elements. They fail it for all of them at 1 and 2 ranks; at 3
// and 4 ranks, over several seeds, for 85% or more (wrong sign) and 75% or
// more (doing nothing), except with Lion, down to 74%: Lion's updates are
// +-lr, so an element with as many steps up as down is back where it
// started (weight decay aside), where doing nothing is right.

// delta above, in units of the summed gradients (before grad_mul).
float order_delta(Precision p, int ranks) {
  if (ranks <= 2) return 0.0f;
  const double u = 0x1p-24 + (param_dtype(p) == DType::f16 ? 0x1p-11 : 0x1p-8);
  return static_cast<float>(u * (ranks - 1) * (ranks + 2));
}

// The reference on the random data, and the bounds above.
struct RandomReference {
  std::vector<std::vector<float>> initial, final;  // the masters, per parameter
  ElementBounds bounds;                            // "master" and each state
};

// Runs the reference on the random gradients of run_and_compare at
// world_size() ranks, then once for each step and sign with that step's
// reduced gradients moved by `delta`.
RandomReference random_reference(const OptimizerConfig& cfg, Precision p, int steps, float delta) {
  const Layout layout = equivalence_layout();
  const int n = world_size();
  const DType dtype = param_dtype(p);
  const Model init(layout, dtype, false, false, kRandomKey);
  std::vector<Grads> grads;
  for (int s = 0; s < steps; ++s) {
    grads.push_back(reduced_grads(layout, dtype, GradKind::random, kRandomKey, s, n));
  }
  const std::vector<std::string> state_names = optimizer_state_names(cfg);
  struct Trace {
    std::vector<std::vector<std::vector<float>>> masters;  // [step][param]
    std::map<std::string, std::vector<std::vector<float>>> states;
  };
  // With moved >= 0, step `moved` gets its gradients plus `by`.
  auto trace = [&](int moved, float by) {
    Trace t;
    Reference ref(init, p, {cfg});
    for (int s = 0; s < steps; ++s) {
      Grads g = grads[static_cast<std::size_t>(s)];
      if (s == moved) {
        for (auto& v : g)
          for (float& x : v) x += by;
      }
      ref.step(g, default_grad_mul(ZeroOptions{}, n));
      auto& m = t.masters.emplace_back();
      for (std::size_t i = 0; i < layout.size(); ++i) m.push_back(ref.master(i));
    }
    for (const std::string& name : state_names)
      for (std::size_t i = 0; i < layout.size(); ++i) t.states[name].push_back(ref.state(name, i));
    return t;
  };
  const Trace base = trace(-1, 0.0f);
  RandomReference out;
  out.final = base.masters.back();
  std::vector<std::vector<double>> zeros;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    std::vector<float> m(layout.sizes[i]);
    for (std::size_t j = 0; j < m.size(); ++j) m[j] = init.param(i, j);
    out.initial.push_back(m);
    zeros.emplace_back(layout.sizes[i], 0.0);
  }
  out.bounds["master"] = zeros;
  for (const std::string& name : state_names) out.bounds[name] = zeros;
  if (delta == 0.0f) return out;
  auto widen = [](std::vector<std::vector<double>>& share, const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b) {
    for (std::size_t i = 0; i < share.size(); ++i)
      for (std::size_t j = 0; j < share[i].size(); ++j)
        share[i][j] = std::max(share[i][j], std::fabs(static_cast<double>(a[i][j]) - b[i][j]));
  };
  for (int s = 0; s < steps; ++s) {
    ElementBounds share;
    share["master"] = zeros;
    for (const std::string& name : state_names) share[name] = zeros;
    for (const float by : {delta, -delta}) {
      const Trace t = trace(s, by);
      for (int later = s; later < steps; ++later) {
        widen(share["master"], t.masters[static_cast<std::size_t>(later)],
              base.masters[static_cast<std::size_t>(later)]);
      }
      for (const std::string& name : state_names)
        widen(share[name], t.states.at(name), base.states.at(name));
    }
    for (auto& [name, per_param] : out.bounds)
      for (std::size_t i = 0; i < per_param.size(); ++i)
        for (std::size_t j = 0; j < per_param[i].size(); ++j) per_param[i][j] += share[name][i][j];
  }
  return out;
}

// How many elements of `masters` the comparison with the bound rejects.
std::size_t rejected(const RandomReference& r, const std::vector<std::vector<float>>& masters,
                     Tolerance tol) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < masters.size(); ++i)
    bad += count_outside(masters[i], r.final[i], tol, element_bounds(&r.bounds, "master", i));
  return bad;
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
  const std::size_t elements = equivalence_layout().total();
  for (const OptimizerConfig& cfg : configs) {
    check_stages(cfg, Precision::f32, GradKind::random, steps, Tolerance{.abs = 1e-5, .rel = 1e-5});
    ZeroOptions fp32_reduce = options_for(0);
    fp32_reduce.reduce_in_fp32 = true;
    check_stages(cfg, Precision::bf16, GradKind::random, steps, Tolerance{.abs = 1e-5, .rel = 1e-5},
                 fp32_reduce);
    const Tolerance tol =
        std::holds_alternative<Lamb>(cfg) ? Tolerance{.abs = 1e-6, .rel = 1e-5} : Tolerance{};
    for (Precision p : {Precision::bf16, Precision::f16}) {
      const float delta = order_delta(p, world_size());
      const RandomReference r = random_reference(cfg, p, steps, delta);
      std::vector<std::vector<float>> wrong_sign = r.initial;
      for (std::size_t i = 0; i < wrong_sign.size(); ++i)
        for (std::size_t j = 0; j < wrong_sign[i].size(); ++j)
          wrong_sign[i][j] = 2.0f * r.initial[i][j] - r.final[i][j];
      const std::size_t do_nothing_rejected = rejected(r, r.initial, tol);
      const std::size_t wrong_sign_rejected = rejected(r, wrong_sign, tol);
      INFO(describe(cfg) << ", " << precision_name(p) << ", " << world_size() << " ranks, delta "
                         << delta << ": of " << elements << " elements, the bound rejects "
                         << do_nothing_rejected << " of a do-nothing update and "
                         << wrong_sign_rejected << " of a wrong-sign update");
      CHECK(do_nothing_rejected * 2 > elements);
      CHECK(wrong_sign_rejected * 2 > elements);
      check_stages(cfg, p, GradKind::random, steps, tol, options_for(0), std::nullopt,
                   std::make_shared<const ElementBounds>(r.bounds));
    }
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
