// shardopt::lr_scheduler against torch 1.13's torch.optim.lr_scheduler: every
// case of tests/data/golden/lr_schedules.txt (scripts/make_golden_lr.py: two
// parameter groups, 40 steps) made here with the same options, each learning
// rate after construction and after each step equal bit for bit. Then an
// LrGroups bound to an optimizer sets its groups' learning rates, and bad
// options are errors that name the option.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/lr_scheduler.hpp"
#include "shardopt/zero.hpp"

#ifndef SHARDOPT_SOURCE_DIR
#error "tests/test_lr_scheduler.cpp needs -DSHARDOPT_SOURCE_DIR=\"<repository root>\""
#endif

using namespace shardopt;
using namespace shardopt::lr_scheduler;

namespace {

struct GoldenCase {
  std::string name;
  std::vector<std::vector<double>> lrs;  // after construction, then after each step
};

std::vector<GoldenCase> load_golden() {
  const std::string path = std::string(SHARDOPT_SOURCE_DIR) + "/tests/data/golden/lr_schedules.txt";
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<GoldenCase> cases;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    if (line.rfind("case ", 0) == 0) {
      std::string word;
      GoldenCase c;
      words >> word >> c.name;
      cases.push_back(c);
      continue;
    }
    REQUIRE(!cases.empty());
    std::vector<double> row;
    for (std::string v; words >> v;) row.push_back(std::strtod(v.c_str(), nullptr));
    cases.back().lrs.push_back(row);
  }
  return cases;
}

// The schedule of each case, as the script makes it with torch; step() of
// the returned function advances it.
struct Made {
  std::shared_ptr<LRScheduler> one;
  std::shared_ptr<ChainedScheduler> chained;
  std::shared_ptr<SequentialLR> sequential;
  void step() {
    if (one) one->step();
    if (chained) chained->step();
    if (sequential) sequential->step();
  }
};

Made make(const std::string& name, LrGroups& g) {
  Made m;
  const auto one = [&](auto s) { m.one = std::move(s); };
  if (name == "step") one(std::make_shared<StepLR>(g, StepLR::Options{3, 0.5}));
  if (name == "multistep")
    one(std::make_shared<MultiStepLR>(g, MultiStepLR::Options{{9, 2, 5, 5}, 0.3}));
  if (name == "constant") one(std::make_shared<ConstantLR>(g, ConstantLR::Options{0.25, 4}));
  if (name == "linear_warmup") one(std::make_shared<LinearLR>(g, LinearLR::Options{0.1, 1.0, 10}));
  if (name == "linear_decay") one(std::make_shared<LinearLR>(g, LinearLR::Options{1.0, 0.05, 30}));
  if (name == "exponential") one(std::make_shared<ExponentialLR>(g, ExponentialLR::Options{0.93}));
  if (name == "cosine")
    one(std::make_shared<CosineAnnealingLR>(g, CosineAnnealingLR::Options{10, 0.001}));
  if (name == "cosine_restarts")
    one(std::make_shared<CosineAnnealingWarmRestarts>(
        g, CosineAnnealingWarmRestarts::Options{4, 2, 1e-4}));
  if (name == "cosine_restarts_even")
    one(std::make_shared<CosineAnnealingWarmRestarts>(g, CosineAnnealingWarmRestarts::Options{7}));
  if (name == "polynomial") one(std::make_shared<PolynomialLR>(g, PolynomialLR::Options{12, 2.0}));
  if (name == "onecycle")
    one(std::make_shared<OneCycleLR>(g,
                                     OneCycleLR::Options{.max_lr = {0.5, 0.2}, .total_steps = 40}));
  if (name == "onecycle_linear_3")
    one(std::make_shared<OneCycleLR>(
        g, OneCycleLR::Options{.max_lr = {0.3},
                               .total_steps = 40,
                               .pct_start = 0.25,
                               .anneal_strategy = OneCycleLR::Anneal::linear,
                               .three_phase = true}));
  if (name == "lambda")
    one(std::make_shared<LambdaLR>(
        g, std::vector<LambdaLR::Lambda>{
               [](std::int64_t e) { return std::pow(0.95, static_cast<double>(e)); },
               [](std::int64_t e) { return 1.0 / static_cast<double>(1 + e); }}));
  if (name == "multiplicative")
    one(std::make_shared<MultiplicativeLR>(
        g, std::vector<LambdaLR::Lambda>{[](std::int64_t) { return 0.9; }}));
  if (name == "chained") {
    std::vector<std::shared_ptr<LRScheduler>> s = {
        std::make_shared<ConstantLR>(g, ConstantLR::Options{0.5, 3}),
        std::make_shared<ExponentialLR>(g, ExponentialLR::Options{0.9})};
    m.chained = std::make_shared<ChainedScheduler>(s);
  }
  if (name == "sequential_warmup_cosine") {
    std::vector<std::shared_ptr<LRScheduler>> s = {
        std::make_shared<LinearLR>(g, LinearLR::Options{.start_factor = 0.1, .total_iters = 5}),
        std::make_shared<CosineAnnealingLR>(g, CosineAnnealingLR::Options{20})};
    m.sequential = std::make_shared<SequentialLR>(s, std::vector<std::int64_t>{5});
  }
  if (name == "sequential_three") {
    std::vector<std::shared_ptr<LRScheduler>> s = {
        std::make_shared<ConstantLR>(g, ConstantLR::Options{0.5, 3}),
        std::make_shared<ExponentialLR>(g, ExponentialLR::Options{0.9}),
        std::make_shared<StepLR>(g, StepLR::Options{2, 0.5})};
    m.sequential = std::make_shared<SequentialLR>(s, std::vector<std::int64_t>{4, 9});
  }
  return m;
}

}  // namespace

TEST_CASE("learning-rate schedules give torch 1.13's sequences bit for bit", "[unit][lr]") {
  const std::vector<GoldenCase> cases = load_golden();
  REQUIRE(cases.size() >= 17);
  for (const GoldenCase& c : cases) {
    INFO("case " << c.name);
    LrGroups groups({0.1, 0.05});
    Made m = make(c.name, groups);
    REQUIRE((m.one || m.chained || m.sequential));
    for (std::size_t k = 0; k < c.lrs.size(); ++k) {
      INFO("after " << k << " steps");
      if (k > 0) m.step();
      REQUIRE(c.lrs[k].size() == 2);
      for (std::size_t g = 0; g < 2; ++g) {
        INFO("group " << g);
        CHECK(groups.lr(g) == c.lrs[k][g]);
      }
    }
  }
}

TEST_CASE("an LrGroups bound to an optimizer sets its groups' learning rates", "[unit][lr]") {
  std::vector<float> w(8, 1.0f), v(4, 1.0f);
  std::vector<Param> ps = {{.name = "w", .data = w.data(), .numel = w.size(), .group = 0},
                           {.name = "v", .data = v.data(), .numel = v.size(), .group = 1}};
  ZeroRedundancyOptimizer opt(test::world(), ps,
                              std::vector<OptimizerConfig>{Adam{.lr = 0.1}, Adam{.lr = 0.05}});
  LrGroups groups(opt);
  CHECK(groups.lrs() == std::vector<double>{0.1, 0.05});
  StepLR s(groups, {.step_size = 1, .gamma = 0.5});
  s.step();
  const auto lr_of = [&](int g) {
    return std::visit([](const auto& c) { return c.lr; }, opt.param_group(g));
  };
  CHECK(lr_of(0) == 0.05);
  CHECK(lr_of(1) == 0.025);
  CHECK(s.get_last_lr() == std::vector<double>{0.05, 0.025});
}

TEST_CASE("bad schedule options are errors that name the option", "[unit][lr]") {
  LrGroups g({0.1, 0.05});
  const auto fails = [](auto&& make, const std::string& text) {
    try {
      make();
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
      return;
    }
    FAIL("no error: " << text);
  };
  fails([&] { StepLR(g, {.step_size = 0}); }, "StepLR: step_size is 0");
  fails([&] { LinearLR(g, {.start_factor = 0.0}); }, "LinearLR: start_factor is 0");
  fails([&] { ConstantLR(g, {.factor = 2.0}); }, "ConstantLR: factor is 2");
  fails([&] { CosineAnnealingLR(g, {.t_max = 0}); }, "CosineAnnealingLR: t_max is 0");
  fails(
      [&] {
        OneCycleLR(g, {.max_lr = {1, 2, 3}, .total_steps = 10});
      },
      "max_lr has 3 values for 2 parameter groups");
  fails(
      [&] {
        std::vector<std::shared_ptr<LRScheduler>> s = {
            std::make_shared<StepLR>(g, StepLR::Options{}),
            std::make_shared<StepLR>(g, StepLR::Options{})};
        SequentialLR(s, {});
      },
      "SequentialLR: 0 milestones for 2 schedules");
  LrGroups other({0.1, 0.05});
  fails(
      [&] {
        std::vector<std::shared_ptr<LRScheduler>> s = {
            std::make_shared<StepLR>(g, StepLR::Options{}),
            std::make_shared<StepLR>(other, StepLR::Options{})};
        ChainedScheduler c(s);
      },
      "the schedules drive different LrGroups");
  OneCycleLR one(g, {.max_lr = {0.5}, .total_steps = 2});
  one.step();
  one.step();
  fails([&] { one.step(); }, "OneCycleLR: step 3 is past total_steps 2");
}
