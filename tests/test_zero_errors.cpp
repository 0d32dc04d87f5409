// Bad input to the ZeRO engine. A layout that differs between ranks (any
// field of any parameter, any option, the optimizer, its hyper-parameters)
// throws a layout_mismatch error on every rank, with one message, the same
// everywhere, naming the first difference; a bad argument throws
// InvalidArgument (or UnsupportedError) on every rank, also when only one
// rank passed it; nothing hangs. Differences need two ranks: at one rank
// those cases check that each changed layout, alone, is a valid one (a lone
// rank agrees with itself), so that at more ranks the error is the
// difference's. Misuse of a constructed engine: test_zero_misuse.cpp.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/zero.hpp"
#include "zero_helpers.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

namespace {

// What every rank registers unless a case changes it on one rank.
struct Inputs {
  Layout layout = make_layout({7, 300, 1, 64});
  DType dtype = DType::f32;
  std::vector<OptimizerConfig> groups = {Adam{.lr = 1e-3}};
  ZeroOptions options{};
  bool owned_grads = false;
};

// Builds this rank's model from `in` and constructs the optimizer.
Caught construct(const Inputs& in, bool distributed = false) {
  Model model(in.layout, in.dtype, false, in.owned_grads, 7);
  return catch_error([&] {
    if (distributed) {
      DistributedOptimizer opt(world(), model.params(), in.groups, in.options);
    } else {
      ZeroRedundancyOptimizer opt(world(), model.params(), in.groups, in.options);
    }
  });
}

// Constructs with raw parameters (for buffers the Model cannot describe).
Caught construct(std::vector<Param> params, const std::vector<OptimizerConfig>& groups,
                 const ZeroOptions& options = {}) {
  return catch_error(
      [&] { ZeroRedundancyOptimizer opt(world(), std::move(params), groups, options); });
}

// The rank whose input differs: not always the last or the first one.
int odd_rank(int case_no) { return case_no % world_size(); }

struct MismatchCase {
  std::string what;
  std::vector<std::string> needles;         // the first difference, named
  std::function<void(Inputs&)> change;      // applied on the odd rank only
  std::function<void(Inputs&)> change_all;  // applied on every rank first (may be empty)
};

}  // namespace

TEST_CASE("ZeRO: any layout difference between ranks is a layout_mismatch on every rank",
          "[zero][errors][layout]") {
  const std::vector<MismatchCase> cases = {
      {"one more parameter",
       {"param"},
       [](Inputs& in) {
         in.layout.names.push_back("extra.bias");
         in.layout.sizes.push_back(5);
       },
       {}},
      {"one parameter fewer",
       {"param"},
       [](Inputs& in) {
         in.layout.names.pop_back();
         in.layout.sizes.pop_back();
       },
       {}},
      {"a different name",
       {"layer2.weight|parameter 2"},
       [](Inputs& in) { in.layout.names[2] = "layer2.weight.renamed"; },
       {}},
      {"a different size",
       {"layer1.bias|parameter 1"},
       [](Inputs& in) { in.layout.sizes[1] += 1; },
       {}},
      {"a size 0 against 1",
       {"layer2.weight|parameter 2"},
       [](Inputs& in) { in.layout.sizes[2] = 0; },
       {}},
      {"a different dtype",
       {"layer0.weight|parameter 0|dtype"},
       [](Inputs& in) { in.dtype = DType::bf16; },
       {}},
      {"a different group",
       {"layer3.bias|parameter 3"},
       [](Inputs& in) {
         in.layout.groups = {0, 0, 0, 1};
       },
       [](Inputs& in) {
         in.groups = {Adam{.lr = 1e-3}, Adam{.lr = 1e-3}};
       }},
      {"a different stage",
       {"stage"},
       [](Inputs& in) { in.options.stage = in.options.stage == 2 ? 1 : 2; },
       {}},
      {"a different bucket size",
       {"bucket"},
       [](Inputs& in) { in.options.bucket_mb = 2.0; },
       [](Inputs& in) { in.options.bucket_mb = 1.0; }},
      {"a different reduction",
       {"reduction"},
       [](Inputs& in) { in.options.reduction = GradReduction::sum; },
       {}},
      {"a different predivide_factor",
       {"predivide"},
       [](Inputs& in) { in.options.predivide_factor = 2.0; },
       {}},
      {"reduce_in_fp32 on one rank",
       {"reduce_in_fp32"},
       [](Inputs& in) { in.options.reduce_in_fp32 = true; },
       [](Inputs& in) { in.dtype = DType::bf16; }},
      {"param_remainders on one rank",
       {"param_remainders"},
       [](Inputs& in) { in.options.param_remainders = true; },
       [](Inputs& in) { in.dtype = DType::bf16; }},
      {"check_sync_every on one rank",
       {"check_sync_every"},
       [](Inputs& in) { in.options.check_sync_every = 5; },
       {}},
      {"a different non_finite policy",
       {"non_finite"},
       [](Inputs& in) { in.options.non_finite = NonFinite::error; },
       {}},
      {"stream_grads on one rank",
       {"stream_grads"},
       [](Inputs& in) { in.options.stream_grads = true; },
       [](Inputs& in) { in.options.stage = 2; }},  // stream_grads is stage 2 only
      {"a different gather limit",
       {"gather_limit_bytes"},
       [](Inputs& in) { in.options.gather_limit_bytes = 1 << 20; },
       [](Inputs& in) { in.options.stage = 3; }},
      {"prefetch off on one rank",
       {"prefetch"},
       [](Inputs& in) { in.options.prefetch = false; },
       [](Inputs& in) { in.options.stage = 3; }},
      {"reshard_after_forward off on one rank",
       {"reshard_after_forward"},
       [](Inputs& in) { in.options.reshard_after_forward = false; },
       [](Inputs& in) { in.options.stage = 3; }},
      {"a different persist_below_bytes",
       {"persist_below_bytes"},
       [](Inputs& in) { in.options.persist_below_bytes = 0; },
       [](Inputs& in) { in.options.stage = 3; }},
      {"a loss scaler on one rank",
       {"loss_scaler"},
       [](Inputs& in) { in.options.loss_scaler = LossScaler{}; },
       {}},
      {"a different loss scaler setting",
       {"growth_interval|loss_scaler"},
       [](Inputs& in) { in.options.loss_scaler->growth_interval = 100; },
       [](Inputs& in) { in.options.loss_scaler = LossScaler{}; }},
      {"a different optimizer kind",
       {"Adam"},
       [](Inputs& in) { in.groups = {AdamW{.lr = 1e-3}}; },
       {}},
      {"a different lr", {"lr"}, [](Inputs& in) { in.groups = {Adam{.lr = 2e-3}}; }, {}},
      {"different betas",
       {"betas"},
       [](Inputs& in) {
         in.groups = {Adam{.lr = 1e-3, .betas = {0.9, 0.99}}};
       },
       {}},
      {"amsgrad on one rank",
       {"amsgrad"},
       [](Inputs& in) { in.groups = {Adam{.lr = 1e-3, .amsgrad = true}}; },
       {}},
      {"a different number of groups",
       {"group"},
       [](Inputs& in) { in.groups.push_back(Adam{.lr = 1e-3}); },
       {}},
      {"a different hyper-parameter in the second group",
       {"weight_decay"},
       [](Inputs& in) { in.groups[1] = SGD{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5}; },
       [](Inputs& in) {
         in.groups = {SGD{.lr = 0.1, .momentum = 0.9}, SGD{.lr = 0.1, .momentum = 0.9}};
         in.layout.groups = {0, 1, 0, 1};
       }},
      {"a different custom optimizer",
       {"custom"},
       [](Inputs& in) { std::get<CustomOptimizer>(in.groups[0]).name = "custom_v2"; },
       [](Inputs& in) {
         CustomOptimizer c;
         c.state_names = {"velocity"};
         c.update = [](const CustomStep&, double) {};
         in.groups = {c};
       }},
      {"a custom optimizer's state names",
       {"state"},
       [](Inputs& in) {
         std::get<CustomOptimizer>(in.groups[0]).state_names = {"velocity", "v2"};
       },
       [](Inputs& in) {
         CustomOptimizer c;
         c.state_names = {"velocity"};
         c.update = [](const CustomStep&, double) {};
         in.groups = {c};
       }},
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const MismatchCase& c = cases[k];
    // Custom optimizers run on the host only: with device parameters they
    // are refused on every rank before any layout is compared
    // (test_device_zero.cpp checks the refusal).
    if (Model::on_device && std::string(c.what).find("custom") != std::string::npos) continue;
    for (int stage = 0; stage <= 2; stage += 2) {
      Inputs in;
      in.options.stage = stage;
      if (c.change_all) c.change_all(in);
      const int odd = odd_rank(static_cast<int>(k));
      if (world_rank() == odd) c.change(in);
      INFO(c.what << " on rank " << odd << " of " << world_size() << ", stage " << stage);
      if (world_size() == 1) {
        const Caught alone = construct(in);
        if (alone.threw) UNSCOPED_INFO("alone, it threw: " << alone.what);
        CHECK_FALSE(alone.threw);
        continue;
      }
      check_caught(construct(in), {ErrorCode::layout_mismatch}, c.needles, true);
    }
  }
}

TEST_CASE("ZeRO: DistributedOptimizer agrees on the layout too", "[zero][errors][layout]") {
  Inputs in;
  if (world_rank() == world_size() - 1) in.layout.sizes[3] = 65;
  if (world_size() == 1) {
    const Caught alone = construct(in, true);
    if (alone.threw) UNSCOPED_INFO("alone, it threw: " << alone.what);
    CHECK_FALSE(alone.threw);
    return;
  }
  check_caught(construct(in, true), {ErrorCode::layout_mismatch}, {"layer3.bias|parameter 3"},
               true);
}

namespace {

struct BadCase {
  std::string what;
  ErrorCode code;
  std::vector<std::string> needles;
  std::function<Caught()> run;
};

}  // namespace

TEST_CASE("ZeRO: bad arguments are errors on every rank", "[zero][errors][arguments]") {
  std::vector<float> buf(64), grads(64);
  auto param = [&](std::string name, std::size_t offset, std::size_t numel,
                   std::size_t grad_offset) {
    return Param{.name = std::move(name),
                 .data = buf.data() + offset,
                 .numel = numel,
                 .dtype = DType::f32,
                 .grad = grads.data() + grad_offset,
                 .group = 0};
  };
  const std::vector<OptimizerConfig> adam = {Adam{}};
  std::vector<bfloat16> half(16), half_grads(16);
  std::vector<float16> f16(16), f16_grads(16);
  const ErrorCode invalid = ErrorCode::invalid_argument;
  const std::vector<BadCase> cases = {
      {"overlapping parameter buffers",
       invalid,
       {"a", "b"},
       [&] {
         return construct({param("a", 0, 10, 0), param("b", 5, 10, 10)}, adam);
       }},
      {"one parameter buffer twice",
       invalid,
       {"a", "b"},
       [&] {
         return construct({param("a", 0, 10, 0), param("b", 0, 10, 10)}, adam);
       }},
      {"overlapping gradient buffers",
       invalid,
       {"a", "b"},
       [&] {
         return construct({param("a", 0, 10, 0), param("b", 10, 10, 5)}, adam);
       }},
      {"a duplicate name",
       invalid,
       {"twice"},
       [&] {
         return construct({param("twice", 0, 10, 0), param("twice", 10, 10, 10)}, adam);
       }},
      {"null data with numel > 0",
       invalid,
       {"nulled"},
       [&] {
         Param p = param("nulled", 10, 10, 10);
         p.data = nullptr;
         return construct({param("a", 0, 10, 0), p}, adam);
       }},
      {"a shape whose product is not numel",
       invalid,
       {"shaped", "[3, 4]"},
       [&] {
         Param p = param("shaped", 10, 10, 10);
         p.shape = {3, 4};
         return construct({param("a", 0, 10, 0), p}, adam);
       }},
      {"mixed dtypes",
       invalid,
       {"half"},
       [&] {
         Param p{.name = "half",
                 .data = half.data(),
                 .numel = 16,
                 .dtype = DType::bf16,
                 .grad = half_grads.data()};
         return construct({param("a", 0, 10, 0), p}, adam);
       }},
      {"an f64 parameter",
       ErrorCode::unsupported,
       {"f64"},
       [&] {
         std::vector<double> d(4), g(4);
         return construct({Param{.name = "dbl",
                                 .data = d.data(),
                                 .numel = 4,
                                 .dtype = DType::f64,
                                 .grad = g.data()}},
                          adam);
       }},
      {"group index past the groups",
       invalid,
       {"grouped"},
       [&] {
         Param p = param("grouped", 10, 10, 10);
         p.group = 1;
         return construct({param("a", 0, 10, 0), p}, adam);
       }},
      {"a negative group index",
       invalid,
       {"grouped"},
       [&] {
         Param p = param("grouped", 10, 10, 10);
         p.group = -1;
         return construct({param("a", 0, 10, 0), p}, adam);
       }},
      {"no parameter groups",
       invalid,
       {"group"},
       [&] { return construct({param("a", 0, 10, 0)}, {}); }},
      {"groups of different kinds",
       invalid,
       {"group"},
       [&] {
         Param p = param("b", 10, 10, 10);
         p.group = 1;
         return construct({param("a", 0, 10, 0), p}, {Adam{}, SGD{.lr = 0.1}});
       }},
      {"stage 4",
       invalid,
       {"stage"},
       [&] { return construct({param("a", 0, 10, 0)}, adam, ZeroOptions{.stage = 4}); }},
      {"stage -1",
       invalid,
       {"stage"},
       [&] { return construct({param("a", 0, 10, 0)}, adam, ZeroOptions{.stage = -1}); }},
      {"a negative bucket size",
       invalid,
       {"bucket_mb"},
       [&] { return construct({param("a", 0, 10, 0)}, adam, ZeroOptions{.bucket_mb = -1.0}); }},
      {"predivide_factor 0",
       invalid,
       {"predivide_factor"},
       [&] {
         return construct({param("a", 0, 10, 0)}, adam, ZeroOptions{.predivide_factor = 0.0});
       }},
      {"param_remainders with f16 parameters",
       ErrorCode::unsupported,
       {"f16"},
       [&] {
         ZeroOptions o;
         o.param_remainders = true;
         return construct({Param{.name = "h",
                                 .data = f16.data(),
                                 .numel = 16,
                                 .dtype = DType::f16,
                                 .grad = f16_grads.data()}},
                          adam, o);
       }},
      {"a negative learning rate",
       invalid,
       {"learning rate"},
       [&] { return construct({param("a", 0, 10, 0)}, {Adam{.lr = -1e-3}}); }},
      {"a beta of 1",
       invalid,
       {"beta"},
       [&] {
         return construct({param("a", 0, 10, 0)}, {AdamW{.betas = {0.9, 1.0}}});
       }},
      {"nesterov without momentum",
       invalid,
       {"esterov"},
       [&] { return construct({param("a", 0, 10, 0)}, {SGD{.lr = 0.1, .nesterov = true}}); }},
      {"a custom optimizer without an update",
       invalid,
       {"update"},
       [&] {
         CustomOptimizer c;
         c.state_names = {"m"};
         return construct({param("a", 0, 10, 0)}, {c});
       }},
      {"a loss scaler with init_scale 0",
       invalid,
       {"init_scale"},
       [&] {
         ZeroOptions o;
         o.loss_scaler = LossScaler{.init_scale = 0.0};
         return construct({param("a", 0, 10, 0)}, adam, o);
       }},
  };
  for (const BadCase& c : cases) {
    INFO(c.what << ", on every rank");
    const Caught caught = c.run();
    const ErrorCode alt = c.code == invalid ? ErrorCode::unsupported : invalid;
    // Either code is acceptable where the issue allows both; the named
    // argument and the agreement across ranks are what matter.
    check_caught(caught, {c.code, alt}, c.needles, true);
  }
}

// One rank's bad argument: every rank must learn of it and throw, or the
// others would wait in the layout agreement (or step later on their own).
TEST_CASE("ZeRO: a bad argument on one rank only is an error on every rank",
          "[zero][errors][arguments]") {
  std::vector<float> buf(64), grads(64);
  const int odd = world_size() - 1;
  const bool me = world_rank() == odd;
  auto param = [&](std::string name, std::size_t offset, std::size_t numel) {
    return Param{.name = std::move(name),
                 .data = buf.data() + offset,
                 .numel = numel,
                 .dtype = DType::f32,
                 .grad = grads.data() + offset,
                 .group = 0};
  };
  const std::vector<OptimizerConfig> adam = {Adam{}};
  {
    INFO("rank " << odd << " passes null data");
    std::vector<Param> p = {param("a", 0, 10), param("nulled", 10, 10)};
    if (me) p[1].data = nullptr;
    check_caught(construct(p, adam), {ErrorCode::invalid_argument}, {"nulled"}, true);
  }
  {
    INFO("rank " << odd << " passes overlapping buffers");
    std::vector<Param> p = {param("a", 0, 10), param("b", 10, 10)};
    if (me) p[1].data = buf.data() + 5;
    check_caught(construct(p, adam), {ErrorCode::invalid_argument}, {"a", "b"}, true);
  }
  {
    INFO("rank " << odd << " passes one gradient buffer twice");
    std::vector<Param> p = {param("a", 0, 10), param("b", 10, 10)};
    if (me) p[1].grad = grads.data();
    check_caught(construct(p, adam), {ErrorCode::invalid_argument}, {"a", "b"}, true);
  }
}
