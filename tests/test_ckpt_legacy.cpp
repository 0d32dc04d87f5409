// Checkpoints written by an earlier shardopt still load: tests/data/ckpt-v1/
// holds one file per optimizer (and a bf16 model with parameter remainders),
// written at 2 ranks by this file's writer (see tests/data/ckpt-v1/README.md)
// before the optimizers were described by one table each. Loading one must
// restore exactly the state of the same run done here (the engine's math is
// unchanged), its step count and its groups' hyper-parameters, at any rank
// count; and the next step must then be the uninterrupted run's.
#include <cstdlib>
#include <filesystem>

#include "zero_helpers.hpp"

namespace shardopt::test::zero {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kSavedSteps = 3;
constexpr std::uint64_t kKey = 0x1e6ac7;

struct LegacyCase {
  const char* file;
  Precision precision;
  std::vector<OptimizerConfig> groups;
};

// Two groups with different hyper-parameters, so that the file's group
// metadata is exercised; every optional state slot is in use.
std::vector<LegacyCase> legacy_cases() {
  return {
      {"sgd",
       Precision::f32,
       {SGD{.lr = 0.05, .momentum = 0.9, .nesterov = true},
        SGD{.lr = 0.02, .momentum = 0.5, .dampening = 0.1, .weight_decay = 0.01}}},
      {"adam",
       Precision::f32,
       {Adam{.lr = 0.01, .amsgrad = true},
        Adam{.lr = 0.002, .weight_decay = 0.1, .amsgrad = true}}},
      {"adamw",
       Precision::f32,
       {AdamW{.lr = 0.01, .betas = {0.8, 0.95}}, AdamW{.lr = 0.003, .weight_decay = 0.2}}},
      {"adagrad",
       Precision::f32,
       {Adagrad{.lr = 0.05, .lr_decay = 0.01, .initial_accumulator_value = 0.1},
        Adagrad{.lr = 0.02, .weight_decay = 0.1}}},
      {"rmsprop",
       Precision::f32,
       {RMSprop{.lr = 0.003, .momentum = 0.9, .centered = true},
        RMSprop{.lr = 0.001, .alpha = 0.9, .momentum = 0.5, .centered = true}}},
      {"lion", Precision::f32, {Lion{.lr = 1e-3}, Lion{.lr = 3e-4, .weight_decay = 0.1}}},
      {"lamb", Precision::f32, {Lamb{.lr = 0.01}, Lamb{.lr = 0.004, .weight_decay = 0.1}}},
      {"adam-bf16-remainders",
       Precision::bf16_rem,
       {Adam{.lr = 0.01}, Adam{.lr = 0.004, .weight_decay = 0.1}}},
  };
}

const Layout& legacy_layout() {
  static const Layout l = make_layout({37, 100, 5, 64}, {0, 1, 0, 1});
  return l;
}

// A model and its optimizer (stage 1, so that the saving run was sharded).
// The gradients sum over ranks (reduction sum) and only rank 0's are not
// zero, so the run is the same at every rank count.
struct Trained {
  Model model;
  ZeroRedundancyOptimizer opt;
  Trained(const LegacyCase& c, std::vector<OptimizerConfig> groups)
      : model(legacy_layout(), param_dtype(c.precision), true, false, kKey),
        opt(world(), model.params(), std::move(groups),
            {.stage = 1,
             .reduction = GradReduction::sum,
             .param_remainders = c.precision == Precision::bf16_rem}) {}

  void step(std::int64_t s) {
    opt.zero_grad();
    for (std::size_t i = 0; i < legacy_layout().size(); ++i)
      fill_grad(model.grad_data(i), model.dtype(), legacy_layout().sizes[i], GradKind::random, kKey,
                s, 0, i, false, world_rank() == 0 ? 1.0f : 0.0f);
    opt.step();
  }
};

std::string legacy_path(const char* name) {
  return std::string(SHARDOPT_SOURCE_DIR) + "/tests/data/ckpt-v1/" + name + ".safetensors";
}

// Writes the files instead of testing them, when SHARDOPT_TEST_WRITE_CKPT_V1
// names a directory (tests/data/ckpt-v1/README.md).
TEST_CASE("checkpoints of the first format load, with their state and groups", "[ckpt][legacy]") {
  const char* out = std::getenv("SHARDOPT_TEST_WRITE_CKPT_V1");
  for (const LegacyCase& c : legacy_cases()) {
    INFO(c.file);
    if (out != nullptr) {
      Trained run(c, c.groups);
      for (std::int64_t s = 1; s <= kSavedSteps; ++s) run.step(s);
      run.opt.save(std::string(out) + "/" + c.file + ".safetensors");
      CHECK(run.opt.steps() == kSavedSteps);
      continue;
    }
    // Built with other hyper-parameters (every non-zero number; not the flags, which
    // decide the states): load() restores the file's.
    std::vector<OptimizerConfig> other = c.groups;
    for (auto& g : other)
      std::visit(
          [](auto& o) {
            using O = std::remove_cvref_t<decltype(o)>;
            if constexpr (is_optimizer<O>)
              O::fields([&](const char*, auto member, const char*, Check) {
                auto& v = o.*member;
                if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, double>)
                  v = v * 1.5;
                else if constexpr (requires { v.first; })
                  v = {v.first * 0.5, v.second * 0.5};
              });
          },
          g);
    Trained loaded(c, other);
    const LoadReport report = loaded.opt.load(legacy_path(c.file));
    CHECK(report.step == kSavedSteps);
    CHECK(report.saved_ranks == 2);
    CHECK(report.hyper_parameters);
    CHECK(report.missing.empty());
    CHECK(report.unexpected.empty());
    for (int g = 0; g < loaded.opt.num_groups(); ++g)
      CHECK(describe(loaded.opt.param_group(g)) == describe(c.groups[std::size_t(g)]));

    Trained live(c, c.groups);
    for (std::int64_t s = 1; s <= kSavedSteps; ++s) live.step(s);
    bool same = true;
    for (const std::string& name : live.opt.state_names())
      for (std::size_t i = 0; i < legacy_layout().size(); ++i)
        same = same && loaded.opt.gather_state(name, i) == live.opt.gather_state(name, i);
    CHECK(same);
    loaded.step(kSavedSteps + 1);
    live.step(kSavedSteps + 1);
    bool params = true;
    for (std::size_t i = 0; i < legacy_layout().size(); ++i)
      params = params && loaded.model.all_bits(i) == live.model.all_bits(i);
    CHECK(params);
  }
}

}  // namespace
}  // namespace shardopt::test::zero
