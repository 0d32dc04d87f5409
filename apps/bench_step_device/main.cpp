// shardopt-bench-step-device: a ZeRO step on device buffers beside the same
// step on host buffers, measured in the same run, one step of each in turn.
// The limit it chases is 1.5 times the host step: on the simulated device of
// the test builds (shardopt-bench-step-sim, where the device's kernels are
// the host's, run by stream threads) the device path may cost its
// orchestration and no more. On a GPU the device step should be far below
// the host one; the ratio then says by how much.
//
//   mpirun -n 2 shardopt-bench-step-device --params 4M -n 10
//
// Prints, per stage and dtype: the host step, the device step, the limit and
// ratio = limit / device step (>= 1: the goal is met), and whether the
// parameters of the two runs are bitwise equal after the same steps (they
// are at 2 ranks; with more, MPI may sum a staged chunk in another order
// than the whole bucket, so random data can differ in the last bit).
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../support/bench_mpi.hpp"
#include "../support/cli.hpp"
#include "../support/report.hpp"
#include "shardopt/shardopt.hpp"

namespace {

constexpr const char* kProgram = "shardopt-bench-step-device";
constexpr double kLimitFactor = 1.5;

struct Options {
  std::size_t params = std::size_t{4} << 20;
  int iters = 10;
  int warmup = 2;
  bool json = false;
  bool help = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw cli::UsageError{"option " + a + " needs a value"};
      return argv[++i];
    };
    if (a == "--params" || a == "-p") {
      const auto v = cli::parse_scaled(value(), std::uint64_t{1} << 34);
      if (!v || *v == 0) throw cli::UsageError{"bad value for " + a + ": a count, K or M suffix"};
      o.params = static_cast<std::size_t>(*v);
    } else if (a == "--iters" || a == "-n") {
      o.iters = cli::parse_int(a, value(), 1, 100000, "an integer >= 1");
    } else if (a == "--warmup" || a == "-w") {
      o.warmup = cli::parse_int(a, value(), 0, 100000, "an integer >= 0");
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--help" || a == "-h") {
      o.help = true;
    } else {
      throw cli::UsageError{"unknown option " + a +
                            "; accepted: --params N, --iters N, --warmup N, --json"};
    }
  }
  return o;
}

// Deterministic values in [lo, hi), the same on every rank for `key`.
void fill(std::vector<float>& v, std::uint64_t key, float lo, float hi) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint64_t x = key * 0x9E3779B97F4A7C15ull + i;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    v[i] = lo + (hi - lo) * static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
  }
}

// The values of `v` as `t` (f32 or bf16) bytes.
std::vector<std::byte> as_type(const std::vector<float>& v, shardopt::DType t) {
  std::vector<std::byte> out(v.size() * shardopt::dtype_size(t));
  shardopt::cast(v.data(), shardopt::DType::f32, out.data(), t, v.size());
  return out;
}

int run(int argc, char** argv) {
  const bench_mpi::World w = bench_mpi::world();
  Options o;
  const auto stop = bench_mpi::parse_or_stop(
      kProgram, w.rank, o, [&] { return parse(argc, argv); },
      "usage: shardopt-bench-step-device [--params N] [--iters N] [--warmup N] [--json]\n"
      "\n"
      "Times a ZeRO step (AdamW, stages 0, 1, 2, f32 and bf16) on device buffers beside the\n"
      "same step on host buffers, alternately; the limit is 1.5 x the host step.\n"
      "  -p, --params N   parameters in 4 tensors (default 4M; K, M suffixes)\n"
      "  -n, --iters N    timed steps of each (default 10)\n"
      "  -w, --warmup N   untimed steps of each first (default 2)\n"
      "      --json       one JSON object per row\n");
  if (stop) return *stop;
  return bench_mpi::run_or_abort(kProgram, w.rank, bench_mpi::Hint::omitted, [&] {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    if (w.rank == 0 && !o.json) {
      std::printf("# %s: a ZeRO step (AdamW) on device buffers beside the same on host buffers\n",
                  kProgram);
      std::printf(
          "# device runtime %s, device collectives %s, %d ranks, %zu parameters in 4 tensors, "
          "%d iterations\n",
          shardopt::device_runtime_name(), comm.device_backend_name(), w.ranks, o.params, o.iters);
      std::printf(
          "# host, device: median of the slowest rank (us); limit = %.1f x host; ratio "
          "= limit / device (goal >= 1)\n",
          kLimitFactor);
      std::printf("# %5s %5s %12s %12s %12s %7s %6s\n", "stage", "dtype", "host", "device", "limit",
                  "ratio", "equal");
    }
    const std::size_t sizes[4] = {o.params / 2, o.params / 4, o.params / 8,
                                  o.params - o.params / 2 - o.params / 4 - o.params / 8};
    for (int stage = 0; stage <= 2; ++stage) {
      for (shardopt::DType t : {shardopt::DType::f32, shardopt::DType::bf16}) {
        const std::size_t es = shardopt::dtype_size(t);
        std::vector<float> p0(o.params), g0(o.params);
        fill(p0, 1, -1.0f, 1.0f);
        fill(g0, 100 + static_cast<std::uint64_t>(w.rank), -1e-2f, 1e-2f);
        const std::vector<std::byte> pb = as_type(p0, t), gb = as_type(g0, t);
        std::vector<std::byte> hp(pb), hg(gb);
        shardopt::DeviceBuffer dp(pb.size()), dg(gb.size());
        shardopt::device_copy(dp.data(), pb.data(), pb.size());
        shardopt::device_copy(dg.data(), gb.data(), gb.size());
        std::vector<shardopt::Param> hparams, dparams;
        std::size_t at = 0;
        for (std::size_t k = 0; k < 4; ++k) {
          char name[16];
          std::snprintf(name, sizeof name, "t%zu", k);
          hparams.push_back({.name = name,
                             .data = hp.data() + at * es,
                             .numel = sizes[k],
                             .dtype = t,
                             .grad = hg.data() + at * es});
          dparams.push_back({.name = name,
                             .data = static_cast<std::byte*>(dp.data()) + at * es,
                             .numel = sizes[k],
                             .dtype = t,
                             .grad = static_cast<std::byte*>(dg.data()) + at * es});
          at += sizes[k];
        }
        shardopt::ZeroOptions zo;
        zo.stage = stage;
        const shardopt::AdamW adamw{.lr = 1e-3, .weight_decay = 0.01};
        shardopt::ZeroRedundancyOptimizer host(comm, hparams, adamw, zo);
        shardopt::ZeroRedundancyOptimizer dev(comm, dparams, adamw, zo);
        // Each step reduces the gradients as they are (never re-marked):
        // both runs see the same values, and the timing the same work.
        std::byte probe[4];
        const auto once = [&](bool on_device) {
          MPI_Barrier(MPI_COMM_WORLD);
          const double t0 = MPI_Wtime();
          if (on_device) {
            dev.step();
            shardopt::device_copy(probe, dp.data(), sizeof probe);  // the device is done
          } else {
            host.step();
          }
          double dt = MPI_Wtime() - t0;
          MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          return dt;
        };
        for (int i = 0; i < o.warmup; ++i) {
          once(false);
          once(true);
        }
        std::vector<double> th, td;
        for (int i = 0; i < o.iters; ++i) {
          th.push_back(once(false));
          td.push_back(once(true));
        }
        std::vector<std::byte> back(pb.size());
        shardopt::device_copy(back.data(), dp.data(), back.size());
        int equal = std::memcmp(back.data(), hp.data(), back.size()) == 0 ? 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &equal, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        const report::Stats sh = report::stats_of(th), sd = report::stats_of(td);
        const double limit = kLimitFactor * sh.median_us;
        const double ratio = sd.median_us > 0 ? limit / sd.median_us : 0;
        if (w.rank == 0) {
          if (o.json)
            std::printf(
                "{\"stage\":%d,\"dtype\":\"%s\",\"ranks\":%d,\"params\":%zu,"
                "\"host_us\":%.3f,\"device_us\":%.3f,\"limit_us\":%.3f,\"ratio\":%.4f,"
                "\"equal\":%s,\"memory\":\"device\",\"runtime\":\"%s\"}\n",
                stage, shardopt::dtype_name(t), w.ranks, o.params, sh.median_us, sd.median_us,
                limit, ratio, equal ? "true" : "false", shardopt::device_runtime_name());
          else
            std::printf("  %5d %5s %12.1f %12.1f %12.1f %7.3f %6s\n", stage,
                        shardopt::dtype_name(t), sh.median_us, sd.median_us, limit, ratio,
                        equal ? "yes" : "no");
          std::fflush(stdout);
        }
      }
    }
    comm.free();
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  // The staged backend (and the simulated device's collectives) run MPI
  // on threads of their own: MPI_THREAD_MULTIPLE.
  return cli::run_with_mpi(kProgram, argc, argv, run, shardopt::ThreadLevel::multiple);
}
