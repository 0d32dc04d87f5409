// Bad input to the ZeRO engine. A layout that differs between ranks (any
// field of any parameter, any option, the optimizer, its hyper-parameters)
// throws a layout_mismatch error on every rank, with one message, the same
// everywhere, naming the first difference; a bad argument throws
// InvalidArgument (or UnsupportedError) on every rank, also when only one
// rank passed it; nothing hangs. Differences need two ranks: at one rank
// those cases check that each changed layout, alone, is a valid one (a lone
// rank agrees with itself), so that at more ranks the error is the
// difference's.
#include <mpi.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/device.hpp"
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

// What an error looked like on this rank.
struct Caught {
  bool threw = false;
  bool is_shardopt = false;
  ErrorCode code = ErrorCode::internal;
  std::string message, hint, what;
  int rank = -2;
};

template <class F>
Caught catch_error(F&& f) {
  Caught c;
  try {
    f();
  } catch (const Error& e) {
    c.threw = c.is_shardopt = true;
    c.code = e.code();
    c.message = e.message();
    c.hint = e.hint();
    c.what = e.what();
    c.rank = e.rank();
  } catch (const std::exception& e) {
    c.threw = true;
    c.what = e.what();
  } catch (...) {
    c.threw = true;
    c.what = "something that is not a std::exception";
  }
  return c;
}

// Whether `message` mentions `needle`, or one of its alternatives
// separated by '|' ("layer1.bias|parameter 1": by name or by index).
bool mentions(const std::string& message, const std::string& needle) {
  std::size_t start = 0;
  while (true) {
    const std::size_t bar = needle.find('|', start);
    const std::string alt = needle.substr(start, bar == std::string::npos ? bar : bar - start);
    if (message.find(alt) != std::string::npos) return true;
    if (bar == std::string::npos) return false;
    start = bar + 1;
  }
}

// Checks an error caught on every rank: a shardopt::Error with one of
// `codes`, mentioning each of `needles` (see mentions()), a hint, this
// rank's rank, and (same_message) the same message on every rank.
// Collective.
void check_caught(const Caught& c, std::vector<ErrorCode> codes,
                  const std::vector<std::string>& needles, bool same_message) {
  std::string problem;
  if (!c.threw) {
    problem = "no exception";
  } else if (!c.is_shardopt) {
    problem = "not a shardopt::Error: " + c.what;
  } else {
    bool code_ok = false;
    for (ErrorCode k : codes) code_ok = code_ok || c.code == k;
    if (!code_ok) problem = std::string("code ") + error_code_name(c.code);
    for (const std::string& needle : needles) {
      if (!mentions(c.message, needle) && problem.empty()) {
        problem = "the message does not mention \"" + needle + "\"";
      }
    }
    if (c.hint.empty() && problem.empty()) problem = "no hint";
    if (c.rank != world_rank() && problem.empty())
      problem = "Error::rank() " + std::to_string(c.rank);
  }
  std::string expected;
  for (ErrorCode k : codes)
    expected += std::string(expected.empty() ? "" : " or ") + error_code_name(k);
  INFO("expected " << expected << " on every rank");
  if (!problem.empty()) {
    UNSCOPED_INFO("rank " << world_rank() << ": " << problem << " (" << c.what << ")");
  }
  CHECK(all_ranks_true(problem.empty()));
  if (same_message) {
    const bool same = same_on_all_ranks(c.message);
    if (!same) UNSCOPED_INFO("rank " << world_rank() << ": message \"" << c.message << "\"");
    CHECK(same);
  }
  // Nothing left half-done: the world still reduces.
  CHECK(all_ranks_true(no_throw([] { world().barrier(); })));
}

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
      {"stage 3",
       invalid,
       {"stage"},
       [&] { return construct({param("a", 0, 10, 0)}, adam, ZeroOptions{.stage = 3}); }},
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

// The host side of the wrong-device check (the device side is in the gpu
// suite, tests/gpu/test_gpu_memory.cu): every kind of host memory a program
// hands over is located as host memory and accepted, and the step is right.
TEST_CASE("ZeRO: parameters and gradients in any host memory are accepted",
          "[zero][errors][device]") {
  constexpr std::size_t n = 1000;
  static float static_data[n], static_grad[n];
  float stack_data[n], stack_grad[n];
  std::vector<float> heap_data(n), heap_grad(n);
  const std::size_t map_bytes = 2 * n * sizeof(float);
  void* mapped =
      mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mapped != MAP_FAILED);
  float* map_data = static_cast<float*>(mapped);
  float* map_grad = map_data + n;
  // Each parameter's data and gradient in a different kind of memory.
  const std::vector<std::pair<float*, float*>> buffers = {{static_data, map_grad},
                                                          {stack_data, heap_grad.data()},
                                                          {heap_data.data(), static_grad},
                                                          {map_data, stack_grad}};
  std::vector<Param> params;
  std::vector<std::vector<double>> want;
  std::mt19937 rng(test_seed());
  std::uniform_int_distribution<int> k(-64, 64);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    auto [data, grad] = buffers[i];
    CHECK(detail::locate(data).kind == detail::MemoryKind::host);
    CHECK(detail::locate(grad).kind == detail::MemoryKind::host);
    std::vector<double> w(n);
    for (std::size_t j = 0; j < n; ++j) {
      // Quarters: the gradient's mean over the ranks is exact.
      data[j] = static_cast<float>(k(rng)) * 0.25f;
      grad[j] = static_cast<float>(k(rng)) * 0.25f;
      w[j] = double(data[j]) - 0.5 * double(grad[j]);
    }
    want.push_back(std::move(w));
    params.push_back(Param{.name = "p" + std::to_string(i),
                           .data = data,
                           .numel = n,
                           .dtype = DType::f32,
                           .grad = grad,
                           .group = 0});
  }
  const std::vector<std::vector<float>> start = [&] {
    std::vector<std::vector<float>> v;
    for (const auto& [data, grad] : buffers) {
      v.emplace_back(data, data + n);
      v.emplace_back(grad, grad + n);
    }
    return v;
  }();
  for (int stage : {0, 1, 2}) {
    INFO("stage " << stage);
    for (std::size_t i = 0; i < buffers.size(); ++i) {  // the step may clear gradients
      std::copy(start[2 * i].begin(), start[2 * i].end(), buffers[i].first);
      std::copy(start[2 * i + 1].begin(), start[2 * i + 1].end(), buffers[i].second);
    }
    ZeroOptions options;
    options.stage = stage;
    std::unique_ptr<ZeroRedundancyOptimizer> opt;
    const bool made = no_throw([&] {
      opt = std::make_unique<ZeroRedundancyOptimizer>(
          world(), params, std::vector<OptimizerConfig>{SGD{.lr = 0.5}}, options);
    });
    REQUIRE(all_ranks_true(made));
    opt->step();
    double worst = 0;
    for (std::size_t i = 0; i < buffers.size(); ++i)
      for (std::size_t j = 0; j < n; ++j)
        worst = std::max(worst, std::abs(double(buffers[i].first[j]) - want[i][j]));
    CHECK(worst == 0.0);
  }
  munmap(mapped, map_bytes);
}

namespace {

// An optimizer over `model`, constructed on every rank or (then CHECKed)
// on none.
std::unique_ptr<ZeroRedundancyOptimizer> make_optimizer(Model& model, int stage) {
  ZeroOptions options;
  options.stage = stage;
  options.bucket_mb = 0.0005;
  std::unique_ptr<ZeroRedundancyOptimizer> opt;
  const bool made = no_throw([&] {
    opt = std::make_unique<ZeroRedundancyOptimizer>(world(), model.params(),
                                                    std::vector<OptimizerConfig>{Adam{}}, options);
  });
  if (!all_ranks_true(made)) {
    CHECK(made);
    opt.reset();
  }
  return opt;
}

}  // namespace

// Some gradients marked ready and others never: the next reduction (by
// reduce_gradients() in stage 2, clip_grad_norm() or step()) says which, on
// every rank, instead of waiting for buckets that never fill.
TEST_CASE("ZeRO: gradients never marked ready are named at the next reduction",
          "[zero][errors][ready]") {
  const Layout layout = make_layout({7, 300, 1, 64, 129});
  for (int stage = 0; stage <= 2; ++stage)
    for (int call = 0; call < 3; ++call) {
      if (call == 0 && stage != 2) continue;
      Model model(layout, DType::f32, false, false, 9);
      auto opt = make_optimizer(model, stage);
      if (!opt) continue;
      const char* what = call == 0   ? "reduce_gradients()"
                         : call == 1 ? "clip_grad_norm()"
                                     : "step()";
      INFO("stage " << stage << ", " << what << " with layer1.bias and layer3.bias never marked");
      for (std::size_t i = 0; i < layout.size(); ++i) {
        fill_grad(model.grad_data(i), DType::f32, layout.sizes[i], GradKind::exact, 9, 0,
                  world_rank(), i, false);
      }
      const Caught c = catch_error([&] {
        for (std::size_t i : {4u, 2u, 0u}) opt->grad_ready(i);
        if (call == 0) opt->reduce_gradients();
        if (call == 1) opt->clip_grad_norm(1.0);
        opt->step();
      });
      check_caught(c, {ErrorCode::invalid_argument, ErrorCode::invalid_state},
                   {"layer1.bias", "layer3.bias"}, true);
      opt.reset();
      CHECK(all_ranks_true(no_throw([] { world().barrier(); })));
    }
}

// Stages 0 and 1 reduce once per step: a gradient marked ready after the
// reduction (here finished by clip_grad_norm()) would be left out of it.
TEST_CASE("ZeRO stages 0 and 1: marking a gradient after the reduction is an error",
          "[zero][errors][ready]") {
  const Layout layout = make_layout({7, 300, 1});
  for (int stage = 0; stage <= 1; ++stage) {
    Model model(layout, DType::f32, false, false, 11);
    auto opt = make_optimizer(model, stage);
    if (!opt) continue;
    INFO("stage " << stage << ": grad_ready(1) after clip_grad_norm()");
    for (std::size_t i = 0; i < layout.size(); ++i) {
      fill_grad(model.grad_data(i), DType::f32, layout.sizes[i], GradKind::exact, 11, 0,
                world_rank(), i, false);
    }
    const bool reduced = no_throw([&] {
      for (std::size_t i : {2u, 1u, 0u}) opt->grad_ready(i);
      opt->clip_grad_norm(1e9);
    });
    if (!all_ranks_true(reduced)) {
      CHECK(reduced);
      continue;
    }
    check_caught(catch_error([&] { opt->grad_ready(1); }),
                 {ErrorCode::invalid_argument, ErrorCode::invalid_state}, {"1"}, true);
    opt.reset();
    CHECK(all_ranks_true(no_throw([] { world().barrier(); })));
  }
}

TEST_CASE("ZeRO: bad indices and names in local calls", "[zero][errors][arguments]") {
  const Layout layout = make_layout({7, 30});
  for (int stage = 0; stage <= 2; ++stage) {
    Model model(layout, DType::f32, false, false, 10);
    ZeroOptions options;
    options.stage = stage;
    std::unique_ptr<ZeroRedundancyOptimizer> opt;
    const bool made = no_throw([&] {
      opt = std::make_unique<ZeroRedundancyOptimizer>(
          world(), model.params(), std::vector<OptimizerConfig>{Adam{}}, options);
    });
    if (!all_ranks_true(made)) {
      CHECK(made);
      continue;
    }
    INFO("stage " << stage);
    {
      INFO("grad_ready(2) of 2 parameters");
      check_caught(catch_error([&] { opt->grad_ready(2); }), {ErrorCode::invalid_argument}, {"2"},
                   false);
    }
    {
      INFO("set_lr(0.1, 1) with one group");
      check_caught(catch_error([&] { opt->set_lr(0.1, 1); }), {ErrorCode::invalid_argument}, {"1"},
                   false);
    }
    {
      INFO("gather_state of an unknown state (collective)");
      check_caught(catch_error([&] { opt->gather_state("momentum_buffer", 0); }),
                   {ErrorCode::invalid_argument}, {"momentum_buffer"}, true);
      check_caught(catch_error([&] { opt->gather_state("master", 2); }),
                   {ErrorCode::invalid_argument}, {"2"}, true);
    }
    {
      INFO("grad_ready(0, nullptr)");
      check_caught(catch_error([&] { opt->grad_ready(0, nullptr); }), {ErrorCode::invalid_argument},
                   {"null"}, false);
    }
    // The optimizer still works after every rejected call.
    opt->zero_grad();
    StepInfo info;
    const bool stepped = no_throw([&] { info = opt->step(); });
    CHECK(all_ranks_true(stepped && info.applied && info.step == 1));
  }
}

// Calls in the wrong order or with bad values, on every rank alike: each is
// an error naming the problem, and the optimizer keeps working afterwards.
TEST_CASE("ZeRO: misuse of the step calls is an error, and the optimizer recovers",
          "[zero][errors][calls]") {
  const Layout layout = make_layout({7, 30});
  for (int stage = 0; stage <= 2; ++stage) {
    Model model(layout, DType::f32, false, false, 12);
    auto opt = make_optimizer(model, stage);
    if (!opt) continue;
    INFO("stage " << stage);
    {
      INFO("grad_ready(1) twice in one micro-batch");
      check_caught(catch_error([&] {
                     opt->grad_ready(1);
                     opt->grad_ready(1);
                   }),
                   {ErrorCode::invalid_state}, {"twice"}, true);
      opt->zero_grad();
    }
    if (stage < 2) {
      INFO("reduce_gradients() twice before step()");
      check_caught(catch_error([&] {
                     opt->reduce_gradients();
                     opt->reduce_gradients();
                   }),
                   {ErrorCode::invalid_state}, {"twice"}, true);
      opt->zero_grad();
    }
    for (double bad : {0.0, -1.0, std::nan("")}) {
      INFO("clip_grad_norm(" << bad << ")");
      check_caught(catch_error([&] { opt->clip_grad_norm(bad); }), {ErrorCode::invalid_argument},
                   {"max_norm"}, true);
    }
    {
      INFO("param_group(1) with one group");
      check_caught(catch_error([&] { opt->param_group(1); }), {ErrorCode::invalid_argument},
                   {"group 1"}, true);
    }
    {
      INFO("the kind of optimizer changed between steps");
      opt->param_group(0) = SGD{};
      check_caught(catch_error([&] { opt->step(); }), {ErrorCode::invalid_argument}, {"kind"},
                   true);
      opt->param_group(0) = Adam{};
    }
    opt->zero_grad();
    StepInfo info;
    const bool stepped = no_throw([&] { info = opt->step(); });
    CHECK(all_ranks_true(stepped && info.applied && info.step == 1));
    {
      INFO("a moved-from optimizer");
      ZeroRedundancyOptimizer moved(std::move(*opt));
      check_caught(catch_error([&] { opt->step(); }), {ErrorCode::invalid_state}, {"moved"}, true);
    }
    CHECK(all_ranks_true(no_throw([] { world().barrier(); })));
  }
}

// stream_grads: only in stage 2, and a streamed gradient exists only
// through grad_ready(i, grad).
TEST_CASE("ZeRO: stream_grads is stage 2 only and needs grad_ready(i, grad)",
          "[zero][errors][stream]") {
  const Layout layout = make_layout({7, 30});
  Model model(layout, DType::f32, false, true, 13);  // no gradient buffers
  for (int stage = 0; stage <= 1; ++stage) {
    INFO("stream_grads with stage " << stage);
    ZeroOptions options;
    options.stage = stage;
    options.stream_grads = true;
    check_caught(
        catch_error([&] { ZeroRedundancyOptimizer opt(world(), model.params(), Adam{}, options); }),
        {ErrorCode::invalid_argument}, {"stream_grads"}, true);
  }
  ZeroOptions options;
  options.stage = 2;
  options.stream_grads = true;
  options.bucket_mb = 0.0001;
  std::unique_ptr<ZeroRedundancyOptimizer> opt;
  const bool made = no_throw([&] {
    opt = std::make_unique<ZeroRedundancyOptimizer>(world(), model.params(), Adam{}, options);
  });
  REQUIRE(all_ranks_true(made));
  {
    INFO("grad_ready(1) without the gradient");
    check_caught(catch_error([&] { opt->grad_ready(1); }), {ErrorCode::invalid_argument},
                 {"no gradient buffer"}, true);
  }
  {
    INFO("step() with no gradient given");
    check_caught(catch_error([&] { opt->step(); }), {ErrorCode::invalid_state},
                 {"layer0.weight", "layer1.bias"}, true);
  }
  std::vector<float> scratch(30, 0.25f);
  opt->zero_grad();
  StepInfo info;
  const bool stepped = no_throw([&] {
    for (std::size_t i : {1u, 0u}) opt->grad_ready(i, scratch.data());
    info = opt->step();
  });
  CHECK(all_ranks_true(stepped && info.applied && info.step == 1));
}
