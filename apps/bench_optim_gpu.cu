// shardopt-bench-optim-gpu: the functional optimizers on a CUDA device beside
// their memory limit.
//
// The device counterpart of shardopt-bench-optim: the same optimizers, the
// same bytes per parameter (apps/optim_steps.hpp) and the same JSON keys.
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
// shardopt, the CUDA runtime and the standard library.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "optim_steps.hpp"
#include "report.hpp"
#include "shardopt/build_info.hpp"
#include "shardopt/error.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace {

using bench::bytes_formula;
using bench::bytes_per_param;
using bench::kMaxStates;
using bench::OptimizerEntry;
using bench::optimizers;
using bench::Precision;
using bench::Streams;
using cli::bad_value;
using cli::human_count;
using cli::OptionSpec;
using cli::parse_int;
using cli::split;
using cli::UsageError;
using report::median;
using report::num;
using shardopt::DType;

constexpr const char* kProgram = "shardopt-bench-optim-gpu";
// The exit status for "nothing to measure here", which test harnesses
// (Meson, Automake) report as skipped.
constexpr int kExitNoDevice = 77;

// The goal (docs/benchmarks.md): at this many parameters and more, a step
// runs at this fraction of the device-to-device copy rate or better.
constexpr std::size_t kGoalNumel = std::size_t{16} << 20;
constexpr double kGoalOfCopy = 0.90;
constexpr int kMaxReps = 10000;
constexpr std::uint64_t kSeed = 0x243f6a8885a308d3ULL;  // shardopt-bench-optim's

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
// Precisions (bytes per parameter: bench::bytes_per_param)

constexpr Precision kPrecisions[] = {
    {"fp32", DType::f32, false, DType::bf16, false, "f32 grads, no copy"},
    {"bf16", DType::bf16, true, DType::bf16, false,
     "bf16 grads, fp32 master + states, bf16 copy out"},
    {"f16", DType::f16, true, DType::f16, false, "f16 grads, fp32 master + states, f16 copy out"},
    {"bf16-rem", DType::bf16, false, DType::bf16, true,
     "bf16 grads, bf16 params with remainders (no fp32 master)"},
    {"fp32-bf16", DType::f32, true, DType::bf16, false,
     "f32 grads, fp32 master + states, bf16 copy out"},
};
constexpr int kDefaultPrecisions = 4;  // fp32 bf16 f16 bf16-rem

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
// Random data, drawn on the device with shardopt-bench-optim's function

enum class FillAs { f32, bf16, f16 };

template <FillAs As>
__global__ void fill_kernel(void* x, std::size_t n, std::uint64_t key, float lo, float hi) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float v = bench::uniform(key, i, lo, hi);
    if constexpr (As == FillAs::f32) static_cast<float*>(x)[i] = v;
    if constexpr (As == FillAs::bf16)
      static_cast<std::uint16_t*>(x)[i] = shardopt::bf16_from_float(v).bits;
    if constexpr (As == FillAs::f16)
      static_cast<std::uint16_t*>(x)[i] = shardopt::f16_from_float(v).bits;
  }
}

// fp32 values in [-1, 1) as bf16 parameters with remainders.
__global__ void fill_remainders_kernel(std::uint16_t* hi, std::uint16_t* rem, std::size_t n,
                                       std::uint64_t key) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const std::uint32_t u = __float_as_uint(bench::uniform(key, i, -1.0f, 1.0f));
    hi[i] = static_cast<std::uint16_t>((u + 0x8000u) >> 16);
    rem[i] = static_cast<std::uint16_t>(u - (static_cast<std::uint32_t>(hi[i]) << 16));
  }
}

template <FillAs As>
void fill(void* x, std::size_t n, std::uint64_t key, float lo, float hi, const Launch& l) {
  if (x == nullptr) return;
  fill_kernel<As>
      <<<static_cast<unsigned>(l.sms * kBlocksPerSm), kThreads, 0, l.stream>>>(x, n, key, lo, hi);
  check(cudaGetLastError(), "launching the fill kernel");
}

// ---------------------------------------------------------------------------
// Options

struct Options {
  std::vector<std::size_t> sizes;
  std::vector<const OptimizerEntry*> optimizers;
  std::vector<const Precision*> precisions;
  int reps = 20;
  int warmup = 3;
  bool json = false;
  bool help = false;
};

std::string usage() {
  const std::string names = bench::names_of(optimizers());
  std::string precisions;
  for (const auto& p : kPrecisions) {
    precisions += std::string("                          ") + p.name +
                  std::string(10 - std::strlen(p.name), ' ') + p.description + "\n";
  }
  return std::string(
             "usage: shardopt-bench-optim-gpu [options]\n"
             "\n"
             "Times shardopt's functional optimizers on CUDA device 0 beside their memory\n"
             "limit, measured in the same run on the same arrays. Runs as one process, with no\n"
             "launcher; exits with 77 when no CUDA device is visible.\n"
             "\n"
             "  -s, --numel LIST        parameter counts, comma-separated, with an optional K, M "
             "or\n"
             "                          G suffix (powers of 1024) (default 16M,64M,256M)\n"
             "  -o, --optimizers LIST   comma-separated, or all (default all): ") +
         names +
         "\n"
         "  -p, --precisions LIST   comma-separated, or all (default fp32,bf16,f16,bf16-rem):\n" +
         precisions +
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
         "  limit    GB/s of the memory-only kernel: the same arrays, the same reads and\n"
         "           in-place writes, trivial arithmetic, 16-byte loads and stores, the same\n"
         "           passes, counted with the same B_pp.\n"
         "  memcpy   GB/s of a device-to-device cudaMemcpy of numel fp32 values, counting\n"
         "           the bytes read and written (2 * 4 B per element), for reference.\n"
         "  ratio    GB/s / limit: the fraction of the memory limit the step reaches.\n"
         "\n"
         "After the table, one line per optimizer and precision gives its smallest ratio and\n"
         "its smallest GB/s / memcpy at >= 16M params, beside the goal (a step at >= 0.90 of\n"
         "the copy rate). Timings are not pass/fail.\n"
         "\n"
         "Exit status: 0 all steps ran, 1 a step or a CUDA call failed, 2 a bad option, 77 no\n"
         "CUDA device. With --json, each row is an object with the keys optimizer,\n"
         "precision, numel, threads, bytes_per_param, time_us, gbps, limit_gbps, stream_gbps\n"
         "(the memcpy rate), ratio.\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (std::size_t n : {16, 64, 256}) o.sizes.push_back(n << 20);
  for (const auto& e : optimizers()) o.optimizers.push_back(&e);
  for (int i = 0; i < kDefaultPrecisions; ++i) o.precisions.push_back(&kPrecisions[i]);

  static constexpr OptionSpec kSpecs[] = {
      {'s', "numel", true}, {'o', "optimizers", true}, {'p', "precisions", true},
      {'n', "reps", true},  {'w', "warmup", true},     {0, "json", false},
      {'h', "help", false},
  };
  cli::for_each_option(
      argc, argv, kSpecs,
      [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
        const std::string_view name = spec.long_name;
        if (name == "numel") {
          o.sizes.clear();
          for (std::string_view item : split(v)) {
            const auto n = cli::parse_scaled(item, std::uint64_t{1} << 40);
            if (!n)
              bad_value(label, v, "positive counts with an optional K, M or G suffix, e.g. 1M,16M");
            o.sizes.push_back(*n);
          }
        } else if (name == "optimizers") {
          o.optimizers = bench::choose(label, v, optimizers());
        } else if (name == "precisions") {
          o.precisions = bench::choose(label, v, kPrecisions);
        } else if (name == "reps") {
          o.reps = parse_int(label, v, 1, kMaxReps, "an integer, 1 to 10000");
        } else if (name == "warmup") {
          o.warmup = parse_int(label, v, 0, 1000, "an integer, 0 to 1000");
        } else if (name == "json") {
          o.json = true;
        } else if (name == "help") {
          o.help = true;
        }
      });
  std::sort(o.sizes.begin(), o.sizes.end());
  o.sizes.erase(std::unique(o.sizes.begin(), o.sizes.end()), o.sizes.end());
  return o;
}

// ---------------------------------------------------------------------------
// Timing

// Median seconds of a and of b, timed alternately in a random order per pair.
template <class A, class B>
std::pair<double, double> time_pair(Timer& timer, const A& a, const B& b, const Options& o,
                                    std::mt19937_64& rng) {
  for (int i = 0; i < o.warmup; ++i) {
    timer.seconds(a);
    timer.seconds(b);
  }
  std::vector<double> ta, tb;
  for (int r = 0; r < o.reps; ++r) {
    if (rng() & 1) {
      ta.push_back(timer.seconds(a));
      tb.push_back(timer.seconds(b));
    } else {
      tb.push_back(timer.seconds(b));
      ta.push_back(timer.seconds(a));
    }
  }
  return {median(ta), median(tb)};
}

// ---------------------------------------------------------------------------
// The run

struct Row {
  const OptimizerEntry* opt;
  const Precision* prec;
  std::size_t numel;
  int sms;
  std::size_t bpp;
  double time_us, gbps, limit_gbps, copy_gbps, ratio;
};

double gib(std::size_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

void print_row(const Options& o, const Row& r) {
  if (o.json) {
    std::printf(
        "{\"optimizer\": \"%s\", \"precision\": \"%s\", \"numel\": %zu, \"threads\": %d, "
        "\"bytes_per_param\": %zu, \"time_us\": %s, \"gbps\": %s, \"limit_gbps\": %s, "
        "\"stream_gbps\": %s, \"ratio\": %s}\n",
        r.opt->name, r.prec->name, r.numel, r.sms, r.bpp, num(r.time_us, 2).c_str(),
        num(r.gbps, 3).c_str(), num(r.limit_gbps, 3).c_str(), num(r.copy_gbps, 3).c_str(),
        num(r.ratio, 4).c_str());
  } else {
    std::printf("%-10s %-10s %6s %5d %4zu %10.1f %8.1f %8.1f %8.1f %6.3f  %s\n", r.opt->name,
                r.prec->name, human_count(r.numel).c_str(), r.sms, r.bpp, r.time_us, r.gbps,
                r.limit_gbps, r.copy_gbps, r.ratio, bytes_formula(*r.opt, *r.prec).c_str());
  }
  std::fflush(stdout);
}

// The device arrays of every row, for `n` parameters.
struct DeviceArrays {
  DeviceBuffer param, param_bf16, remainders, grad32, grad_bf16, grad_f16, copy, scratch;
  std::vector<DeviceBuffer> states;
  DeviceBuffer copy_src, copy_dst;  // the reference cudaMemcpy's
};

int run(const Options& o) {
  // Header and summary go to stderr with --json, so stdout holds rows only.
  FILE* info = o.json ? stderr : stdout;
  cudaDeviceProp prop{};
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0;
  cudaDriverGetVersion(&driver);
  std::fprintf(info, "# %s: %s\n", kProgram, shardopt::build_info_string().c_str());
  std::fprintf(info,
               "# device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB, L2 %.0f MiB, "
               "driver for CUDA %d.%d\n",
               prop.name, prop.major, prop.minor, prop.multiProcessorCount,
               gib(prop.totalGlobalMem), static_cast<double>(prop.l2CacheSize) / (1 << 20),
               driver / 1000, driver % 1000 / 10);
  std::fprintf(info, "# time: median of %d steps after %d warm-up, CUDA events on one stream\n",
               o.reps, o.warmup);

  std::size_t max_states = 0;
  bool need_scratch = false;
  for (const auto* e : o.optimizers) {
    max_states = std::max(max_states, e->states.size());
    need_scratch |= e->scratch != nullptr;
  }
  bool need_f32 = false, need_bf16 = false, need_f16 = false, need_copy = false, need_rem = false;
  bool need_grad32 = false;
  for (const auto* p : o.precisions) {
    need_f32 |= !p->remainders;
    need_rem |= p->remainders;
    need_grad32 |= p->grad == DType::f32;
    need_bf16 |= p->grad == DType::bf16;
    need_f16 |= p->grad == DType::f16;
    need_copy |= p->copy;
  }
  const std::size_t bytes_per_elem = (need_f32 ? 4 : 0) + (need_rem ? 4 : 0) + 4 * max_states +
                                     (need_scratch ? 4 : 0) + (need_grad32 ? 4 : 0) +
                                     (need_bf16 ? 2 : 0) + (need_f16 ? 2 : 0) +
                                     (need_copy ? 2 : 0) + 8;  // + the memcpy pair
  std::size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const std::size_t budget = free_bytes / 10 * 9;
  std::vector<std::size_t> sizes;
  for (const std::size_t n : o.sizes) {
    if (n * bytes_per_elem > budget) {
      std::fprintf(info,
                   "# skipping %s params: the arrays need %.2f GiB, over %.2f GiB (9/10 of "
                   "the free device memory)\n",
                   human_count(n).c_str(), gib(n * bytes_per_elem), gib(budget));
    } else {
      sizes.push_back(n);
    }
  }
  if (sizes.empty()) {
    std::fprintf(info, "# nothing to measure: no size fits\n");
    return 1;
  }
  const std::size_t max_n = sizes.back();

  Timer timer;
  const int sms = prop.multiProcessorCount;
  volatile float zero_source = 0.0f;  // unknown to the compiler
  const Launch launch_cfg{sms, timer.stream(), zero_source};

  DeviceArrays d;
  const auto alloc = [&](bool needed, std::size_t elem_bytes) {
    return DeviceBuffer(needed ? max_n * elem_bytes : 0);
  };
  d.param = alloc(need_f32, 4);
  d.param_bf16 = alloc(need_rem, 2);
  d.remainders = alloc(need_rem, 2);
  d.grad32 = alloc(need_grad32, 4);
  d.grad_bf16 = alloc(need_bf16, 2);
  d.grad_f16 = alloc(need_f16, 2);
  d.copy = alloc(need_copy, 2);
  d.scratch = alloc(need_scratch, 4);
  for (std::size_t i = 0; i < max_states; ++i) d.states.push_back(alloc(true, 4));
  d.copy_src = alloc(true, 4);
  d.copy_dst = alloc(true, 4);

  const std::uint64_t key = bench::mix64(kSeed + max_n);
  fill<FillAs::f32>(d.param.as<float>(), max_n, key + 1, -1.0f, 1.0f, launch_cfg);
  if (need_rem) {
    fill_remainders_kernel<<<static_cast<unsigned>(sms * kBlocksPerSm), kThreads, 0,
                             timer.stream()>>>(d.param_bf16.as<std::uint16_t>(),
                                               d.remainders.as<std::uint16_t>(), max_n, key + 1);
    check(cudaGetLastError(), "launching the fill kernel");
  }
  // States in [0, 1e-2): some are sums of squares (v, Adagrad's sum, RMSprop's sq).
  for (std::size_t s = 0; s < max_states; ++s)
    fill<FillAs::f32>(d.states[s].as<float>(), max_n, key + 2 + s, 0.0f, 1e-2f, launch_cfg);
  fill<FillAs::f32>(d.grad32.as<float>(), max_n, key + 12, -1e-2f, 1e-2f, launch_cfg);
  fill<FillAs::bf16>(d.grad_bf16.as<void>(), max_n, key + 10, -1e-2f, 1e-2f, launch_cfg);
  fill<FillAs::f16>(d.grad_f16.as<void>(), max_n, key + 11, -1e-2f, 1e-2f, launch_cfg);
  fill<FillAs::f32>(d.copy_src.as<float>(), max_n, key + 20, -1.0f, 1.0f, launch_cfg);
  check(cudaStreamSynchronize(timer.stream()), "filling the arrays");

  if (!o.json) {
    std::printf("#\n# %-8s %-10s %6s %5s %4s %10s %8s %8s %8s %6s  %s\n", "optimizer", "precision",
                "numel", "SMs", "B_pp", "time_us", "GB/s", "limit", "memcpy", "ratio",
                "bytes per param (r read, w written)");
  }

  std::vector<Row> rows;
  std::mt19937_64 rng(kSeed);
  for (const std::size_t n : sizes) {
    std::vector<double> copy_s;
    for (int i = 0; i < o.warmup + o.reps; ++i) {
      const double t = timer.seconds([&] {
        check(cudaMemcpyAsync(d.copy_dst.as<void>(), d.copy_src.as<void>(), n * 4,
                              cudaMemcpyDeviceToDevice, timer.stream()),
              "cudaMemcpyAsync");
      });
      if (i >= o.warmup) copy_s.push_back(t);
    }
    const double copy_gbps = static_cast<double>(n) * 8 / median(copy_s) / 1e9;

    for (const auto* opt : o.optimizers) {
      for (const auto* prec : o.precisions) {
        Streams s;
        s.n = n;
        if (prec->remainders) {
          s.param_bf16 = d.param_bf16.as<shardopt::bfloat16>();
          s.remainders = d.remainders.as<std::uint16_t>();
        } else {
          s.param = d.param.as<float>();
        }
        for (std::size_t i = 0; i < opt->states.size(); ++i) s.state[i] = d.states[i].as<float>();
        s.grad_type = prec->grad;
        s.grad = prec->grad == DType::bf16  ? d.grad_bf16.as<void>()
                 : prec->grad == DType::f16 ? d.grad_f16.as<void>()
                                            : d.grad32.as<void>();
        s.copy = prec->copy ? d.copy.as<void>() : nullptr;
        s.copy_type = prec->copy_type;
        s.scratch = opt->scratch != nullptr ? d.scratch.as<float>() : nullptr;
        s.stream = timer.stream();
        const int k = static_cast<int>(opt->states.size());
        std::int64_t step = 0;
        const auto [step_s, limit_s] = time_pair(
            timer, [&] { opt->step(s, ++step); }, [&] { memory_only(s, k, launch_cfg); }, o, rng);
        Row r{opt, prec, n, sms, bytes_per_param(*opt, *prec), 0, 0, 0, copy_gbps, 0};
        const double bytes = static_cast<double>(n) * static_cast<double>(r.bpp);
        r.time_us = step_s * 1e6;
        r.gbps = bytes / step_s / 1e9;
        r.limit_gbps = bytes / limit_s / 1e9;
        r.ratio = r.gbps / r.limit_gbps;
        print_row(o, r);
        rows.push_back(r);
      }
    }
  }

  // The goal.
  std::fprintf(info, "#\n# goal: a step at >= %.2f of the memcpy rate at >= %s params\n",
               kGoalOfCopy, human_count(kGoalNumel).c_str());
  const Row* worst = nullptr;
  for (const auto* opt : o.optimizers) {
    for (const auto* prec : o.precisions) {
      const Row* w = nullptr;
      double min_ratio = 0;
      for (const Row& r : rows) {
        if (r.opt != opt || r.prec != prec || r.numel < kGoalNumel) continue;
        if (w == nullptr || r.gbps / r.copy_gbps < w->gbps / w->copy_gbps) w = &r;
        min_ratio = min_ratio == 0 ? r.ratio : std::min(min_ratio, r.ratio);
      }
      if (w == nullptr) {
        std::fprintf(info, "#   %-10s %-10s not evaluated: no row at >= %s params\n", opt->name,
                     prec->name, human_count(kGoalNumel).c_str());
        continue;
      }
      const double of_copy = w->gbps / w->copy_gbps;
      std::fprintf(info,
                   "#   %-10s %-10s worst ratio to the limit %.3f; worst GB/s / memcpy %.3f (%s "
                   "params): %s\n",
                   opt->name, prec->name, min_ratio, of_copy, human_count(w->numel).c_str(),
                   of_copy >= kGoalOfCopy ? "met" : "not met");
      if (worst == nullptr || of_copy < worst->gbps / worst->copy_gbps) worst = w;
    }
  }
  if (worst == nullptr) {
    std::fprintf(info, "# goal: not evaluated (run sizes >= %s)\n",
                 human_count(kGoalNumel).c_str());
  } else {
    const double of_copy = worst->gbps / worst->copy_gbps;
    std::fprintf(info, "# goal: %s; worst row: %s %s %s params, GB/s / memcpy %.3f\n",
                 of_copy >= kGoalOfCopy ? "met" : "not met", worst->opt->name, worst->prec->name,
                 human_count(worst->numel).c_str(), of_copy);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n(%s -h lists the options)\n", kProgram, e.message.c_str(),
                 kProgram);
    return 2;
  }
  if (o.help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  int devices = 0;
  if (const cudaError_t rc = cudaGetDeviceCount(&devices); rc != cudaSuccess || devices == 0) {
    std::printf(
        "SKIP: %s: no CUDA device visible to this process (cudaGetDeviceCount: %s); "
        "nothing to measure\n",
        kProgram, rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return kExitNoDevice;
  }
  try {
    return run(o);
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "%s: %s\n  hint: %s\n", kProgram, e.what(), e.hint().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
  }
  return 1;
}
