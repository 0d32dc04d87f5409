// gpu suite: the CUDA Adam kernel equals the reference kernel bitwise, for
// every gradient type, output copy, weight-decay mode and amsgrad, with the
// buffers aligned (the vector path), all one element in (the vector path
// from element 3) and the gradients alone one element in (the scalar path),
// and through the functional API on device buffers. Skips (exit 77) without
// a device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/device.hpp"
#include "kernels/adam.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;

namespace {

int g_failed = 0;
int g_passed = 0;

void check(bool ok, const char* what) {
  (ok ? g_passed : g_failed)++;
  if (!ok) std::printf("FAILED: %s\n", what);
}

std::vector<void*> g_allocations;

// A device copy of h, `shift` elements into its allocation (freed by free_all).
template <class T>
T* to_device(const std::vector<T>& h, std::size_t shift = 0) {
  T* d = nullptr;
  cudaMalloc(&d, (h.size() + 4) * sizeof(T));
  g_allocations.push_back(d);
  cudaMemcpy(d + shift, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d + shift;
}

void free_all() {
  for (void* d : g_allocations) cudaFree(d);
  g_allocations.clear();
}

template <class T>
std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

bool same_bits(const void* a, const void* b, std::size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

}  // namespace

int main() {
  if (detail::cuda_device_count() == 0) {
    std::printf(
        "SKIP: no CUDA device visible to this process; the gpu suite runs on a machine "
        "with a GPU (scripts/device-check)\n");
    return 77;
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537},
                        (std::size_t{1} << 22) + 5}) {
    std::vector<float> p(n), m(n), v(n), vmax(n), g(n);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = u(rng);
      m[i] = 0.1f * u(rng);
      v[i] = 0.01f * std::fabs(u(rng));
      vmax[i] = 1.5f * v[i];
      g[i] = u(rng);
    }
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      std::vector<std::uint16_t> g16(n);
      for (std::size_t i = 0; i < n; ++i)
        g16[i] = gt == DType::bf16 ? bf16_from_float(g[i]).bits : f16_from_float(g[i]).bits;
      const void* host_grad = gt == DType::f32 ? static_cast<const void*>(g.data()) : g16.data();
      for (int mode = 0; mode < 3; ++mode) {
        for (bool ams : {false, true}) {
          for (int cfg = 0; cfg < 9; ++cfg) {
            const int out = cfg % 3;
            // Layout 0: every buffer aligned; 1: every buffer one element in;
            // 2: the gradients alone one element in.
            const int layout = cfg / 3;
            const std::size_t shift = layout == 1 ? 1 : 0, grad_shift = layout == 0 ? 0 : 1;
            const DType ot = out == 2 ? DType::f16 : DType::bf16;
            // Reference on host copies.
            std::vector<float> rp = p, rm = m, rv = v, rvmax = vmax;
            std::vector<std::uint16_t> rout(n, 0);
            kernels::AdamBuffers hb;
            hb.param = rp.data();
            hb.grad = host_grad;
            hb.grad_type = gt;
            hb.exp_avg = rm.data();
            hb.exp_avg_sq = rv.data();
            hb.max_exp_avg_sq = ams ? rvmax.data() : nullptr;
            hb.param_out = out ? rout.data() : nullptr;
            hb.param_out_type = ot;
            hb.n = n;
            const auto s = kernels::make_adam_scalars(0.01, 0.9, 0.999, 1e-8, mode ? 0.1 : 0.0,
                                                      mode == 2, ams, out == 1, 4, 0.5);
            kernels::reference::step<Adam>(hb, s);
            // The same step on the device.
            float *dp = to_device(p, shift), *dm = to_device(m, shift), *dv = to_device(v, shift),
                  *dvmax = to_device(vmax, shift);
            void* dg = gt == DType::f32 ? static_cast<void*>(to_device(g, grad_shift))
                                        : to_device(g16, grad_shift);
            std::uint16_t* dout = to_device(std::vector<std::uint16_t>(n, 0), shift);
            kernels::AdamBuffers db = hb;
            db.param = dp;
            db.grad = dg;
            db.exp_avg = dm;
            db.exp_avg_sq = dv;
            db.max_exp_avg_sq = ams ? dvmax : nullptr;
            db.param_out = out ? dout : nullptr;
            kernels::cuda::step<Adam>(db, s, nullptr);
            check(same_bits(to_host(dp, n).data(), rp.data(), n * 4), "params equal bitwise");
            check(same_bits(to_host(dm, n).data(), rm.data(), n * 4), "exp_avg equal bitwise");
            check(same_bits(to_host(dv, n).data(), rv.data(), n * 4), "exp_avg_sq equal bitwise");
            if (ams) check(same_bits(to_host(dvmax, n).data(), rvmax.data(), n * 4), "max equal");
            if (out) check(to_host(dout, n) == rout, "low-precision copy equal bitwise");
            free_all();
          }
        }
      }
    }
  }
  // Through the functional API: device buffers run on the device.
  const std::size_t n = 4097;
  std::vector<float> p(n, 0.5f), g(n, 0.25f), zeros(n, 0.0f);
  float *dp = to_device(p), *dg = to_device(g), *dm = to_device(zeros), *dv = to_device(zeros);
  const auto r = functional::adam({dp, n}, functional::GradView(dg, n, DType::f32), {dm, n},
                                  {dv, n}, {}, 1, Adam{.lr = 0.1});
  std::vector<float> hp = p, hm = zeros, hv = zeros;
  functional::adam(hp, g, hm, hv, {}, 1, Adam{.lr = 0.1});
  check(r.grads_finite, "functional adam on device reports finite grads");
  check(to_host(dp, n) == hp, "functional adam on device equals the host step");
  free_all();
  std::printf("gpu adam: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
