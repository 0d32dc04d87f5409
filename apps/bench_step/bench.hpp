// shardopt-bench-step: the model, the buffers and the timing of one row:
// the ZeRO step beside its limit.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../support/report.hpp"
#include "options.hpp"

namespace bench_step {

using bench::uniform;
using report::Stats;

// ---------------------------------------------------------------------------
// The model

struct Tensor {
  std::string name;
  std::size_t numel;
};

// kBlocks MLP blocks of width d, the largest d that fits, and a head that
// takes the rest, so the parameters add up to `total` exactly.
std::vector<Tensor> mlp_layout(std::size_t total);

// ---------------------------------------------------------------------------
// The run

// A row is marked busy when other processes used more than this share of
// the machine while it ran.
inline constexpr double kBusyFraction = 0.05;

inline double mib(double bytes) { return bytes / (1 << 20); }

struct Row {
  int stage = 0;
  int ranks = 0;
  std::size_t params = 0;
  DType dtype = DType::f32;
  std::size_t tensors = 0;
  std::string numels;  // each tensor's elements, comma-separated (shardopt-plan -t takes it)
  int iters = 0;
  Stats reduce, update, gather, total, l_reduce, l_update, l_gather;
  double limit_us = 0;
  Stats b_reduce, b_update, b_gather;  // the limit with the collectives called per bucket
  double limit_b_us = 0;
  Options::Grads grads = Options::Grads::user;  // stage 2's (-g); stages 0 and 1: the user's
  Stats pass;              // stage 2: a copy of the model's gradients (one pass over them)
  Stats owned;             // stream rows: the owned-gradient step, timed in the same iterations
  double other_load = -1;  // other processes' share of the CPUs while timed; -1 unknown
  bool busy() const { return other_load > kBusyFraction; }
  std::string optimizer;  // the engine's, as it reports it (param_group(0))
  shardopt::MemoryReport report;
  double mem_bytes = 0;
  double formula_bytes = 0;  // zero_memory_formula alone
  double bucket_bytes = 0;   // the buckets counted beside it
  double mem_formula_bytes() const { return formula_bytes + bucket_bytes; }
  double exposed_us() const { return total.median_us - update.median_us; }
  double ratio() const { return limit_us > 0 ? total.median_us / limit_us : 0; }
  double ratio_b() const { return limit_b_us > 0 ? total.median_us / limit_b_us : 0; }
  double mem_ratio() const { return mem_bytes / mem_formula_bytes(); }
  // The buckets counted are an upper bound, so the memory goal is a band:
  // at least the formula (less 5%), at most the formula plus the buckets
  // (plus 5%).
  bool mem_goal_met() const {
    return mem_bytes >= (1 - kMemoryTolerance) * formula_bytes &&
           mem_bytes <= (1 + kMemoryTolerance) * mem_formula_bytes();
  }
};

// The buffers of one parameter count, allocated once (2 MiB aligned, touched
// at allocation) for the widest dtype and every stage asked for.
struct Buffers {
  std::size_t psi = 0;                 // parameters
  std::size_t block = 0;               // ceil(psi / ranks): a rank's block in the raw collectives
  shardopt::HostBuffer params, grads;  // the model's, registered with the engine
  // The limit: the raw collectives' input (the ranks' unreduced gradients)
  // and output (reduced gradients, then the gathered parameters), and the
  // functional optimizer's fp32 master, states and two-pass scratch.
  shardopt::HostBuffer lim_in, lim_out, master, scratch;
  std::vector<shardopt::HostBuffer> states;
};

class Bench {
 public:
  Bench(const Options& o, shardopt::Communicator& comm, MPI_Comm raw, MPI_Comm timing,
        MPI_Comm node)
      : o_(o),
        comm_(comm),
        raw_(raw),
        timing_(timing),
        node_(node),
        rank_(comm.rank()),
        nranks_(comm.size()),
        order_(12345) {}

  // Allocates the buffers of psi parameters.
  void allocate(std::size_t psi) {
    b_ = Buffers{};
    const std::size_t n = static_cast<std::size_t>(nranks_);
    b_.psi = psi;
    b_.block = (psi + n - 1) / n;
    const bool stage0 = std::find(o_.stages.begin(), o_.stages.end(), 0) != o_.stages.end();
    const std::size_t kernel_n = stage0 ? psi : b_.block;
    const std::size_t wide = 4;  // f32, the widest dtype
    b_.params = shardopt::HostBuffer(psi * wide);
    b_.grads = shardopt::HostBuffer(psi * wide);
    // Per-bucket calls pad each bucket to a multiple of the ranks: room for
    // that, with the most buckets any dtype cuts.
    const std::size_t lim = std::max(n * b_.block, psi + n * bucket_count(psi, 4));
    b_.lim_in = shardopt::HostBuffer(lim * wide);
    b_.lim_out = shardopt::HostBuffer(lim * wide);
    b_.master = shardopt::HostBuffer(kernel_n * 4);
    for (std::size_t i = 0; i < o_.optimizer->states.size(); ++i) {
      b_.states.emplace_back(kernel_n * 4);
    }
    if (o_.optimizer->scratch != nullptr) b_.scratch = shardopt::HostBuffer(kernel_n * 4);
  }

  // The bytes allocate(psi) takes on a rank, plus the engine's formula and
  // buckets at the largest stage asked for.
  double bytes_needed(std::size_t psi) const {
    const double n = nranks_;
    const double block = std::ceil(static_cast<double>(psi) / n) + n * bucket_count(psi, 4);
    const bool stage0 = std::find(o_.stages.begin(), o_.stages.end(), 0) != o_.stages.end();
    const double kernel_n = stage0 ? static_cast<double>(psi) : block;
    const double mine =
        8.0 * static_cast<double>(psi) + 8.0 * n * block + (4.0 + state_bytes()) * kernel_n;
    double engine = 0;
    const bool streams =
        std::find(o_.stages.begin(), o_.stages.end(), 2) != o_.stages.end() &&
        std::find(o_.grads.begin(), o_.grads.end(), Options::Grads::stream) != o_.grads.end();
    for (int stage : o_.stages) {
      for (DType t : o_.dtypes) {
        const double one = shardopt::zero_memory_formula(stage, static_cast<double>(psi), nranks_,
                                                         t, state_bytes()) +
                           bucket_bytes(psi, t, stage) - 2.0 * dsize(t) * psi;
        // A stream row's second optimizer: its states and owned gradients.
        engine = std::max(engine, stage == 2 && streams ? 2 * one + 2.0 * dsize(t) * psi : one);
      }
    }
    return mine + engine;
  }

  // The optimizer's fp32 bytes per element of the shard: its states, and
  // LAMB's direction, which the engine keeps for the whole shard as well.
  double state_bytes() const {
    const std::size_t k = o_.optimizer->states.size() + (o_.optimizer->scratch != nullptr ? 1 : 0);
    return 4.0 * static_cast<double>(k);
  }

  double bucket_mb() const {
    return o_.bucket_mb > 0 ? o_.bucket_mb : shardopt::settings().bucket_mb;
  }

  // The bucket bytes counted beside the formula (see kBucketsCounted).
  double bucket_bytes(std::size_t psi, DType t, int stage) const {
    const double one = std::min(bucket_mb() * (1 << 20), dsize(t) * static_cast<double>(psi));
    return kBucketsCounted * one * (stage == 2 ? 1.0 + 1.0 / nranks_ : 1.0);
  }

  static double dsize(DType t) { return static_cast<double>(shardopt::dtype_size(t)); }

  // Elements of one bucket of elements of `elem` bytes: the configured MiB,
  // rounded down to a multiple of the ranks (equal pieces), at least one
  // element per rank.
  std::size_t bucket_elems(std::size_t elem) const {
    const auto n = static_cast<std::size_t>(nranks_);
    const auto b = static_cast<std::size_t>(bucket_mb() * (1 << 20)) / elem;
    return std::max(n, b / n * n);
  }
  std::size_t bucket_count(std::size_t psi, std::size_t elem) const {
    const std::size_t b = bucket_elems(elem);
    return (psi + b - 1) / b;
  }

  // Random parameters and gradients of dtype t, and the limit's arrays
  // (its input: gradients again, at the block size). The engine reads the
  // parameters at construction, so every row starts from fresh ones.
  void fill(DType t) {
    const std::uint64_t key = bench::mix64(kSeed + 1000 * static_cast<std::uint64_t>(rank_) +
                                           static_cast<std::uint64_t>(t));
    const std::size_t n = b_.lim_in.size() / 4;  // elements the limit's buffers hold
    // Every rank starts from the same parameters, as a model broadcast from
    // rank 0 would; the gradients differ per rank.
    fill_values(b_.params.data(), t, b_.psi, bench::mix64(kSeed), -1.0f, 1.0f);
    fill_values(b_.grads.data(), t, b_.psi, key + 1, -1e-2f, 1e-2f);
    fill_values(b_.lim_in.data(), t, n, key + 1, -1e-2f, 1e-2f);
    fill_values(b_.lim_out.data(), t, n, key + 2, -1e-2f, 1e-2f);
    const std::size_t kn = b_.master.size() / 4;
    fill_values(b_.master.data(), DType::f32, kn, key + 3, -1.0f, 1.0f);
    for (std::size_t s = 0; s < b_.states.size(); ++s) {
      // In [0, 1e-2): some states are sums of squares.
      fill_values(b_.states[s].data(), DType::f32, kn, key + 4 + s, 0.0f, 1e-2f);
    }
  }

  // One row: constructs the engine, times it beside the limit, and returns
  // the row (on every rank; times are the slowest rank's). Sets `differ` if
  // the ranks' parameters differ after the steps.
  Row run(int stage, DType t, Options::Grads grads, bool& differ);

  // n values of type t uniform in [lo, hi), each drawn from (key, index).
  static void fill_values(void* dst, DType t, std::size_t n, std::uint64_t key, float lo,
                          float hi) {
    if (t == DType::bf16) {
      auto* p = static_cast<shardopt::bfloat16*>(dst);
#pragma omp parallel for schedule(static)
      for (std::size_t i = 0; i < n; ++i) p[i] = shardopt::bf16_from_float(uniform(key, i, lo, hi));
    } else {
      auto* p = static_cast<float*>(dst);
#pragma omp parallel for schedule(static)
      for (std::size_t i = 0; i < n; ++i) p[i] = uniform(key, i, lo, hi);
    }
  }

 private:
  const Options& o_;
  shardopt::Communicator& comm_;
  MPI_Comm raw_;     // the raw MPI collectives run here
  MPI_Comm timing_;  // barriers and the reductions of the results run here
  MPI_Comm node_;    // the ranks on this rank's node: their CPU time adds up
  int rank_;
  int nranks_;
  std::mt19937 order_;  // the same draws on every rank
  Buffers b_;
};

}  // namespace bench_step
