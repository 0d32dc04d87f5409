// The C API on device buffers (the simulated device): device pointers and
// streams pass through shardopt.h as the C++ API takes them. The collectives
// on device buffers against the same data reduced on the host, and the ZeRO
// optimizer driven through the C API on device parameters (on a stream of
// its own, gradients marked from another) against the C++ API on host
// parameters: bitwise the same parameters.
#include <catch2/catch.hpp>
#include <cstring>
#include <list>
#include <vector>

#include "device/device_runtime.hpp"
#include "mpi_test.hpp"
#include "shardopt/half.hpp"
#include "shardopt/shardopt.h"
#include "shardopt/zero.hpp"
#include "simdevice/sim_device.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

detail::DeviceRuntime& rt() { return sim::runtime(); }

bool ok(shardopt_status_t s) {
  if (s != SHARDOPT_SUCCESS) UNSCOPED_INFO(shardopt_last_error());
  return s == SHARDOPT_SUCCESS;
}

float grad_value(std::size_t j, int step, int rank) {
  return float(int((j * 5 + std::size_t(step) * 3 + std::size_t(rank)) % 11) - 5) * 0.0625f;
}

}  // namespace

TEST_CASE("C API: collectives on device buffers", "[device][capi]") {
  shardopt_comm_t comm = nullptr;
  REQUIRE(all_ranks_true(ok(shardopt_comm_create(MPI_COMM_WORLD, nullptr, &comm))));
  const std::size_t n = 1000;
  const int ranks = world_size();
  std::vector<float> host(n * std::size_t(ranks));
  for (std::size_t j = 0; j < host.size(); ++j) host[j] = grad_value(j, 1, world_rank());
  void* dev = rt().allocate(host.size() * 4, "a buffer");
  rt().copy(dev, host.data(), host.size() * 4, nullptr);
  // Exact sums (small multiples of 1/16): the same in any order.
  std::vector<float> want(host.size(), 0.0f);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t j = 0; j < want.size(); ++j) want[j] += grad_value(j, 1, r);

  bool good = ok(shardopt_allreduce(comm, dev, dev, host.size(), SHARDOPT_F32, SHARDOPT_SUM));
  std::vector<float> got(host.size());
  rt().copy(got.data(), dev, got.size() * 4, nullptr);
  CHECK(all_ranks_true(good && got == want));

  // Non-blocking reduce-scatter, NCCL's in-place form, on a stream of the caller's.
  rt().copy(dev, host.data(), host.size() * 4, nullptr);
  rt().synchronize(nullptr);  // the caller's stream does not wait for the default one
  void* stream = rt().create_stream();
  good = ok(shardopt_comm_set_stream(comm, stream));
  shardopt_request_t request = nullptr;
  float* block = static_cast<float*>(dev) + std::size_t(world_rank()) * n;
  good = good &&
         ok(shardopt_ireduce_scatter(comm, dev, block, n, SHARDOPT_F32, SHARDOPT_SUM, &request));
  good = good && ok(shardopt_wait(&request)) && request == nullptr;
  rt().synchronize(stream);
  rt().copy(got.data(), block, n * 4, nullptr);
  got.resize(n);
  CHECK(all_ranks_true(
      good && std::equal(got.begin(), got.end(), want.begin() + std::ptrdiff_t(world_rank() * n))));
  CHECK(all_ranks_true(ok(shardopt_comm_set_stream(comm, nullptr))));
  rt().destroy_stream(stream);
  rt().release(dev);
  CHECK(all_ranks_true(ok(shardopt_comm_destroy(&comm))));
}

TEST_CASE("C API: the ZeRO optimizer on device parameters equals the C++ API on host ones",
          "[device][capi]") {
  const std::size_t sizes[2] = {37, 300};
  for (int stage : {0, 1, 2}) {
    for (shardopt_dtype_t dt : {SHARDOPT_F32, SHARDOPT_BF16}) {
      INFO("stage " << stage << ", dtype " << dt << ", " << world_size() << " ranks");
      const std::size_t es = dt == SHARDOPT_F32 ? 4 : 2;
      // Host parameters for the C++ API, device copies for the C API.
      std::vector<std::vector<std::byte>> hp, hg;
      std::vector<void*> dp, dg;
      for (std::size_t i = 0; i < 2; ++i) {
        hp.emplace_back(sizes[i] * es);
        hg.emplace_back(sizes[i] * es);
        for (std::size_t j = 0; j < sizes[i]; ++j) {
          const float v = 0.125f * float(j % 9) - 0.5f;
          const bfloat16 h = bf16_from_float(v);
          if (dt == SHARDOPT_F32)
            std::memcpy(hp[i].data() + j * 4, &v, 4);
          else
            std::memcpy(hp[i].data() + j * 2, &h, 2);
        }
        dp.push_back(rt().allocate(hp[i].size(), "a parameter"));
        rt().copy(dp[i], hp[i].data(), hp[i].size(), nullptr);
      }
      // The engine's stream does not wait for the default one: the initial
      // values must be in place before the optimizer reads them.
      rt().synchronize(nullptr);
      const DType t = dt == SHARDOPT_F32 ? DType::f32 : DType::bf16;
      ZeroRedundancyOptimizer cxx(
          world(),
          {Param{.name = "w", .data = hp[0].data(), .numel = sizes[0], .dtype = t},
           Param{.name = "b", .data = hp[1].data(), .numel = sizes[1], .dtype = t}},
          AdamW{.lr = 0.01, .weight_decay = 0.1}, ZeroOptions{.stage = stage});

      shardopt_comm_t comm = nullptr;
      bool good = ok(shardopt_comm_create(MPI_COMM_WORLD, nullptr, &comm));
      void* engine_stream = rt().create_stream();
      void* grad_stream = rt().create_stream();
      shardopt_zero_options_t o;
      good = good && ok(shardopt_zero_options_init(&o));
      o.stage = stage;
      o.stream = engine_stream;
      const shardopt_param_t params[2] = {{"w", dp[0], sizes[0], dt, nullptr, 0, nullptr, 0, 0},
                                          {"b", dp[1], sizes[1], dt, nullptr, 0, nullptr, 0, 0}};
      const char* spec[] = {"adamw lr=0.01 weight_decay=0.1"};
      shardopt_optimizer_t opt = nullptr;
      good = good && ok(shardopt_optimizer_create(comm, params, 2, spec, 1, &o, &opt));
      REQUIRE(all_ranks_true(good));

      std::list<std::vector<std::byte>> staged;
      for (int step = 0; step < 3; ++step) {
        cxx.zero_grad();
        good = good && ok(shardopt_zero_grad(opt));
        for (std::size_t i = 2; i-- > 0;) {
          for (std::size_t j = 0; j < sizes[i]; ++j) {
            const float v = grad_value(j + i * 1000, step, world_rank());
            const bfloat16 h = bf16_from_float(v);
            if (dt == SHARDOPT_F32)
              std::memcpy(hg[i].data() + j * 4, &v, 4);
            else
              std::memcpy(hg[i].data() + j * 2, &h, 2);
          }
          cxx.grad_ready(i, hg[i].data());
          // The gradient written by work on grad_stream, marked from there.
          // Every buffer of it (host and device) outlives the enqueued
          // copies that read it.
          staged.push_back(hg[i]);
          void* d = rt().allocate(hg[i].size(), "a gradient");
          dg.push_back(d);
          rt().copy(d, staged.back().data(), hg[i].size(), grad_stream);
          good = good && ok(shardopt_grad_ready_on(opt, grad_stream, i, d));
        }
        cxx.step();
        shardopt_step_info_t info;
        good = good && ok(shardopt_step(opt, &info));
      }
      rt().synchronize(engine_stream);
      bool same = true;
      for (std::size_t i = 0; i < 2; ++i) {
        std::vector<std::byte> back(hp[i].size());
        rt().copy(back.data(), dp[i], back.size(), nullptr);
        same = same && back == hp[i];
      }
      CHECK(all_ranks_true(good));
      CHECK(all_ranks_true(same));
      int64_t steps = 0;
      CHECK(all_ranks_true(ok(shardopt_steps(opt, &steps, nullptr)) && steps == 3));
      shardopt_memory_report_t m;
      CHECK(all_ranks_true(ok(shardopt_memory_report(opt, &m)) && m.device_bytes > 0));
      CHECK(
          all_ranks_true(ok(shardopt_optimizer_destroy(&opt)) && ok(shardopt_comm_destroy(&comm))));
      rt().destroy_stream(grad_stream);
      rt().destroy_stream(engine_stream);
      for (void* p : dp) rt().release(p);
      for (void* g : dg) rt().release(g);
    }
  }
}
