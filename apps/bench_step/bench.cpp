// shardopt-bench-step: the model and the timing of one row (bench.hpp).
#include "bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "../support/bench_mpi.hpp"
#include "../support/machine.hpp"

namespace bench_step {

using bench::Streams;
using report::stats_of;

std::vector<Tensor> mlp_layout(std::size_t total) {
  constexpr std::size_t kBlocks = 4;
  auto block_numel = [](std::size_t d) { return 8 * d * d + 6 * d; };
  auto d = static_cast<std::size_t>(std::sqrt(static_cast<double>(total) / (8.0 * kBlocks)));
  while (d > 0 && kBlocks * block_numel(d) > total) --d;
  std::vector<Tensor> t;
  std::size_t used = 0;
  if (d > 0) {
    for (std::size_t b = 0; b < kBlocks; ++b) {
      const std::string p = "block" + std::to_string(b) + ".";
      for (Tensor x : {Tensor{p + "norm.weight", d}, Tensor{p + "fc1.weight", 4 * d * d},
                       Tensor{p + "fc1.bias", 4 * d}, Tensor{p + "fc2.weight", 4 * d * d},
                       Tensor{p + "fc2.bias", d}}) {
        used += x.numel;
        t.push_back(std::move(x));
      }
    }
  }
  if (total > used) t.push_back({"head.weight", total - used});
  return t;
}

namespace {

// CPU seconds this process used and the whole machine was busy, and the
// wall clock: two samples give the share of the CPUs other processes used
// in between. Every rank busy-waits in MPI, so a step and its limit slowed
// down alike by a competing process would still read ratio 1: such rows are
// marked instead.
struct CpuClock {
  double self_s = 0, busy_s = 0, wall_s = 0;
  bool ok = false;
};

CpuClock cpu_clock() {
  CpuClock c;
  c.wall_s = MPI_Wtime();
  const machine::CpuTimes t = machine::cpu_times();
  c.self_s = t.self_s;
  c.busy_s = t.busy_s;
  c.ok = t.ok;
  return c;
}

}  // namespace

Row Bench::run(int stage, DType t, Options::Grads grads, bool& differ) {
  const std::vector<Tensor> layout = mlp_layout(b_.psi);
  const std::size_t es = shardopt::dtype_size(t);
  std::vector<shardopt::Param> params;
  // Stage 2 streams each gradient into its bucket (ZeroOptions::
  // stream_grads), as a backward pass that hands over each layer's
  // gradient would: no full-size gradient buffer is registered, which is
  // the memory the stage-2 formula counts. b_.grads stands for the
  // backward pass's output and is not counted.
  // With --grads owned the optimizer owns them instead (Param::grad null):
  // they are written into its buffers once, where a backward pass would
  // write them, and each step marks them ready, as stages 0 and 1 do with
  // the user's buffers (the fused update where it applies).
  // With --grads user they are the user's buffers (Param::grad), as at
  // stages 0 and 1.
  const bool stream = stage == 2 && grads == Options::Grads::stream;
  const bool owned = stage == 2 && grads == Options::Grads::owned;
  const bool user = stage == 2 && grads == Options::Grads::user;
  std::vector<const unsigned char*> grad_of;
  std::size_t offset = 0;
  for (const Tensor& x : layout) {
    shardopt::Param p;
    p.name = x.name;
    p.data = b_.params.as<unsigned char>() + offset * es;
    grad_of.push_back(b_.grads.as<unsigned char>() + offset * es);
    p.grad = stream || owned ? nullptr : b_.grads.as<unsigned char>() + offset * es;
    p.numel = x.numel;
    p.dtype = t;
    params.push_back(std::move(p));
    offset += x.numel;
  }
  shardopt::ZeroOptions zo;
  zo.stage = stage;
  zo.bucket_mb = o_.bucket_mb;
  zo.stream_grads = stream;
  shardopt::ZeroRedundancyOptimizer opt(comm_, params, engine_config(*o_.optimizer), zo);
  const std::size_t np = params.size();
  if (owned)
    for (std::size_t i = 0; i < np; ++i) std::memcpy(opt.grad(i), grad_of[i], params[i].numel * es);
  // A streamed row also times the owned-gradient step, on a second
  // optimizer over the same parameters, in the same iterations: goal 3
  // compares the two, and rows timed one after the other differ by more
  // than its margin on a shared machine.
  std::optional<shardopt::ZeroRedundancyOptimizer> twin;
  if (stream) {
    shardopt::ZeroOptions owned_options = zo;
    owned_options.stream_grads = false;
    twin.emplace(comm_, params, engine_config(*o_.optimizer), owned_options);
    for (std::size_t i = 0; i < np; ++i)
      std::memcpy(twin->grad(i), grad_of[i], params[i].numel * es);
  }

  // The limit's arrays: stage 0 updates the whole model, 1 and 2 this
  // rank's block; the gradients are the raw collectives' input (random,
  // never written), the bf16 copy goes where the allgather reads it.
  const std::size_t mine = static_cast<std::size_t>(rank_) * b_.block;
  Streams s;
  s.n = stage == 0 ? b_.psi : b_.block;
  s.param = b_.master.as<float>();
  for (std::size_t i = 0; i < b_.states.size(); ++i) s.state[i] = b_.states[i].as<float>();
  s.scratch = b_.scratch.size() > 0 ? b_.scratch.as<float>() : nullptr;
  s.grad_type = t;
  s.grad = b_.lim_in.as<unsigned char>() + (stage == 0 ? 0 : mine * es);
  s.copy =
      t == DType::bf16 ? b_.lim_out.as<unsigned char>() + (stage == 0 ? 0 : mine * es) : nullptr;
  s.copy_type = DType::bf16;
  const int block = static_cast<int>(b_.block);
  const MPI_Datatype mt = bench_mpi::raw_mpi_type(t);
  void* const out = b_.lim_out.data();
  void* const own_block = b_.lim_out.as<unsigned char>() + mine * es;
  // The same calls cut as the engine cuts them, one bucket at a time: each
  // piece is (first element, elements per rank).
  std::vector<std::pair<std::size_t, int>> pieces;
  {
    const auto n = static_cast<std::size_t>(nranks_);
    const std::size_t bk = bucket_elems(es);
    std::size_t at = 0;
    for (std::size_t begin = 0; begin < b_.psi; begin += bk) {
      const std::size_t per = (std::min(bk, b_.psi - begin) + n - 1) / n;
      pieces.emplace_back(at, static_cast<int>(per));
      at += n * per;
    }
  }
  auto byte_at = [&](shardopt::HostBuffer& buf, std::size_t element) {
    return buf.as<unsigned char>() + element * es;
  };

  std::int64_t kernel_steps = 0;
  shardopt::StepInfo info;
  enum Part {
    kReduce,
    kUpdate,
    kGather,
    kTotal,
    kLReduce,
    kLUpdate,
    kLGather,
    kBReduce,
    kBUpdate,
    kBGather,
    kPass,
    kOwned,
    kParts
  };
  double sample[kParts] = {};
  auto timed = [&](auto&& fn) {
    MPI_Barrier(timing_);
    const double t0 = MPI_Wtime();
    fn();
    return MPI_Wtime() - t0;
  };
  auto run_engine = [&] {
    sample[kTotal] = timed([&] {
      for (std::size_t i = np; i-- > 0;) {
        if (stream)
          opt.grad_ready(i, grad_of[i]);
        else
          opt.grad_ready(i);
      }
      info = opt.step();
    });
    sample[kReduce] = info.reduce_seconds;
    sample[kUpdate] = info.update_seconds;
    sample[kGather] = info.gather_seconds;
  };
  // One rank needs no collective (MPI's would be copies): its limit is
  // the kernel alone. Each limit runs in the order of a step (reduce,
  // update, gather), so that what stays in cache from one part to the
  // next is what a step finds.
  const bool communicates = nranks_ > 1;
  const bool gathers = communicates && stage > 0;
  const auto mine_of = [&](std::size_t at, int per) {
    return at + static_cast<std::size_t>(rank_) * static_cast<std::size_t>(per);
  };
  auto run_limit = [&] {
    sample[kLReduce] = sample[kLGather] = 0;
    if (communicates) {
      sample[kLReduce] = timed([&] {
        MPI_Reduce_scatter_block(b_.lim_in.data(), own_block, block, mt, MPI_SUM, raw_);
        if (stage < 2) MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, block, mt, raw_);
      });
    }
    sample[kLUpdate] = timed([&] { o_.optimizer->step(s, ++kernel_steps); });
    if (gathers) {
      sample[kLGather] =
          timed([&] { MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, block, mt, raw_); });
    }
  };
  auto run_bucketed_limit = [&] {
    sample[kBReduce] = sample[kBGather] = 0;
    if (communicates) {
      sample[kBReduce] = timed([&] {
        for (const auto& [at, per] : pieces) {
          MPI_Reduce_scatter_block(byte_at(b_.lim_in, at), byte_at(b_.lim_out, mine_of(at, per)),
                                   per, mt, MPI_SUM, raw_);
          if (stage < 2) {
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, byte_at(b_.lim_out, at), per, mt,
                          raw_);
          }
        }
      });
    }
    sample[kBUpdate] = timed([&] { o_.optimizer->step(s, ++kernel_steps); });
    if (gathers) {
      sample[kBGather] = timed([&] {
        for (const auto& [at, per] : pieces) {
          MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, byte_at(b_.lim_out, at), per, mt, raw_);
        }
      });
    }
  };
  // Stage 2: one pass over the gradients, the streamed step's allowance
  // beside the owned one (goal 3): the model's gradients copied into the
  // limit's output buffer, which holds as many.
  auto run_pass = [&] {
    sample[kPass] = 0;
    if (stage == 2)
      sample[kPass] = timed([&] { std::memcpy(b_.lim_out.data(), b_.grads.data(), b_.psi * es); });
  };
  auto run_twin = [&] {
    sample[kOwned] = 0;
    if (twin) {
      sample[kOwned] = timed([&] {
        for (std::size_t i = np; i-- > 0;) twin->grad_ready(i);
        twin->step();
      });
    }
  };
  // The step, the two limits, the pass and the owned step in an order drawn
  // at random per iteration (the same on every rank), so that none always
  // follows the same one.
  auto iteration = [&] {
    int order[] = {0, 1, 2, 3, 4};
    std::shuffle(std::begin(order), std::end(order), order_);
    for (int what : order) {
      if (what == 0) run_engine();
      if (what == 1) run_limit();
      if (what == 2) run_bucketed_limit();
      if (what == 3) run_pass();
      if (what == 4) run_twin();
    }
  };

  double per_iteration = 0;  // of the last warm-up iteration, barriers included
  for (int i = 0; i < o_.warmup; ++i) {
    const double w0 = MPI_Wtime();
    iteration();
    per_iteration = MPI_Wtime() - w0;
  }
  // Small sizes run more iterations, so that a row lasts long enough for
  // a stable median and for the busy check; every rank must run as many.
  MPI_Allreduce(MPI_IN_PLACE, &per_iteration, 1, MPI_DOUBLE, MPI_MAX, timing_);
  std::size_t iters = static_cast<std::size_t>(o_.iters);
  if (per_iteration > 0) {
    const double wanted = std::ceil(kSeriesBudgetS / per_iteration);
    iters = static_cast<std::size_t>(std::clamp(wanted, static_cast<double>(o_.iters),
                                                std::max<double>(o_.iters, kMaxScaledIters)));
  }
  std::vector<double> t_all(kParts * iters);
  const CpuClock before = cpu_clock();
  for (std::size_t i = 0; i < iters; ++i) {
    iteration();
    for (int p = 0; p < kParts; ++p) t_all[static_cast<std::size_t>(p) * iters + i] = sample[p];
  }
  const CpuClock after = cpu_clock();
  double node_self = after.self_s - before.self_s;
  MPI_Allreduce(MPI_IN_PLACE, &node_self, 1, MPI_DOUBLE, MPI_SUM, node_);
  const double wall = after.wall_s - before.wall_s;
  const double cores = static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN));
  // /proc/stat counts in clock ticks: below about 100 ticks of all the
  // cores together, the share would be mostly rounding.
  const double ticks = wall * cores * static_cast<double>(sysconf(_SC_CLK_TCK));
  double other = -1;
  if (before.ok && after.ok && ticks >= 100) {
    other = std::max(0.0, (after.busy_s - before.busy_s - node_self) / (wall * cores));
  }
  MPI_Allreduce(MPI_IN_PLACE, &other, 1, MPI_DOUBLE, MPI_MAX, timing_);
  MPI_Allreduce(MPI_IN_PLACE, t_all.data(), static_cast<int>(t_all.size()), MPI_DOUBLE, MPI_MAX,
                timing_);
  auto part = [&](int p) {
    const auto first = t_all.begin() + static_cast<std::ptrdiff_t>(p * iters);
    return stats_of(std::vector<double>(first, first + static_cast<std::ptrdiff_t>(iters)));
  };

  Row r;
  r.stage = stage;
  r.ranks = nranks_;
  r.params = b_.psi;
  r.dtype = t;
  r.tensors = np;
  for (std::size_t i = 0; i < np; ++i) {
    if (i > 0) r.numels.push_back(',');
    r.numels.append(std::to_string(params[i].numel));
  }
  r.iters = static_cast<int>(iters);
  r.reduce = part(kReduce);
  r.update = part(kUpdate);
  r.gather = part(kGather);
  r.total = part(kTotal);
  r.l_reduce = part(kLReduce);
  r.l_update = part(kLUpdate);
  r.l_gather = part(kLGather);
  r.limit_us = r.l_reduce.median_us + r.l_update.median_us + r.l_gather.median_us;
  r.b_reduce = part(kBReduce);
  r.b_update = part(kBUpdate);
  r.b_gather = part(kBGather);
  r.limit_b_us = r.b_reduce.median_us + r.b_update.median_us + r.b_gather.median_us;
  r.grads = stage == 2 ? grads : Options::Grads::user;
  r.pass = part(kPass);
  r.owned = part(kOwned);
  r.other_load = other;

  // Memory after the steps, so that anything allocated at the first step
  // counts; the largest rank's.
  r.report = opt.memory_report();
  r.optimizer = std::visit(
      []<class O>(const O& c) {
        if constexpr (std::is_same_v<O, shardopt::CustomOptimizer>)
          return c.name;
        else
          return std::string(O::key);
      },
      opt.param_group(0));
  double mem =
      static_cast<double>(r.report.allocated() + r.report.user_params + r.report.user_grads);
  MPI_Allreduce(MPI_IN_PLACE, &mem, 1, MPI_DOUBLE, MPI_MAX, timing_);
  r.mem_bytes = mem;
  r.formula_bytes =
      shardopt::zero_memory_formula(stage, static_cast<double>(b_.psi), nranks_, t, state_bytes());
  // The owned gradients, or the user's registered ones.
  if (owned || user) r.formula_bytes += static_cast<double>(b_.psi * es);
  r.bucket_bytes = bucket_bytes(b_.psi, t, stage);

  // Every rank must hold the same parameters after a step.
  const std::uint64_t h = report::fnv1a(b_.params.data(), b_.psi * es);
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, timing_);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, timing_);
  differ = lo != hi;
  return r;
}

}  // namespace bench_step
