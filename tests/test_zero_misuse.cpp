// Misuse of a constructed ZeRO engine, and memory it must accept: parameters
// and gradients in any host memory, gradients never marked ready or marked
// after the reduction, bad indices and names, the step calls out of order,
// and stream_grads outside stage 2. Each error is thrown on every rank and
// the optimizer recovers. Bad input at construction: test_zero_errors.cpp.
#include <mpi.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device/device.hpp"
#include "mpi_test.hpp"
#include "shardopt/zero.hpp"
#include "zero_helpers.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

// The host side of the wrong-device check (the device side is in the gpu
// suite, tests/gpu/test_gpu_memory.cu): every kind of host memory a program
// hands over is located as host memory and accepted, and the step is right.
TEST_CASE("ZeRO: parameters and gradients in any host memory are accepted",
          "[zero][errors][device][host-memory]") {
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
    // Appended: GCC 12 warns falsely (-Wrestrict) on "p" + std::to_string(i)
    // here.
    std::string name = "p";
    name += std::to_string(i);
    params.push_back(Param{.name = std::move(name),
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
        fill_grad(model.grad_host(i), DType::f32, layout.sizes[i], GradKind::exact, 9, 0,
                  world_rank(), i, false);
        Model::upload(model.grad_data(i), model.grad_host(i), layout.sizes[i] * 4);
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
      fill_grad(model.grad_host(i), DType::f32, layout.sizes[i], GradKind::exact, 11, 0,
                world_rank(), i, false);
      Model::upload(model.grad_data(i), model.grad_host(i), layout.sizes[i] * 4);
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
  void* grad = scratch.data();
#if SHARDOPT_TEST_DEVICE
  // A device run passes its gradients from a device copy.
  grad = sim::runtime().allocate(scratch.size() * 4, "the scratch gradient");
  Model::upload(grad, scratch.data(), scratch.size() * 4);
  struct Release {
    void* p;
    ~Release() { sim::runtime().release(p); }
  } release_grad{grad};
#endif
  opt->zero_grad();
  StepInfo info;
  const bool stepped = no_throw([&] {
    for (std::size_t i : {1u, 0u}) opt->grad_ready(i, grad);
    info = opt->step();
  });
  CHECK(all_ranks_true(stepped && info.applied && info.step == 1));
}
