// shardopt-plan: how much memory and time a ZeRO run takes, before it runs.
// The parts: options.cpp (the command line), model.cpp (the parameters:
// a count, a list of shapes, or a safetensors file's header), rates.cpp (the
// machine: alpha-beta models of the collectives fitted to shardopt-bench-comm
// --json rows, the update's rate from shardopt-bench-optim --json rows, or
// rates given), estimate.cpp (memory by plan_memory(), the step's time),
// main.cpp (the table, the advice, --json).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardopt/types.hpp"
#include "shardopt/zero.hpp"

namespace plan {

// A bad input: the program prints it and exits with 1 (2 for the command
// line's own errors, cli::UsageError).
struct InputError {
  std::string message;
};

struct Model {
  std::vector<std::size_t> numel;  // per tensor, in registration order
  // Each tensor's Param::unit under --units (empty: -1 for every one, the
  // engine's default: at stage 3 each tensor a unit of its own).
  std::vector<int> units;
  std::vector<std::string> names;        // for the summary; may be empty
  std::string source;                    // "7e9 parameters", "tensors", a file name
  std::optional<shardopt::DType> dtype;  // the file's, when it says
  std::string optimizer;                 // a checkpoint's, when it says
  std::size_t total() const {
    std::size_t t = 0;
    for (std::size_t n : numel) t += n;
    return t;
  }
};

enum class GradMode { owned, user, stream };

struct Options {
  // The model.
  std::optional<std::uint64_t> params;
  std::string tensors;
  std::string file;
  std::optional<shardopt::DType> dtype;
  bool remainders = false;
  bool reduce_fp32 = false;
  std::string optimizer;  // a key of shardopt/optimizers.hpp; "" = the file's or adam
  std::vector<int> stages = {0, 1, 2, 3};
  double bucket_mb = 0.0;  // 0: SHARDOPT_BUCKET_MB
  GradMode grads = GradMode::owned;
  bool separate = false;
  // --units: N (the model cut into N units), or one Param::unit per tensor.
  std::size_t unit_count = 0;  // 0: not given as a count
  std::vector<int> unit_list;  // empty: not given as a list
  double gather_limit_mb = 0;  // ZeroOptions::gather_limit_bytes in MiB; 0: automatic
  double persist_below_kb = 64;
  // The job.
  int nodes = 1;
  int ranks_per_node = 1;
  bool device = false;
  int threads = 0;  // 0: the library's count, shardopt::plan_threads()
  // The machine.
  std::vector<std::string> comm_files;
  std::string optim_file;
  double net_gbps = 0, net_latency_us = -1;
  double node_gbps = 0, node_latency_us = -1;
  double mem_gbps = 0;
  double backward_ms = 0;
  std::uint64_t memory = 0;  // bytes per rank for the largest model; 0: none
  bool json = false;
};

// options.cpp
std::string usage();
// Throws cli::UsageError.
Options parse_options(int argc, char** argv);

// model.cpp. Throws InputError.
Model load_model(const Options& o);
// A flat model of n parameters (-p, and the largest model's bisection) as
// `parts` tensors of near-equal size (the first n % parts one element
// larger); with --units each tensor is a unit of its own (units 0, 1, ...),
// without, the units are left to the engine's default. Throws InputError
// when n < parts.
Model flat_model(const Options& o, std::uint64_t n, std::size_t parts);
// The units of the model's tensors under --units (a count: consecutive
// tensors grouped into N units of about equal size, no tensor split; a
// list: checked against the tensors), empty without it. Throws InputError.
std::vector<int> units_of(const Options& o, const std::vector<std::size_t>& numel);
// How many units stage 3 gathers: runs of one unit number, each -1 alone
// (no units: one per tensor).
std::size_t count_units(const std::vector<int>& units, std::size_t tensors);
// "f32", "bf16", "f16" -> DType; nullopt for anything else.
std::optional<shardopt::DType> dtype_of(const std::string& name);
// The optimizer named by key with shardopt-bench-optim's options (SGD with
// momentum 0.9, the others torch's defaults); nullopt for an unknown key.
std::optional<shardopt::OptimizerConfig> optimizer_of(const std::string& key);
// Every optimizer's key, space-separated, in the descriptors' order.
std::string optimizer_keys();

// rates.cpp: one collective across the job, t(B) for a buffer of B bytes
// (nccl-tests' size: the whole gathered or reduced buffer), as two hops:
// within a node over L ranks, (L-1) alpha_node + (L-1)/L B beta_node, then
// across M nodes, the L ranks of a node each on 1/L of the data, together
// (M-1)/M B through the node's link: (M-1) alpha_net + (M-1)/M B beta_net.
struct Hop {
  double alpha = 0;  // seconds per step
  double beta = 0;   // seconds per byte
  bool known = false;
  std::string from;  // where the values came from, for the table
};
struct Collective {
  Hop node, net;
};
struct Machine {
  // Stage 2's reduce-scatter (into the shard: out of place), stages 0 and
  // 1's (in place, in the gradient buffer), the allgathers (in place).
  Collective reduce_scatter, reduce_scatter_inplace, allgather;
  double update_gbps = 0;  // the update's memory rate per rank (1e9 B/s)
  std::string update_from;
  std::vector<std::string> notes;
};
// Throws InputError (a malformed or unusable file, a rate missing).
Machine load_machine(const Options& o, const shardopt::OptimizerConfig& optimizer,
                     const std::string& precision_name);
double collective_seconds(const Collective& c, double bytes, int nodes, int local);

// estimate.cpp
struct StageEstimate {
  int stage = 0;
  shardopt::MemoryReport memory;
  std::size_t per_rank = 0;  // allocated + the user's buffers
  std::size_t buckets = 0;   // gradient buckets
  // Seconds: the reduction (exposed after the backward pass), the update,
  // the gather (stages 1, 2: the parameters after the update; stage 3: each
  // gathered unit twice, in the forward and backward passes, and the whole
  // units once after the update, none of it hidden); the reduction's own
  // time; the step.
  double reduce = 0, reduce_total = 0, update = 0, gather = 0, step = 0;
  bool fused = false;  // stage 2's (and 3's) fused reduce-scatter + update
  double update_bytes_per_param = 0;
  std::size_t update_elements = 0;
  std::optional<std::uint64_t> largest;  // parameters that fit in --memory
};
struct Plan {
  Model model;
  shardopt::DType dtype = shardopt::DType::f32;
  shardopt::OptimizerConfig optimizer;
  std::string optimizer_key;
  double bucket_mb = 0;
  Machine machine;
  bool timed = false;  // a machine was described
  std::vector<StageEstimate> stages;
  std::size_t units = 0;         // stage 3's units (count_units)
  std::size_t shm_per_node = 0;  // the transport's shared memory per node
  std::string advice;
  bool fits = true;  // some stage fits in --memory (always without it)
};
// Throws InputError, or shardopt::Error from plan_memory.
Plan estimate(const Options& o);

}  // namespace plan
