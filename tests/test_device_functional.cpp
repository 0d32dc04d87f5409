// The functional steps' noop flag on device buffers (the simulated device):
// flag_nonfinite() raises a flag on the device and a list step given it as
// StepOptions::noop_flag applies or writes nothing there, both enqueued
// without the host waiting; the results equal the host step's bitwise; and
// the flag's misuses are clear errors. Local to each rank.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "device/device_runtime.hpp"
#include "mpi_test.hpp"
#include "shardopt/error.hpp"
#include "shardopt/optim.hpp"
#include "simdevice/sim_device.hpp"

using namespace shardopt;
using namespace shardopt::test;
using functional::GradView;
using functional::ParamView;
using functional::StepOptions;

namespace {

detail::DeviceRuntime& rt() { return sim::runtime(); }

// Device copies of host vectors of floats, downloaded back on request.
struct DeviceFloats {
  std::vector<float*> dev;
  explicit DeviceFloats(const std::vector<std::vector<float>>& host) {
    for (const auto& h : host) {
      dev.push_back(static_cast<float*>(rt().allocate(h.size() * 4, "a test buffer")));
      rt().copy(dev.back(), h.data(), h.size() * 4, nullptr);
    }
  }
  ~DeviceFloats() {
    for (float* d : dev) rt().release(d);
  }
  std::vector<std::vector<float>> download(const std::vector<std::vector<float>>& like) const {
    std::vector<std::vector<float>> out;
    for (std::size_t i = 0; i < dev.size(); ++i) {
      out.emplace_back(like[i].size());
      rt().copy(out.back().data(), dev[i], like[i].size() * 4, nullptr);
    }
    return out;
  }
};

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0)
      return false;
  return true;
}

// One Adam list step over params p with gradients g and moments m, v.
functional::StepResult adam_list(std::vector<float*>& p, std::vector<float*>& g,
                                 std::vector<float*>& m, std::vector<float*>& v,
                                 const std::vector<std::size_t>& sizes, const StepOptions& so) {
  std::vector<ParamView> pv;
  std::vector<GradView> gv;
  std::vector<std::span<float>> ms, vs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    pv.emplace_back(p[i], sizes[i]);
    gv.emplace_back(g[i], sizes[i], DType::f32);
    ms.emplace_back(m[i], sizes[i]);
    vs.emplace_back(v[i], sizes[i]);
  }
  const std::vector<std::span<const std::span<float>>> states = {ms, vs, {}};
  return functional::step(std::span<const ParamView>(pv), std::span<const GradView>(gv),
                          std::span<const std::span<const std::span<float>>>(states), 3,
                          Adam{.lr = 0.01, .weight_decay = 0.1}, so);
}

std::vector<float*> pointers(std::vector<std::vector<float>>& v) {
  std::vector<float*> out;
  for (auto& x : v) out.push_back(x.data());
  return out;
}

}  // namespace

TEST_CASE("functional steps on device buffers: a noop flag decides on the device",
          "[device][optim]") {
  const std::vector<std::size_t> sizes = {5, 1000, 70001};
  std::mt19937 rng(static_cast<unsigned>(test_seed()) + 7u * static_cast<unsigned>(world_rank()));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> p, g, m, v;
  for (std::size_t n : sizes) {
    p.emplace_back(n);
    g.emplace_back(n);
    m.emplace_back(n);
    v.emplace_back(n);
    for (std::size_t j = 0; j < n; ++j) {
      p.back()[j] = normal(rng);
      g.back()[j] = normal(rng);
      m.back()[j] = 0.1f * normal(rng);
      v.back()[j] = std::fabs(0.1f * normal(rng));
    }
  }
  DeviceFloats dp(p), dg(g), dm(m), dv(v);
  auto* flag = static_cast<std::uint32_t*>(rt().allocate(4, "the flag"));
  rt().zero(flag, 4, nullptr);
  const double mul = 0.5;

  // The reference: the same step on the host buffers.
  auto hp = p, hm = m, hv = v;
  {
    auto pp = pointers(hp), pg = pointers(g), pm = pointers(hm), pw = pointers(hv);
    adam_list(pp, pg, pm, pw, sizes, {.grad_mul = mul});
  }

  // Held stream: the checks and the step must return before it runs.
  std::uint32_t* hold = rt().allocate_flags(1);
  rt().wait_flag(nullptr, hold, 1);
  std::atomic<bool> returned{false};
  bool waited = false;
  std::thread watchdog([&] {
    for (int k = 0; k < 2000 && !returned; ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!returned) waited = true;
    rt().set_flag(hold, 1);
  });
  for (std::size_t i = 0; i < sizes.size(); ++i)
    functional::flag_nonfinite(GradView(dg.dev[i], sizes[i], DType::f32), flag, mul);
  functional::StepResult r =
      adam_list(dp.dev, dg.dev, dm.dev, dv.dev, sizes, {.grad_mul = mul, .noop_flag = flag});
  returned = true;
  watchdog.join();
  CHECK(!waited);
  CHECK((r.applied && r.grads_finite));
  CHECK(same_bits(dp.download(p), hp));
  CHECK(same_bits(dm.download(m), hm));
  CHECK(same_bits(dv.download(v), hv));

  // A nan in tensor 1: the flag goes up, and the step writes nothing.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  rt().copy(dg.dev[1] + 17, &nan, 4, nullptr);
  rt().zero(flag, 4, nullptr);
  for (std::size_t i = 0; i < sizes.size(); ++i)
    functional::flag_nonfinite(GradView(dg.dev[i], sizes[i], DType::f32), flag, mul);
  adam_list(dp.dev, dg.dev, dm.dev, dv.dev, sizes, {.grad_mul = mul, .noop_flag = flag});
  std::uint32_t raised = 0;
  rt().copy(&raised, flag, 4, nullptr);
  CHECK(raised == 1);
  CHECK(same_bits(dp.download(p), hp));
  CHECK(same_bits(dm.download(m), hm));
  CHECK(same_bits(dv.download(v), hv));

  // On the host the check is done at the call, into a host flag.
  std::uint32_t host_flag = 0;
  functional::flag_nonfinite(GradView(g[1].data(), sizes[1], DType::f32), &host_flag, mul);
  CHECK(host_flag == 0);
  g[1][17] = nan;
  functional::flag_nonfinite(GradView(g[1].data(), sizes[1], DType::f32), &host_flag, mul);
  CHECK(host_flag == 1);

  // Misuses, each naming its fix.
  auto pp = pointers(hp), pg = pointers(g), pm = pointers(hm), pw = pointers(hv);
  CHECK(throws_error<InvalidArgument>(
      [&] { adam_list(pp, pg, pm, pw, sizes, {.noop_flag = &host_flag}); },
      ErrorCode::invalid_argument, "StepOptions::noop_flag is for device buffers"));
  CHECK(throws_error<DeviceError>(
      [&] { adam_list(dp.dev, dg.dev, dm.dev, dv.dev, sizes, {.noop_flag = &host_flag}); },
      ErrorCode::wrong_device, "noop_flag"));
  CHECK(throws_error<InvalidArgument>(
      [&] {
        adam_list(dp.dev, dg.dev, dm.dev, dv.dev, sizes,
                  {.skip_nonfinite = true, .noop_flag = flag});
      },
      ErrorCode::invalid_argument, "StepOptions::noop_flag with skip_nonfinite"));
  std::vector<float> upd(sizes[0]);
  CHECK(throws_error<UnsupportedError>(
      [&] {
        functional::lamb(ParamView(dp.dev[0], sizes[0]), GradView(dg.dev[0], sizes[0], DType::f32),
                         {dm.dev[0], sizes[0]}, {dv.dev[0], sizes[0]}, {dv.dev[0], sizes[0]}, 1,
                         Lamb{}, {.noop_flag = flag});
      },
      ErrorCode::unsupported, "noop_flag is not supported"));
  CHECK(throws_error<InvalidArgument>(
      [&] { functional::flag_nonfinite(GradView(dg.dev[0], sizes[0], DType::f32), nullptr); },
      ErrorCode::invalid_argument, "the flag is null"));
  CHECK(throws_error<DeviceError>(
      [&] { functional::flag_nonfinite(GradView(dg.dev[0], sizes[0], DType::f32), &host_flag); },
      ErrorCode::wrong_device, "flag"));
  // The device buffers are unchanged by the refused calls.
  CHECK(same_bits(dp.download(p), hp));
  rt().release_flags(hold);
  rt().release(flag);
}
