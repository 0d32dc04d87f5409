// gpu suite: what every test of the suite shares. Checks that count and
// report; the visible skip where no CUDA device is present; CUDA_CHECK,
// through which every CUDA runtime call of the suite goes (a failed call
// ends the test as failed, with the error and the file:line of the call);
// host buffers with a device copy, compared bitwise or value by value; and
// random inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shardopt/half.hpp"
#include "shardopt/optim.hpp"
#include "shardopt/types.hpp"

namespace gpu_test {

// The exit status of a test that has nothing to run here, which Meson
// reports as SKIP.
constexpr int kSkip = 77;

// ---------------------------------------------------------------------------
// Checks

inline int g_passed = 0;
inline int g_failed = 0;

// Counts a check; prints it when it failed.
inline void check(bool ok, const std::string& what) {
  (ok ? g_passed : g_failed)++;
  if (!ok) std::printf("FAILED: %s\n", what.c_str());
}

// The last line of a test and its exit status: 0 when every check passed.
inline int finish(const char* what) {
  std::printf("%s: %d passed, %d failed\n", what, g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

// A CUDA runtime call that failed: the test cannot go on, so it ends here,
// as failed (exit status 1), naming the call, where it is and the error.
[[noreturn]] inline void cuda_failed(cudaError_t rc, const char* call, const char* file, int line) {
  std::printf("FAILED: %s:%d: %s: %s (%s)\n", file, line, call, cudaGetErrorName(rc),
              cudaGetErrorString(rc));
  std::printf("%s: stopped at the failed CUDA call, after %d passed and %d failed checks\n", file,
              g_passed, g_failed);
  std::fflush(stdout);
  std::exit(1);
}

// True, after printing why, when this process sees no CUDA device: main
// then returns kSkip.
inline bool no_device() {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc == cudaSuccess && devices > 0) return false;
  cudaGetLastError();  // the "no driver / no device" error is not the test's
  std::printf(
      "SKIP: no CUDA device visible to this process (cudaGetDeviceCount: %s); the gpu suite "
      "runs on a machine with a GPU (scripts/device-check)\n",
      rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
  return true;
}

}  // namespace gpu_test

// Runs a CUDA runtime call; if it fails, the test ends as failed with the
// error and the call's file:line. A kernel launch is checked with
// CUDA_CHECK(cudaGetLastError()) after it.
#define CUDA_CHECK(call)                                                \
  do {                                                                  \
    const cudaError_t gpu_test_rc_ = (call);                            \
    if (gpu_test_rc_ != cudaSuccess)                                    \
      ::gpu_test::cuda_failed(gpu_test_rc_, #call, __FILE__, __LINE__); \
  } while (0)

namespace gpu_test {

// ---------------------------------------------------------------------------
// Device copies

// n elements of device memory at d, on the host.
template <class T>
std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  if (n != 0) CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// True if a 32- or 16-bit pattern of type t (f32, bf16 or f16) is a NaN.
inline bool is_nan_bits(std::uint32_t bits, shardopt::DType t) {
  switch (t) {
    case shardopt::DType::f16:
      return (bits & 0x7fffu) > 0x7c00u;
    case shardopt::DType::bf16:
      return (bits & 0x7fffu) > 0x7f80u;
    default:
      return (bits & 0x7fffffffu) > 0x7f800000u;
  }
}

// a and b hold the same values of type t: each element equal bitwise, or
// both NaN. The host and the device make NaNs of different signs and
// payloads (x86 gives inf - inf as 0xffc00000, CUDA as 0x7fffffff), which a
// step then carries on; every other bit must agree.
template <class T>
bool same_values(std::span<const T> a, std::span<const T> b, shardopt::DType t) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2);
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint32_t x = 0, y = 0;
    std::memcpy(&x, &a[i], sizeof(T));
    std::memcpy(&y, &b[i], sizeof(T));
    if (x != y && !(is_nan_bits(x, t) && is_nan_bits(y, t))) return false;
  }
  return true;
}

// A host buffer and its device copy, which starts `shift` elements into its
// allocation (with spare bytes behind it).
template <class T>
class Mirror {
 public:
  std::vector<T> host;
  T* dev = nullptr;

  explicit Mirror(std::vector<T> h, std::size_t shift = 0) : host(std::move(h)) {
    // An empty host copy gets an address too, as its device copy has one, so
    // that a step sees the same (non-null) arguments on both sides: the steps
    // take bf16 parameters with null, empty remainders for bf16 parameters
    // without remainders.
    host.reserve(1);
    CUDA_CHECK(cudaMalloc(&base_, (host.size() + shift) * sizeof(T) + kSpareBytes));
    dev = base_ + shift;
    upload();
  }
  ~Mirror() { CUDA_CHECK(cudaFree(base_)); }
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;

  // The host copy or the device copy.
  T* at(bool device) { return device ? dev : host.data(); }
  // The host copy to the device.
  void upload() {
    if (host.empty()) return;
    CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  // The device copy, on the host.
  std::vector<T> device_copy() const { return to_host(dev, host.size()); }
  // The device copy equals the host copy bitwise.
  bool same() const {
    const std::vector<T> back = device_copy();
    return host.empty() || std::memcmp(back.data(), host.data(), host.size() * sizeof(T)) == 0;
  }
  // The device copy holds the host copy's values of type t (same_values).
  bool same_values(shardopt::DType t) const {
    const std::vector<T> back = device_copy();
    return gpu_test::same_values<T>(back, host, t);
  }

 private:
  static constexpr std::size_t kSpareBytes = 64;
  T* base_ = nullptr;
};

// bf16 parameters with their remainders: the device copies hold the host
// copies' fp32 values (decoded; same_values).
inline bool same_master(const Mirror<shardopt::bfloat16>& hi, const Mirror<std::uint16_t>& rem) {
  const std::size_t n = hi.host.size();
  std::vector<float> host(n), dev(n);
  shardopt::functional::decode_param_remainders(hi.host, rem.host, host);
  shardopt::functional::decode_param_remainders(hi.device_copy(), rem.device_copy(), dev);
  return same_values<float>(dev, host, shardopt::DType::f32);
}

// ---------------------------------------------------------------------------
// Inputs

// n values drawn uniformly from [lo, hi).
inline std::vector<float> uniform(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// The bits of g's values as bf16 for t bf16, else as f16.
inline std::vector<std::uint16_t> to_16(const std::vector<float>& g, shardopt::DType t) {
  std::vector<std::uint16_t> h(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    h[i] = t == shardopt::DType::bf16 ? shardopt::bf16_from_float(g[i]).bits
                                      : shardopt::f16_from_float(g[i]).bits;
  }
  return h;
}

}  // namespace gpu_test
