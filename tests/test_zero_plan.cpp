// plan_memory() (shardopt/zero.hpp, what shardopt-plan prints) against the
// engine itself: for every stage and precision, owned, registered and
// streamed gradients in one flat buffer or one per parameter, several
// optimizers and awkward layouts, the MemoryReport planned for this rank
// equals memory_report() of an optimizer built on this communicator, field
// by field. Also run on the simulated device (test_zero_device).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/zero.hpp"
#include "zero_helpers.hpp"
#include "zero_reference.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

namespace {

// "field planned / reported" for each field that differs; "" when equal.
std::string differences(const MemoryReport& plan, const MemoryReport& got) {
  std::string out;
  const auto field = [&](const char* name, std::size_t p, std::size_t g) {
    if (p != g) out += std::string(" ") + name + " " + std::to_string(p) + "/" + std::to_string(g);
  };
  field("master_params", plan.master_params, got.master_params);
  field("optimizer_state", plan.optimizer_state, got.optimizer_state);
  field("grad_shard", plan.grad_shard, got.grad_shard);
  field("reduced_grads", plan.reduced_grads, got.reduced_grads);
  field("owned_grads", plan.owned_grads, got.owned_grads);
  field("buckets", plan.buckets, got.buckets);
  field("user_params", plan.user_params, got.user_params);
  field("user_grads", plan.user_grads, got.user_grads);
  field("device_bytes", plan.device_bytes, got.device_bytes);
  field("host_bytes", plan.host_bytes, got.host_bytes);
  field("node_shared", plan.node_shared, got.node_shared);
  field("param_shard", plan.param_shard, got.param_shard);
  field("gather_pool", plan.gather_pool, got.gather_pool);
  field("persistent_params", plan.persistent_params, got.persistent_params);
  return out;
}

// The optimizers, taken in turn across the cases: their state slots
// (none, one, two, three, LAMB's direction) are what the plan must count.
OptimizerConfig optimizer_of(std::size_t k) {
  switch (k % 8) {
    case 0:
      return Adam{};
    case 1:
      return AdamW{.amsgrad = true};
    case 2:
      return SGD{};  // no momentum: no state
    case 3:
      return SGD{.momentum = 0.9};
    case 4:
      return Lamb{};
    case 5:
      return Adagrad{};
    case 6:
      return RMSprop{.momentum = 0.5, .centered = true};
    default:
      return Lion{};
  }
}

enum class GradForm { user, owned, streamed };

}  // namespace

TEST_CASE("plan_memory equals memory_report for every stage, precision and gradient form",
          "[zero][memory][plan]") {
  struct Case {
    std::vector<std::size_t> sizes;
    double bucket_mb;
  };
  // Buckets of one alignment unit (many buckets, parameters cut across
  // them), a mid-sized bucket, the default.
  const std::vector<Case> cases = {{{1000, 333, 7, 2000, 1, 0}, 1e-4},
                                   {{0, 5, 70001, 3, 17, 17, 4096}, 0.05},
                                   {{100003}, 0.0},
                                   {std::vector<std::size_t>(40, 97), 0.002}};
  const Precision precisions[] = {Precision::f32, Precision::bf16, Precision::f16,
                                  Precision::bf16_rem};
  std::size_t k = 0, checked = 0;
  for (std::size_t c = 0; c < cases.size(); ++c)
    for (Precision p : precisions)
      for (bool fp32_reduce : {false, true})
        for (int stage = 0; stage <= 3; ++stage)
          for (GradForm grads : {GradForm::user, GradForm::owned, GradForm::streamed})
            for (bool contiguous : {true, false}) {
              if (fp32_reduce && p == Precision::f32) continue;
              if (grads == GradForm::streamed && stage < 2) continue;
              const OptimizerConfig optimizer = optimizer_of(k++);
              ZeroOptions options;
              options.stage = stage;
              options.bucket_mb = cases[c].bucket_mb;
              options.reduce_in_fp32 = fp32_reduce;
              options.param_remainders = p == Precision::bf16_rem;
              options.stream_grads = grads == GradForm::streamed;
              // Predivision makes every bucket pack its gradients.
              options.predivide_factor = k % 5 == 0 ? 2.0 : 1.0;
              // Stage 3: a given gather limit, and units below 4 KiB whole.
              if (k % 3 == 0) options.gather_limit_bytes = 1 << 20;
              options.persist_below_bytes = k % 2 == 0 ? 4096 : 0;
              const DType t = param_dtype(p);
              Model model(make_layout(cases[c].sizes), t, contiguous, grads != GradForm::user, 17);
              MemoryPlan plan;
              plan.numel = cases[c].sizes;
              plan.dtype = t;
              plan.groups = {optimizer};
              plan.options = options;
              plan.ranks = world_size();
              plan.rank = world_rank();
              plan.nodes = world().nodes().nodes;  // several: no fused step
              plan.device = Model::on_device;
              plan.user_grads = grads == GradForm::user;
              plan.contiguous = contiguous;
              std::string failure;
              const bool ran = no_throw([&] {
                ZeroRedundancyOptimizer opt(world(), model.params(), optimizer, options);
                failure = differences(plan_memory(plan), opt.memory_report());
              });
              INFO("case " << c << ", " << precision_name(p)
                           << (fp32_reduce ? ", reduce_in_fp32" : "") << ", stage " << stage
                           << ", gradients "
                           << (grads == GradForm::user    ? "user"
                               : grads == GradForm::owned ? "owned"
                                                          : "streamed")
                           << (contiguous ? ", one flat buffer" : ", one buffer each")
                           << ", optimizer " << optimizer.index() << ", predivide "
                           << options.predivide_factor);
              if (!failure.empty())
                UNSCOPED_INFO("rank " << world_rank() << ": planned/reported:" << failure);
              CHECK(all_ranks_true(ran && failure.empty()));
              ++checked;
            }
  CHECK(checked > 300);
}

TEST_CASE("plan_memory: several groups allocate the state slots any of them uses",
          "[zero][memory][plan]") {
  const Layout layout = make_layout({300, 41, 1000, 5}, {0, 1, 1, 0});
  Model model(layout, DType::bf16, false, true, 5);
  const std::vector<OptimizerConfig> groups = {Adam{}, Adam{.amsgrad = true}};
  for (int stage = 0; stage <= 2; ++stage) {
    ZeroOptions options;
    options.stage = stage;
    options.bucket_mb = 0.001;
    MemoryPlan plan;
    plan.numel = layout.sizes;
    plan.dtype = DType::bf16;
    plan.groups = groups;
    plan.options = options;
    plan.ranks = world_size();
    plan.rank = world_rank();
    plan.nodes = world().nodes().nodes;
    plan.device = Model::on_device;
    plan.contiguous = false;
    std::string failure;
    const bool ran = no_throw([&] {
      ZeroRedundancyOptimizer opt(world(), model.params(), groups, options);
      failure = differences(plan_memory(plan), opt.memory_report());
    });
    INFO("stage " << stage);
    if (!failure.empty()) UNSCOPED_INFO("rank " << world_rank() << ":" << failure);
    CHECK(all_ranks_true(ran && failure.empty()));
  }
}

// The buffers a run allocates as it goes (bucket buffers that streamed
// gradients fill) are planned too: after steps whose gradients are marked
// ready in backward order, as a backward pass makes them, the report still
// equals the plan, with parameters that span one, two, three and eight
// buckets.
TEST_CASE("plan_memory equals memory_report after steps, whatever the buckets a tensor spans",
          "[zero][memory][plan]") {
  const Precision precisions[] = {Precision::f32, Precision::bf16};
  for (Precision p : precisions) {
    const DType t = param_dtype(p);
    ZeroOptions options;
    options.bucket_mb = 0.01;
    MemoryPlan probe;
    probe.numel = {std::size_t(1) << 20};
    probe.dtype = t;
    probe.options = options;
    probe.ranks = world_size();
    const std::size_t B = plan_layout(probe).buckets[0];  // elements of a full bucket
    // Spans, in flat order: 1 (7), 8 (8B - 7, up to the ninth bucket), 1
    // (B / 3), 2 (B - 20 across a boundary), 3 (2B + 1 across two), 1, 8.
    const std::vector<std::size_t> sizes = {7,         8 * B - 7,  B / 3,      B - 20,
                                            2 * B + 1, B / 2 - 40, 8 * B - 100};
    std::vector<std::size_t> spans;
    std::size_t flat = 0;
    for (std::size_t n : sizes) {
      spans.push_back((flat + n - 1) / B - flat / B + 1);
      flat += n;
    }
    INFO("bucket " << B << " elements, spans " << spans[0] << " " << spans[1] << " " << spans[2]
                   << " " << spans[3] << " " << spans[4] << " " << spans[5] << " " << spans[6]);
    for (std::size_t k : {1, 2, 3, 8})
      REQUIRE(std::find(spans.begin(), spans.end(), k) != spans.end());
    const Layout layout = make_layout(sizes);
    std::vector<std::byte> host(layout.largest() * dtype_size(t));
    void* scratch = host.data();
#if SHARDOPT_TEST_DEVICE
    struct Release {
      void* p;
      ~Release() { sim::runtime().release(p); }
    } device_scratch{sim::runtime().allocate(host.size(), "a test gradient")};
    scratch = device_scratch.p;
#endif
    // Units (ending buckets at every stage; stage 3's gathers): the small
    // ones stay whole at stage 3 (persist_below_bytes).
    const std::vector<int> units = {0, 0, 1, -1, 2, 2, 3};
    for (int stage = 0; stage <= 3; ++stage)
      for (GradForm grads : {GradForm::user, GradForm::owned, GradForm::streamed})
        for (bool contiguous : {true, false}) {
          if (grads == GradForm::streamed && stage < 2) continue;
          options.stage = stage;
          options.stream_grads = grads == GradForm::streamed;
          Model model(layout, t, contiguous, grads != GradForm::user, 23);
          std::vector<Param> params = model.params();
          for (std::size_t i = 0; i < params.size(); ++i) params[i].unit = units[i];
          MemoryPlan plan = probe;
          plan.numel = sizes;
          plan.units = units;
          plan.groups = {Adam{}};
          plan.options = options;
          plan.rank = world_rank();
          plan.nodes = world().nodes().nodes;
          plan.device = Model::on_device;
          plan.user_grads = grads == GradForm::user;
          plan.contiguous = contiguous;
          std::string failure;
          const bool ran = no_throw([&] {
            ZeroRedundancyOptimizer opt(world(), params, Adam{}, options);
            for (int step = 0; step < 3; ++step) {
              opt.zero_grad();
              for (std::size_t u = 0; stage == 3 && u < opt.num_units(); ++u) {
                opt.gather(u);
                opt.release(u);
              }
              for (std::size_t i = sizes.size(); i-- > 0;) {
                void* g = grads == GradForm::streamed ? host.data()
                          : grads == GradForm::owned  ? opt.grad(i)
                                                      : model.grad_host(i);
                if (Model::on_device && grads == GradForm::owned) g = host.data();
                fill_grad(g, t, sizes[i], GradKind::random, 3, step, world_rank(), i, false);
                if (grads == GradForm::streamed) {
                  Model::upload(scratch, host.data(), sizes[i] * dtype_size(t));
                  opt.grad_ready(i, scratch);
                } else {
                  if (Model::on_device)
                    Model::upload(grads == GradForm::owned ? opt.grad(i) : model.grad_data(i), g,
                                  sizes[i] * dtype_size(t));
                  opt.grad_ready(i);
                }
              }
              opt.step();
            }
            failure = differences(plan_memory(plan), opt.memory_report());
          });
          INFO(precision_name(p) << ", stage " << stage << ", gradients "
                                 << (grads == GradForm::user    ? "user"
                                     : grads == GradForm::owned ? "owned"
                                                                : "streamed")
                                 << (contiguous ? ", one flat buffer" : ", one buffer each")
                                 << ", bucket " << B << " elements");
          if (!failure.empty())
            UNSCOPED_INFO("rank " << world_rank() << ": planned/reported:" << failure);
          CHECK(all_ranks_true(ran && failure.empty()));
        }
  }
}

#if !SHARDOPT_TEST_DEVICE
TEST_CASE("plan_memory: a custom optimizer's scratch is its longest segment",
          "[zero][memory][plan]") {
  const Layout layout = make_layout({3000, 7, 129});
  Model model(layout, DType::f32, true, false, 9);
  CustomOptimizer custom;
  custom.state_names = {"a", "b", "c"};
  custom.update = [](const CustomStep&, double) {};
  for (int stage = 0; stage <= 2; ++stage) {
    ZeroOptions options;
    options.stage = stage;
    options.bucket_mb = 0.004;
    MemoryPlan plan;
    plan.numel = layout.sizes;
    plan.groups = {custom};
    plan.options = options;
    plan.ranks = world_size();
    plan.rank = world_rank();
    plan.nodes = world().nodes().nodes;
    plan.user_grads = true;
    std::string failure;
    const bool ran = no_throw([&] {
      ZeroRedundancyOptimizer opt(world(), model.params(), custom, options);
      failure = differences(plan_memory(plan), opt.memory_report());
    });
    INFO("stage " << stage);
    if (!failure.empty()) UNSCOPED_INFO("rank " << world_rank() << ":" << failure);
    CHECK(all_ranks_true(ran && failure.empty()));
  }
}
#endif

TEST_CASE("plan_memory: impossible inputs are errors that name the field", "[zero][memory][plan]") {
  MemoryPlan good;
  good.numel = {100, 200};
  good.ranks = 4;
  CHECK(plan_memory(good).optimizer_state > 0);
  const auto bad = [&](auto edit, const char* needle) {
    MemoryPlan p = good;
    edit(p);
    return throws_error([&] { plan_memory(p); }, ErrorCode::invalid_argument, needle);
  };
  CHECK(bad([](MemoryPlan& p) { p.ranks = 0; }, "ranks is 0"));
  CHECK(bad([](MemoryPlan& p) { p.rank = 4; }, "rank is 4 of 4 ranks"));
  CHECK(bad([](MemoryPlan& p) { p.nodes = 3; }, "nodes is 3 for 4 ranks"));
  CHECK(bad([](MemoryPlan& p) { p.options.stage = 4; }, "options.stage is 4"));
  CHECK(bad([](MemoryPlan& p) { p.units = {0}; }, "units has 1 entries for 2 parameters"));
  CHECK(bad([](MemoryPlan& p) { p.options.bucket_mb = -1; }, "options.bucket_mb is -1"));
  CHECK(bad([](MemoryPlan& p) { p.groups.clear(); }, "no parameter group"));
  CHECK(bad([](MemoryPlan& p) { p.options.stream_grads = true; }, "stream_grads needs stage 2"));
  CHECK(bad(
      [](MemoryPlan& p) {
        p.options.stage = 3;
        p.options.persist_below_bytes = 0;
        p.options.gather_limit_bytes = 100;
      },
      "gather_limit_bytes is 100"));
  CHECK(bad([](MemoryPlan& p) { p.options.param_remainders = true; }, "needs bf16"));
  CHECK(bad([](MemoryPlan& p) { p.dtype = DType::f64; }, "dtype is f64"));
  CHECK(bad([](MemoryPlan& p) { p.groups = {Adam{}, SGD{}}; }, "different kinds"));
  CHECK(bad([](MemoryPlan& p) { p.options.predivide_factor = 0; }, "predivide_factor is 0"));
  CHECK(bad(
      [](MemoryPlan& p) {
        p.options.stage = 2;
        p.options.stream_grads = true;
        p.user_grads = true;
      },
      "stream_grads with user_grads"));
  CHECK(bad([](MemoryPlan& p) { p.threads = -1; }, "threads is -1"));
  CHECK(bad(
      [](MemoryPlan& p) {
        p.device = true;
        p.groups = {CustomOptimizer{}};
      },
      "runs on the host"));
}
