// shardopt-bench-optim-gpu: the functional optimizers on a CUDA device beside
// their memory limit.
//
// The device counterpart of shardopt-bench-optim: the same optimizers, the
// same bytes per parameter (apps/support/optim_steps.hpp) and the same JSON keys.
// For each optimizer, precision and parameter count it times one step
// through the public functional API on device buffers (on
// StepOptions::stream; the call returns when the step is done) and,
// alternately on the same arrays, a memory-only kernel that reads and
// writes exactly the streams the step is counted with (in place, 16-byte
// loads and stores, trivial arithmetic), and prints both rates and their
// ratio. A device-to-device cudaMemcpy is measured beside them for
// reference.
//
//   shardopt-bench-optim-gpu                    # 16M, 64M and 256M params
//   shardopt-bench-optim-gpu -s 64M -o adam,lamb -p fp32,bf16-rem --json
//
// Without a CUDA device it says so and exits with 77. It needs no launcher
// and no MPI_Init: the functional API is local. Uses only the public API of
// shardopt, the CUDA runtime and the standard library. The options, the
// sweep, the timing, the table and the goal are shared with
// shardopt-bench-optim (harness.hpp, over the optimizer table of
// optim_steps.hpp); this file holds what is the device's: the arrays in
// device memory, the CUDA memory-only kernels and fills, the events that
// time them and the device-to-device copy.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../support/cli.hpp"
#include "../support/optim_steps.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"
#include "sweep.hpp"

namespace {

using bench::kMaxStates;
using bench::Streams;
using shardopt::DType;

constexpr const char* kProgram = "shardopt-bench-optim-gpu";
// The exit status for "nothing to measure here", which test harnesses
// (Meson, Automake) report as skipped.
constexpr int kExitNoDevice = 77;

// The goal (docs/benchmarks.md): at bench::kGoalNumel parameters and more, a
// step runs at this fraction of the device-to-device copy rate or better.
constexpr double kGoalOfCopy = 0.90;
constexpr int kMaxReps = 10000;

// The limit kernel's launch: grid-stride over chunks of kVec elements, at
// most kBlocksPerSm blocks of kThreads per SM (as the optimizer kernels).
constexpr int kVec = 8;  // 16 bytes of a 16-bit array, 32 of an fp32 one
constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

// ---------------------------------------------------------------------------
// CUDA resources

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
  }
}

// Device memory, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) {
    if (bytes != 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

// A stream and two events that time what is enqueued on it.
class Timer {
 public:
  Timer() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(stop_);
    cudaEventDestroy(start_);
    cudaStreamDestroy(stream_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  cudaStream_t stream() const { return stream_; }

  // Seconds between the stream reaching f's first and last work.
  template <class F>
  double seconds(const F& f) {
    check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    f();
    check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms * 1e-3;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// ---------------------------------------------------------------------------
// The memory-only limit kernels.
//
// They read and write the streams a step is counted with, in place, each
// element once per pass: p (or the bf16 parameters and their remainders)
// and the states become x + g * 0, LAMB's direction u = p + g * 0, the copy
// the top 16 bits of p. `zero` is a kernel argument, so the arithmetic is
// not folded away. Every array comes from its own cudaMalloc (256-byte
// aligned), so chunks of kVec elements are whole 16-byte words.

struct Arrays {
  std::size_t n;
  float* param;
  std::uint16_t* param_bf16;  // with remainders, instead of param
  std::uint16_t* remainders;
  float* state[kMaxStates];
  const void* grad;
  std::uint16_t* copy;
  float* scratch;
};

// W elements, moved as 16-byte words when they fill them.
template <class T, int W>
struct Pack {
  T v[W];
};

template <int W, class T>
__device__ __forceinline__ Pack<T, W> load(const T* p, std::size_t i) {
  Pack<T, W> r;
  if constexpr (W * sizeof(T) % 16 == 0) {
    uint4 words[W * sizeof(T) / 16];
    const uint4* src = reinterpret_cast<const uint4*>(p + i);
#pragma unroll
    for (std::size_t k = 0; k < W * sizeof(T) / 16; ++k) words[k] = src[k];
    std::memcpy(r.v, words, sizeof words);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = p[i + k];
  }
  return r;
}

template <int W, class T>
__device__ __forceinline__ void store(T* p, std::size_t i, const Pack<T, W>& x) {
  if constexpr (W * sizeof(T) % 16 == 0) {
    uint4 words[W * sizeof(T) / 16];
    std::memcpy(words, x.v, sizeof words);
    uint4* dst = reinterpret_cast<uint4*>(p + i);
#pragma unroll
    for (std::size_t k = 0; k < W * sizeof(T) / 16; ++k) dst[k] = words[k];
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p[i + k] = x.v[k];
  }
}

// A gradient as a float by the cheapest conversion that reads every bit
// (the value is multiplied by zero): f32 as is, 16 bits as the top half.
__device__ __forceinline__ float grad_value(float g) { return g; }
__device__ __forceinline__ float grad_value(std::uint16_t g) {
  return __uint_as_float(static_cast<std::uint32_t>(g) << 16);
}

// The parameters as fp32, from either storage (optim.hpp gives the encoding).
template <bool Rem, int W>
struct Params {
  Pack<float, W> p;
  Pack<std::uint16_t, W> hi, rem;

  __device__ __forceinline__ void load_from(const Arrays& a, std::size_t i) {
    if constexpr (Rem) {
      hi = load<W>(a.param_bf16, i);
      rem = load<W>(a.remainders, i);
    } else {
      p = load<W>(a.param, i);
    }
  }
  __device__ __forceinline__ float get(int j) const {
    if constexpr (Rem) {
      const auto low = static_cast<std::uint32_t>(static_cast<std::int16_t>(rem.v[j]));
      return __uint_as_float((static_cast<std::uint32_t>(hi.v[j]) << 16) + low);
    } else {
      return p.v[j];
    }
  }
  __device__ __forceinline__ void set(int j, float x) {
    if constexpr (Rem) {
      const std::uint32_t u = __float_as_uint(x);
      hi.v[j] = static_cast<std::uint16_t>((u + 0x8000u) >> 16);
      rem.v[j] = static_cast<std::uint16_t>(u - (static_cast<std::uint32_t>(hi.v[j]) << 16));
    } else {
      p.v[j] = x;
    }
  }
  __device__ __forceinline__ void store_to(const Arrays& a, std::size_t i) const {
    if constexpr (Rem) {
      store<W>(a.param_bf16, i, hi);
      store<W>(a.remainders, i, rem);
    } else {
      store<W>(a.param, i, p);
    }
  }
};

// One pass: reads g, p and the K states; writes p, the states and, with
// Copy, the 16-bit copy. Every load before every store, as in the
// optimizer kernels.
template <class G, int K, bool Rem, bool Copy, int W>
__device__ __forceinline__ void touch(const Arrays& a, float zero, std::size_t i) {
  const auto g = load<W>(static_cast<const G*>(a.grad), i);
  Params<Rem, W> p;
  p.load_from(a, i);
  Pack<float, W> s[K];
#pragma unroll
  for (int k = 0; k < K; ++k) s[k] = load<W>(a.state[k], i);
  Pack<std::uint16_t, W> c;
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const float t = grad_value(g.v[j]) * zero;
    const float pn = p.get(j) + t;
    p.set(j, pn);
#pragma unroll
    for (int k = 0; k < K; ++k) s[k].v[j] += t;
    c.v[j] = static_cast<std::uint16_t>(__float_as_uint(pn) >> 16);
  }
  p.store_to(a, i);
#pragma unroll
  for (int k = 0; k < K; ++k) store<W>(a.state[k], i, s[k]);
  if constexpr (Copy) store<W>(a.copy, i, c);
}

// The first of two passes: reads g, p and the K states; writes the states
// and the direction u = p + g * 0.
template <class G, int K, bool Rem, int W>
__device__ __forceinline__ void direction(const Arrays& a, float zero, std::size_t i) {
  const auto g = load<W>(static_cast<const G*>(a.grad), i);
  Params<Rem, W> p;
  p.load_from(a, i);
  Pack<float, W> s[K];
#pragma unroll
  for (int k = 0; k < K; ++k) s[k] = load<W>(a.state[k], i);
  Pack<float, W> u;
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const float t = grad_value(g.v[j]) * zero;
    u.v[j] = p.get(j) + t;
#pragma unroll
    for (int k = 0; k < K; ++k) s[k].v[j] += t;
  }
#pragma unroll
  for (int k = 0; k < K; ++k) store<W>(a.state[k], i, s[k]);
  store<W>(a.scratch, i, u);
}

// The second pass: reads p and u; writes p = p + u * 0 (and the copy).
template <bool Rem, bool Copy, int W>
__device__ __forceinline__ void apply(const Arrays& a, float zero, std::size_t i) {
  Params<Rem, W> p;
  p.load_from(a, i);
  const auto u = load<W>(a.scratch, i);
  Pack<std::uint16_t, W> c;
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const float pn = p.get(j) + u.v[j] * zero;
    p.set(j, pn);
    c.v[j] = static_cast<std::uint16_t>(__float_as_uint(pn) >> 16);
  }
  p.store_to(a, i);
  if constexpr (Copy) store<W>(a.copy, i, c);
}

// Op::template run<W>(a, zero, i) over [0, n): whole chunks grid-stride, the
// last n % kVec elements one per thread of block 0.
template <class Op>
__global__ void limit_kernel(Arrays a, float zero) {
  const std::size_t chunks = a.n / kVec;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += stride)
    Op::template run<kVec>(a, zero, c * kVec);
  const std::size_t tail = chunks * kVec + threadIdx.x;
  if (blockIdx.x == 0 && tail < a.n) Op::template run<1>(a, zero, tail);
}

template <class G, int K, bool Rem, bool Copy>
struct TouchOp {
  template <int W>
  __device__ static void run(const Arrays& a, float zero, std::size_t i) {
    touch<G, K, Rem, Copy, W>(a, zero, i);
  }
};
template <class G, int K, bool Rem>
struct DirectionOp {
  template <int W>
  __device__ static void run(const Arrays& a, float zero, std::size_t i) {
    direction<G, K, Rem, W>(a, zero, i);
  }
};
template <bool Rem, bool Copy>
struct ApplyOp {
  template <int W>
  __device__ static void run(const Arrays& a, float zero, std::size_t i) {
    apply<Rem, Copy, W>(a, zero, i);
  }
};

struct Launch {
  int sms;
  cudaStream_t stream;
  float zero;  // 0, from the command line's point of view unknown to the compiler
};

template <class Op>
void launch(const Arrays& a, const Launch& l) {
  const std::size_t chunks = std::max<std::size_t>(1, (a.n + kVec - 1) / kVec);
  const std::size_t blocks = std::min<std::size_t>((chunks + kThreads - 1) / kThreads,
                                                   static_cast<std::size_t>(l.sms) * kBlocksPerSm);
  limit_kernel<Op><<<static_cast<unsigned>(blocks), kThreads, 0, l.stream>>>(a, l.zero);
  check(cudaGetLastError(), "launching the limit kernel");
}

// The storage of the parameters: fp32 with or without a copy, or bf16 with
// remainders (which never has a copy: the bf16 parameters are the model's).
template <class G, int K>
void limit_with_states(const Arrays& a, const Launch& l) {
  const bool rem = a.remainders != nullptr, copy = a.copy != nullptr;
  if (a.scratch != nullptr) {
    if (rem) {
      launch<DirectionOp<G, K, true>>(a, l);
      launch<ApplyOp<true, false>>(a, l);
    } else {
      launch<DirectionOp<G, K, false>>(a, l);
      if (copy) {
        launch<ApplyOp<false, true>>(a, l);
      } else {
        launch<ApplyOp<false, false>>(a, l);
      }
    }
  } else if (rem) {
    launch<TouchOp<G, K, true, false>>(a, l);
  } else if (copy) {
    launch<TouchOp<G, K, false, true>>(a, l);
  } else {
    launch<TouchOp<G, K, false, false>>(a, l);
  }
}

template <class G>
void limit_with_grads(const Arrays& a, int k, const Launch& l) {
  switch (k) {
    case 1:
      return limit_with_states<G, 1>(a, l);
    case 2:
      return limit_with_states<G, 2>(a, l);
    case 3:
      return limit_with_states<G, 3>(a, l);
    default:
      throw std::logic_error("the limit kernel has no variant with " + std::to_string(k) +
                             " state arrays");
  }
}

// The memory-only kernel(s) of a step over s with k state arrays.
void memory_only(const Streams& s, int k, const Launch& l) {
  Arrays a{};
  a.n = s.n;
  a.param = s.param;
  a.param_bf16 = reinterpret_cast<std::uint16_t*>(s.param_bf16);
  a.remainders = s.remainders;
  for (int i = 0; i < kMaxStates; ++i) a.state[i] = s.state[static_cast<std::size_t>(i)];
  a.grad = s.grad;
  a.copy = static_cast<std::uint16_t*>(s.copy);
  a.scratch = s.scratch;
  if (s.grad_type == DType::f32) {
    limit_with_grads<float>(a, k, l);
  } else {
    limit_with_grads<std::uint16_t>(a, k, l);
  }
}

// ---------------------------------------------------------------------------
// Random data, drawn on the device with shardopt-bench-optim's values

__global__ void fill_kernel(bench::Fill f, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    f.store(i);
}

// ---------------------------------------------------------------------------
// Device memory

class DeviceMemory final : public bench::Memory {
 public:
  const bench::Program& program() const override {
    static const bench::Program p{
        .name = kProgram,
        .sizes_option = "numel",
        .default_sizes = {std::size_t{16} << 20, std::size_t{64} << 20, std::size_t{256} << 20},
        .series = {.warmup = 3, .reps = 20, .budget_s = 0, .max_reps = kMaxReps},
        .remainders = true,
        .table = {"SMs", 5, 10, 1, "memcpy", false},
        .goal = {.at_least = kGoalOfCopy, .of_reference = true, .names_threads = false},
    };
    return p;
  }

  std::string usage() const override;

  std::optional<int> unavailable() const override {
    int devices = 0;
    if (const cudaError_t rc = cudaGetDeviceCount(&devices); rc != cudaSuccess || devices == 0) {
      std::printf(
          "SKIP: %s: no CUDA device visible to this process (cudaGetDeviceCount: %s); "
          "nothing to measure\n",
          kProgram, rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
      return kExitNoDevice;
    }
    return std::nullopt;
  }

  // Device 0; the arrays once, for the largest size that fits in 9/10 of
  // the free device memory, filled; smaller sizes use their beginning.
  int start(const bench::Options& o, bench::Needs& needs, FILE* info) override {
    cudaDeviceProp prop{};
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    int driver = 0;
    cudaDriverGetVersion(&driver);
    std::fprintf(info,
                 "# device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB, L2 %.0f MiB, "
                 "driver for CUDA %d.%d\n",
                 prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                 bench::gib(prop.totalGlobalMem), static_cast<double>(prop.l2CacheSize) / (1 << 20),
                 driver / 1000, driver % 1000 / 10);
    std::fprintf(info, "# time: median of %d steps after %d warm-up, CUDA events on one stream\n",
                 o.reps, o.warmup);

    const std::size_t bytes_per_elem = needs.bytes() + 8;  // + the memcpy pair
    std::size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    const std::size_t budget = free_bytes / 10 * 9;
    for (const std::size_t n : o.sizes) {
      if (n * bytes_per_elem > budget) {
        std::fprintf(info,
                     "# skipping %s params: the arrays need %.2f GiB, over %.2f GiB (9/10 of "
                     "the free device memory)\n",
                     cli::human_count(n).c_str(), bench::gib(n * bytes_per_elem),
                     bench::gib(budget));
      } else {
        max_n_ = n;
      }
    }
    if (max_n_ == 0) {
      std::fprintf(info, "# nothing to measure: no size fits\n");
      return 1;
    }

    timer_.emplace();
    sms_ = prop.multiProcessorCount;
    volatile float zero_source = 0.0f;  // unknown to the compiler
    launch_ = Launch{sms_, timer_->stream(), zero_source};
    arrays_.emplace(needs, max_n_);
    copy_src_ = DeviceBuffer(max_n_ * 4);
    copy_dst_ = DeviceBuffer(max_n_ * 4);
    const std::uint64_t key = bench::fill_key(max_n_);
    for (const bench::Fill& f : bench::fills(arrays(), key)) fill(f, max_n_);
    fill({copy_src_.as<void>(), nullptr, bench::Fill::As::f32, key + 20, -1.0f, 1.0f}, max_n_);
    check(cudaStreamSynchronize(timer_->stream()), "filling the arrays");
    return 0;
  }

  bool prepare(std::size_t n, const bench::Needs&, FILE*) override { return n <= max_n_; }

  bench::ArraySet arrays() override { return arrays_->pointers(); }

  // One lane, all SMs, beside a device-to-device copy of n fp32 values.
  std::vector<bench::Lane> lanes(std::size_t n, const bench::Series& series) override {
    const double s = bench::time_median(
        *this,
        [&] {
          check(cudaMemcpyAsync(copy_dst_.as<void>(), copy_src_.as<void>(), n * 4,
                                cudaMemcpyDeviceToDevice, timer_->stream()),
                "cudaMemcpyAsync");
        },
        series);
    return {{sms_, static_cast<double>(n) * 8 / s / 1e9}};
  }

  void* stream() const override { return timer_->stream(); }

  double seconds(const std::function<void()>& f) override { return timer_->seconds(f); }

  void memory_only(const Streams& s, const bench::OptimizerEntry& opt) override {
    ::memory_only(s, static_cast<int>(opt.states.size()), launch_);
  }

  int goal_threads() const override { return sms_; }

 private:
  void fill(const bench::Fill& f, std::size_t n) {
    fill_kernel<<<static_cast<unsigned>(sms_ * kBlocksPerSm), kThreads, 0, timer_->stream()>>>(f,
                                                                                               n);
    check(cudaGetLastError(), "launching the fill kernel");
  }

  std::optional<Timer> timer_;
  int sms_ = 0;
  Launch launch_{};
  std::size_t max_n_ = 0;
  std::optional<bench::Arrays<DeviceBuffer>> arrays_;
  DeviceBuffer copy_src_, copy_dst_;  // the reference cudaMemcpy's
};

std::string DeviceMemory::usage() const {
  return std::string(
             "usage: shardopt-bench-optim-gpu [options]\n"
             "\n"
             "Times shardopt's functional optimizers on CUDA device 0 beside their memory\n"
             "limit, measured in the same run on the same arrays. Runs as one process, with no\n"
             "launcher; exits with 77 when no CUDA device is visible.\n"
             "\n"
             "  -s, --numel LIST        parameter counts, comma-separated, with an optional K, M "
             "or\n"
             "                          G suffix (powers of 1024) (default 16M,64M,256M)\n") +
         bench::optimizer_and_precision_usage(program()) +
         "  -n, --reps N            timed repetitions of each series (default 20)\n"
         "  -w, --warmup N          untimed repetitions first (default 3)\n"
         "      --json              one JSON object per row on stdout; the rest on stderr\n"
         "  -h, --help              this text\n"
         "\n"
         "The arrays are allocated once, with cudaMalloc, for the largest count that fits in\n"
         "nine tenths of the free device memory (larger counts are skipped), and filled once\n"
         "on the device with random data (params in [-1,1), states in [0,1e-2), grads in\n"
         "[-1e-2,1e-2)); smaller counts use their beginning. For each row the step and the\n"
         "limit kernel run alternately, in an order drawn at random per pair, after warm-up,\n"
         "each timed with CUDA events on one stream; the table shows medians.\n"
         "\n"
         "Columns:\n"
         "  SMs      the device's multiprocessors (the JSON key is threads)\n"
         "  B_pp     bytes per parameter, every read and write counted once, as\n"
         "           shardopt-bench-optim counts them; the formula is printed per row:\n"
         "           r = read, w = written, p = params (p2 rem2: bf16 params and their\n"
         "           remainders), g = grads, state arrays by name, c = the 16-bit copy,\n"
         "           u = LAMB's direction.\n"
         "  time_us  median time of one step, the functional call on a stream\n"
         "  GB/s     numel * B_pp / time_us\n"
         "  min-max  GB/s of the slowest and of the fastest repetition\n"
         "  limit    GB/s of the memory-only kernel: the same arrays, the same reads and\n"
         "           in-place writes, trivial arithmetic, 16-byte loads and stores, the same\n"
         "           passes, counted with the same B_pp (median time; min-max as for\n"
         "           the step).\n"
         "  memcpy   GB/s of a device-to-device cudaMemcpy of numel fp32 values, counting\n"
         "           the bytes read and written (2 * 4 B per element), for reference.\n"
         "  ratio    GB/s / limit of the medians: the fraction of the memory limit the\n"
         "           step reaches.\n"
         "\n"
         "After the table, one line per optimizer and precision gives its smallest ratio and\n"
         "its smallest GB/s / memcpy at >= 16M params, beside the goal (a step at >= 0.90 of\n"
         "the copy rate). Timings are not pass/fail.\n"
         "\n"
         "Exit status: 0 all steps ran, 1 a step or a CUDA call failed, 2 a bad option, 77 no\n"
         "CUDA device. With --json, each row is an object with the keys optimizer,\n"
         "precision, numel, threads, bytes_per_param, time_us, gbps, limit_gbps, stream_gbps\n"
         "(the memcpy rate), ratio, reps (pairs timed), time_us_min, time_us_max,\n"
         "limit_time_us, limit_time_us_min, limit_time_us_max, gbps_min, gbps_max,\n"
         "limit_gbps_min, limit_gbps_max.\n";
}

}  // namespace

int main(int argc, char** argv) {
  DeviceMemory memory;
  return bench::main_of(memory, argc, argv);
}
