// shardopt-bench-comm: the collectives it times and its command line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace bench_comm {

using shardopt::DType;
using shardopt::ReduceOp;

inline constexpr const char* kProgram = "shardopt-bench-comm";

// The ratio goal applies to sizes of at least this many bytes.
inline constexpr std::size_t kGoalBytes = 64 * 1024;
inline constexpr double kGoalRatio = 0.98;
// Host buffers: of the floor (memory on one node, network across nodes),
// at sizes of at least kFloorGoalBytes (the goal of shardopt's own
// collectives).
inline constexpr std::size_t kFloorGoalBytes = std::size_t{16} << 20;
inline constexpr double kFloorGoalRatio = 0.8;
// With device buffers: of the slower of MPI and the copies.
inline constexpr double kDeviceGoalRatio = 0.8;
// Small sizes run more iterations than -n: about this long per timed series,
// up to kMaxScaledIters iterations.
inline constexpr double kSeriesBudgetS = 0.1;
inline constexpr int kMaxScaledIters = 1000;
// Seed of the input data; rank r's data is a function of (seed, r, index).
inline constexpr std::uint64_t kSeed = 0x243f6a8885a308d3ULL;

// ---------------------------------------------------------------------------
// Collectives

enum class Collective { allreduce, reduce_scatter, allgather, broadcast };
inline constexpr Collective kAllCollectives[] = {Collective::allreduce, Collective::reduce_scatter,
                                                 Collective::allgather, Collective::broadcast};

// Each one's name, bus bandwidth factor and hooks: collective.hpp.

// ---------------------------------------------------------------------------
// Options

struct Options {
  std::size_t min_bytes = 1024;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::size_t factor = 4;
  int warmup = 5;
  int iters = 20;
  DType dtype = DType::f32;
  ReduceOp redop = ReduceOp::sum;
  std::vector<Collective> ops{std::begin(kAllCollectives), std::end(kAllCollectives)};
  int root = 0;
  bool check = true;
  bool json = false;
  bool help = false;
  // --memory device: shardopt's buffers in device memory (the staged
  // backend); the MPI reference and the copies run beside it.
  bool device = false;
};

// Whether argv asks for device memory (read before MPI starts: device
// buffers need MPI_THREAD_MULTIPLE).
bool wants_device(int argc, char** argv);

// The text of -h.
extern const char* const kUsage;

// Parses argv the same way on every rank; throws cli::UsageError.
Options parse_options(int argc, char** argv, int nranks);

}  // namespace bench_comm
