// gpu suite: the CUDA cast and finiteness kernels equal the reference kernels
// bitwise, for every type pair, size and alignment (in place too), and the
// public API runs device buffers on the device: shardopt::cast,
// functional::grads_finite and a step with StepOptions::skip_nonfinite.
// Skips (exit 77) without a device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "kernels/cast.hpp"
#include "kernels/finite.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;

using gpu_test::check;
using gpu_test::uniform;

namespace {

// Raw bytes on the host and a device copy.
using Pair = gpu_test::Mirror<unsigned char>;

// n elements of `t` (plus `shift` spare ones in front): every 16-bit pattern
// in turn for bf16 and f16, random bit patterns (NaNs, infs and subnormals
// among them) and special values for f32.
std::vector<unsigned char> inputs(DType t, std::size_t n, std::size_t shift, std::mt19937& rng) {
  const std::size_t size = dtype_size(t);
  std::vector<unsigned char> v((n + shift) * size);
  std::uniform_int_distribution<std::uint32_t> any;
  const std::uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x7f7f8000u,
                                   0x7f7fffffu, 0x477ff000u, 0x33000000u, 0x7f800000u,
                                   0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffa00000u};
  for (std::size_t i = 0; i < n + shift; ++i) {
    if (size == 2) {
      const std::uint16_t b = static_cast<std::uint16_t>(i * 40503u);
      std::memcpy(v.data() + i * 2, &b, 2);
    } else {
      const std::uint32_t b = i < 12 ? special[i] : any(rng);
      std::memcpy(v.data() + i * 4, &b, 4);
    }
  }
  return v;
}

bool rejects_with(void (*f)(unsigned char*, float*), unsigned char* dev, float* host,
                  ErrorCode code) {
  try {
    f(dev, host);
  } catch (const Error& e) {
    return e.code() == code && !e.hint().empty();
  }
  return false;
}

}  // namespace

int main() {
  if (gpu_test::no_device()) return gpu_test::kSkip;
  std::mt19937 rng(31);
  const DType types[] = {DType::f32, DType::bf16, DType::f16};

  // The kernels against the reference.
  for (DType from : types) {
    for (DType to : types) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000},
                            std::size_t{65537}, (std::size_t{1} << 22) + 5}) {
        for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {
          const std::string where = std::string(dtype_name(from)) + " -> " + dtype_name(to) +
                                    " n " + std::to_string(n) + " shift " + std::to_string(shift);
          Pair src(inputs(from, n, shift, rng));
          Pair dst(std::vector<unsigned char>((n + shift) * dtype_size(to), 0x5a));
          const std::size_t si = shift * dtype_size(from), di = shift * dtype_size(to);
          kernels::reference::cast(src.host.data() + si, from, dst.host.data() + di, to, n);
          kernels::cuda::cast(src.dev + si, from, dst.dev + di, to, n, nullptr);
          check(dst.same(), "cast " + where);
          if (dtype_size(from) == dtype_size(to)) {  // in place, on the source
            kernels::cuda::cast(src.dev + si, from, src.dev + si, to, n, nullptr);
            std::vector<unsigned char> got = src.device_copy();
            check(std::memcmp(got.data() + si, dst.host.data() + di, n * dtype_size(to)) == 0,
                  "cast in place " + where);
          }
        }
      }
    }
  }
  for (DType t : types) {
    for (std::size_t n :
         {std::size_t{1}, std::size_t{1000}, std::size_t{65537}, (std::size_t{1} << 22) + 5}) {
      const std::vector<float> g = uniform(n, rng, -1, 1);
      std::vector<unsigned char> bytes(n * dtype_size(t));
      kernels::reference::cast(g.data(), DType::f32, bytes.data(), t, n);
      for (std::size_t at : {std::size_t{0}, n / 2, n - 1, n}) {  // n: all finite
        std::vector<unsigned char> b = bytes;
        if (at < n) {
          const float bad = at == n / 2 ? INFINITY : NAN;
          kernels::reference::cast(&bad, DType::f32, b.data() + at * dtype_size(t), t, 1);
        }
        Pair p(b);
        for (float mul : {1.0f, 1e38f}) {
          const bool want = kernels::reference::all_finite(p.host.data(), t, n, mul);
          const bool got = kernels::cuda::all_finite(p.dev, t, n, mul, nullptr);
          check(want == got && (mul != 1.0f || want == (at == n)),
                std::string("finite ") + dtype_name(t) + " n " + std::to_string(n) + " at " +
                    std::to_string(at) + " mul " + std::to_string(mul));
        }
      }
    }
  }

  // The public API on device buffers.
  const std::size_t n = 70001;
  const std::vector<float> x = uniform(n, rng, -70000, 70000);
  {
    std::vector<unsigned char> xb(n * 4);
    std::memcpy(xb.data(), x.data(), xb.size());
    Pair src(xb), dst(std::vector<unsigned char>(n * 2, 0));
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cast(src.dev, DType::f32, dst.dev, DType::f16, n, stream);
    cast(src.host.data(), DType::f32, dst.host.data(), DType::f16, n);
    check(dst.same(), "shardopt::cast on device, on a stream");
    CUDA_CHECK(cudaStreamDestroy(stream));
    check(rejects_with(
              [](unsigned char* dev, float* host) { cast(host, DType::f32, dev, DType::bf16, 16); },
              dst.dev, std::vector<float>(16).data(), ErrorCode::wrong_device),
          "shardopt::cast host -> device is a DeviceError");
    check(functional::grads_finite(functional::GradView(src.dev, n, DType::f32)),
          "grads_finite on device (finite)");
    const float bad = NAN;
    CUDA_CHECK(cudaMemcpy(src.dev + 4 * (n - 1), &bad, 4, cudaMemcpyHostToDevice));
    check(!functional::grads_finite(functional::GradView(src.dev, n, DType::f32)),
          "grads_finite on device (nan last)");
  }
  {  // Adam with skip_nonfinite on device buffers: skipped with a nan, else the host step.
    std::vector<float> g = uniform(n, rng, -1, 1);
    std::vector<unsigned char> gb(n * 4), pb(n * 4), zero(n * 4, 0);
    const std::vector<float> p0 = uniform(n, rng, -1, 1);
    std::memcpy(pb.data(), p0.data(), pb.size());
    g[n / 2] = NAN;
    std::memcpy(gb.data(), g.data(), gb.size());
    Pair dg(gb), dp(pb), dm(zero), dv(zero);
    functional::StepOptions o;
    o.skip_nonfinite = true;
    const auto f = [&](Pair& q) { return std::span<float>(reinterpret_cast<float*>(q.dev), n); };
    const auto r = functional::adam(f(dp), functional::GradView(dg.dev, n, DType::f32), f(dm),
                                    f(dv), {}, 1, Adam{}, o);
    check(!r.applied && !r.grads_finite && dp.same() && dm.same() && dv.same(),
          "adam skip_nonfinite on device: nothing written");
    g[n / 2] = 0.5f;
    std::memcpy(dg.host.data(), g.data(), gb.size());
    dg.upload();
    const auto r2 = functional::adam(f(dp), functional::GradView(dg.dev, n, DType::f32), f(dm),
                                     f(dv), {}, 1, Adam{}, o);
    std::vector<float> hp = p0, hm(n, 0.0f), hv(n, 0.0f);
    functional::adam(hp, g, hm, hv, {}, 1, Adam{});
    std::memcpy(dp.host.data(), hp.data(), pb.size());
    std::memcpy(dm.host.data(), hm.data(), pb.size());
    std::memcpy(dv.host.data(), hv.data(), pb.size());
    check(r2.applied && r2.grads_finite && dp.same() && dm.same() && dv.same(),
          "adam skip_nonfinite on device with finite grads: the host step");
  }
  return gpu_test::finish("gpu cast and finiteness");
}
