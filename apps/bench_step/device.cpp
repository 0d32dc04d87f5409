// shardopt-bench-step --device cuda: the ZeRO step on device buffers beside
// its limit, measured in the same run on the same sizes (device.hpp).
//
// The model (mlp_layout), its parameters and gradients live in device
// memory; the step runs on the device's default stream and is timed up to
// the point the device has finished it (a copy of a few bytes back, which
// waits for the stream). The limit is what a step cannot avoid on this
// communicator: its own collectives on device buffers of the same sizes
// (reduce-scatter, then allgather in place; stages 0 and 1 allgather the
// reduced gradients too, as the engine's full reduction does) through the
// same transport the optimizer uses, and the functional optimizer alone on
// device buffers the size of the shard. Each is blocking or synchronous, so
// the wall clock times it whole. ratio = step / limit.
#include "device.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "../support/report.hpp"
#include "bench.hpp"

namespace bench_step {

namespace {

using shardopt::DeviceBuffer;

// Deterministic values in [lo, hi), the same on every rank for `key`.
std::vector<float> values(std::size_t n, std::uint64_t key, float lo, float hi) {
  std::vector<float> v(n);
  std::uint64_t x = key * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = lo + (hi - lo) * static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
  }
  return v;
}

// `v` in device memory as dtype t.
void upload(DeviceBuffer& dst, const std::vector<float>& v, DType t) {
  std::vector<std::byte> bytes(v.size() * shardopt::dtype_size(t));
  shardopt::cast(v.data(), DType::f32, bytes.data(), t, v.size());
  shardopt::device_copy(dst.data(), bytes.data(), bytes.size());
}

struct DeviceRow {
  int stage = 0;
  DType dtype = DType::f32;
  std::size_t params = 0;
  int iters = 0;
  report::Stats step, l_reduce, l_update, l_gather;
  double limit_us = 0;
  bool same = true;  // every rank's parameters equal after the steps
  double ratio() const { return limit_us > 0 ? step.median_us / limit_us : 0; }
};

DeviceRow run_row(const Options& o, shardopt::Communicator& comm, MPI_Comm timing, std::size_t psi,
                  DType t, int stage) {
  const int rank = comm.rank(), ranks = comm.size();
  const std::size_t n = static_cast<std::size_t>(ranks), es = shardopt::dtype_size(t);
  const std::size_t block = (psi + n - 1) / n, kernel_n = stage == 0 ? psi : block;

  DeviceBuffer dparams(psi * es), dgrads(psi * es);
  upload(dparams, values(psi, 1, -1.0f, 1.0f), t);
  upload(dgrads, values(psi, 100 + static_cast<std::uint64_t>(rank), -1e-2f, 1e-2f), t);
  std::vector<shardopt::Param> params;
  std::size_t at = 0;
  for (const Tensor& x : mlp_layout(psi)) {
    params.push_back({.name = x.name,
                      .data = static_cast<std::byte*>(dparams.data()) + at * es,
                      .numel = x.numel,
                      .dtype = t,
                      .grad = static_cast<std::byte*>(dgrads.data()) + at * es});
    at += x.numel;
  }
  shardopt::ZeroOptions zo;
  zo.stage = stage;
  zo.bucket_mb = o.bucket_mb;
  shardopt::ZeroRedundancyOptimizer opt(comm, params, engine_config(*o.optimizer), zo);

  // The limit's buffers: the unreduced gradients (n blocks), the reduced
  // then gathered ones, and the functional optimizer's fp32 master, states
  // and scratch over the shard.
  DeviceBuffer lim_in(n * block * es), lim_out(n * block * es), master(kernel_n * 4);
  upload(lim_in, values(n * block, 200 + static_cast<std::uint64_t>(rank), -1e-2f, 1e-2f), t);
  upload(master, values(kernel_n, 2, -1.0f, 1.0f), DType::f32);
  std::vector<DeviceBuffer> states;
  const std::vector<float> zeros(kernel_n, 0.0f);
  for (std::size_t i = 0; i < o.optimizer->states.size(); ++i) {
    states.emplace_back(kernel_n * 4);
    upload(states.back(), zeros, DType::f32);
  }
  DeviceBuffer scratch(o.optimizer->scratch != nullptr ? kernel_n * 4 : 0);
  auto* own = static_cast<std::byte*>(lim_out.data()) + static_cast<std::size_t>(rank) * block * es;
  bench::Streams s;
  s.n = kernel_n;
  s.param = static_cast<float*>(master.data());
  for (std::size_t i = 0; i < states.size(); ++i)
    s.state[i] = static_cast<float*>(states[i].data());
  s.scratch = o.optimizer->scratch != nullptr ? static_cast<float*>(scratch.data()) : nullptr;
  s.grad_type = t;
  s.grad = stage == 0 ? lim_in.data() : own;
  s.copy = t == DType::bf16 ? (stage == 0 ? lim_out.data() : own) : nullptr;
  s.copy_type = DType::bf16;

  std::byte probe[4];
  auto timed = [&](auto&& fn) {
    MPI_Barrier(timing);
    const double t0 = MPI_Wtime();
    fn();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, timing);
    return dt;
  };
  const bool communicates = ranks > 1;
  std::int64_t kernel_steps = 0;
  std::vector<double> t_step, t_reduce, t_update, t_gather;
  auto iteration = [&](bool keep) {
    const double st = timed([&] {
      opt.step();
      shardopt::device_copy(probe, dparams.data(), sizeof probe);  // waits for the step
    });
    const double rd = !communicates ? 0.0 : timed([&] {
      comm.reduce_scatter(lim_in.data(), own, block, t, shardopt::ReduceOp::sum);
      if (stage < 2) comm.allgather(own, lim_out.data(), block, t);
    });
    const double up = timed([&] { o.optimizer->step(s, ++kernel_steps); });
    const double ga = !communicates || stage == 0
                          ? 0.0
                          : timed([&] { comm.allgather(own, lim_out.data(), block, t); });
    if (!keep) return;
    t_step.push_back(st);
    t_reduce.push_back(rd);
    t_update.push_back(up);
    t_gather.push_back(ga);
  };
  for (int i = 0; i < o.warmup; ++i) iteration(false);
  for (int i = 0; i < o.iters; ++i) iteration(true);

  DeviceRow r;
  r.stage = stage;
  r.dtype = t;
  r.params = psi;
  r.iters = o.iters;
  r.step = report::stats_of(t_step);
  r.l_reduce = report::stats_of(t_reduce);
  r.l_update = report::stats_of(t_update);
  r.l_gather = report::stats_of(t_gather);
  r.limit_us = r.l_reduce.median_us + r.l_update.median_us + r.l_gather.median_us;
  std::vector<std::byte> back(psi * es);
  shardopt::device_copy(back.data(), dparams.data(), back.size());
  const std::uint64_t h = report::fnv1a(back.data(), back.size());
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, timing);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, timing);
  r.same = lo == hi;
  return r;
}

}  // namespace

int run_device(const Options& o, shardopt::Communicator& comm, MPI_Comm timing) {
  const bool printer = comm.rank() == 0;
  if (printer && !o.json) {
    std::printf("# %s --device cuda: a ZeRO step (%s) on device buffers beside its limit\n",
                kProgram, o.optimizer->name);
    std::printf("# device runtime %s, device collectives %s, %d ranks, %d iterations\n",
                shardopt::device_runtime_name(), comm.device_backend_name(), comm.size(), o.iters);
    std::printf(
        "# step: the step until the device has finished it; limit = reduce + update + gather:\n"
        "#   this communicator's own collectives on device buffers of the same sizes, and the\n"
        "#   functional optimizer on the shard; medians of the slowest rank (us);\n"
        "#   ratio = step / limit (goal: stage %d <= %.1f)\n",
        kTimeGoalStage, kDeviceGoalRatio);
    std::printf("# %5s %5s %9s %11s %11s %11s %11s %11s %7s %5s\n", "stage", "dtype", "params",
                "step", "reduce", "update", "gather", "limit", "ratio", "same");
  }
  bool all_same = true, goal_met = true, goal_seen = false;
  for (std::size_t psi : o.params) {
    for (DType t : o.dtypes) {
      for (int stage : o.stages) {
        const DeviceRow r = run_row(o, comm, timing, psi, t, stage);
        all_same = all_same && r.same;
        if (stage == kTimeGoalStage) {
          goal_seen = true;
          goal_met = goal_met && r.ratio() <= kDeviceGoalRatio;
        }
        if (!printer) continue;
        if (o.json) {
          std::printf(
              "{\"memory\":\"device\",\"runtime\":\"%s\",\"device_comm\":\"%s\",\"stage\":%d,"
              "\"dtype\":\"%s\",\"ranks\":%d,\"params\":%zu,\"iters\":%d,\"step_us\":%.3f,"
              "\"reduce_us\":%.3f,\"update_us\":%.3f,\"gather_us\":%.3f,\"limit_us\":%.3f,"
              "\"ratio\":%.4f,\"same\":%s}\n",
              shardopt::device_runtime_name(), comm.device_backend_name(), r.stage,
              shardopt::dtype_name(r.dtype), comm.size(), r.params, r.iters, r.step.median_us,
              r.l_reduce.median_us, r.l_update.median_us, r.l_gather.median_us, r.limit_us,
              r.ratio(), r.same ? "true" : "false");
        } else {
          std::printf("  %5d %5s %9s %11.1f %11.1f %11.1f %11.1f %11.1f %7.3f %5s\n", r.stage,
                      shardopt::dtype_name(r.dtype), cli::human_count(r.params).c_str(),
                      r.step.median_us, r.l_reduce.median_us, r.l_update.median_us,
                      r.l_gather.median_us, r.limit_us, r.ratio(), r.same ? "yes" : "NO");
        }
        std::fflush(stdout);
      }
    }
  }
  if (printer && !o.json && goal_seen) {
    std::printf("# goal (stage %d step <= %.1f x its limit): %s\n", kTimeGoalStage,
                kDeviceGoalRatio, goal_met ? "met" : "NOT met");
  }
  if (!all_same && printer)
    std::fprintf(stderr, "%s: the ranks' parameters differ after the steps\n", kProgram);
  return all_same ? 0 : 1;
}

}  // namespace bench_step
