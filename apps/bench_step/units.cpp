// shardopt-bench-step -s 3 (units.hpp).
//
// The model: mlp_layout's tensors, each block (norm, fc1, fc2) a unit and
// the head one more, parameters in one buffer, gradients in another. A
// step, as a training loop runs it: the forward pass, unit by unit, runs a
// memory-bound loop over --compute-mb MiB (each float read and written);
// the backward pass, from the last unit, runs it again and hands over the
// unit's gradients (grad_ready(i, grad), streamed); then step(). At stage 3
// each unit is gathered before its loop and released after (the engine
// prefetches the next ones from the second step on); at stage 2 nothing is
// gathered and step() allgathers the parameters. Both stages run over the
// same parameters in the same iterations, in an order drawn at random.
//
// The limit, measured in the same iterations with raw MPI on the same
// sizes: for each unit and pass, the larger of the loop alone and the
// unit's communication (forward: MPI_Allgather of the unit; backward: that
// and MPI_Reduce_scatter_block of its gradients; at stage 2 the
// reduce-scatter alone), summed, plus the update as step() measured it
// (StepInfo::update_seconds), plus at stage 2 the parameters' allgather.
// Exposed gather: the time the step spent inside gather() calls, beside
// the raw allgathers' time (each unit twice).
#include "units.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../support/bench_mpi.hpp"
#include "../support/cli.hpp"
#include "../support/report.hpp"
#include "bench.hpp"
#include "shardopt/zero.hpp"

namespace bench_step {
namespace {

using report::Stats;

struct Unit {
  std::size_t first = 0, end = 0;  // tensors
  std::size_t begin = 0, numel = 0;
};

// The forward and backward passes' compute: every float of x read and
// written once.
void memory_loop(float* x, std::size_t n) {
  for (std::size_t k = 0; k < n; ++k) x[k] = x[k] * 0.999f + 0.001f;
}

struct StageRow {
  int stage = 0;
  Stats step, update;
  double limit_us = 0;
  // Stage 3: medians of the time inside gather() and the first data(), the
  // slowest rank's (the goal's) and the least rank's: a rank waits there
  // for the other ranks too, and the one that arrives last for the bytes
  // alone.
  double exposed_us = 0, exposed_least_us = 0;
  std::int64_t ahead = 0, gathers = 0;
  double ratio() const { return limit_us > 0 ? step.median_us / limit_us : 0; }
};

double sum_of(const std::vector<double>& medians) {
  double s = 0;
  for (double m : medians) s += m;
  return s;
}

}  // namespace

int run_units(const Options& o, shardopt::Communicator& comm, MPI_Comm raw, MPI_Comm timing) {
  const int rank = comm.rank(), nranks = comm.size();
  const auto n = static_cast<std::size_t>(nranks);
  const bool printer = rank == 0;
  std::FILE* text = o.json ? stderr : stdout;
  const std::size_t loop_n = static_cast<std::size_t>(o.compute_mb * (1 << 20)) / 4;
  shardopt::HostBuffer work(std::max<std::size_t>(loop_n, 1) * 4);
  // --compute sleep: the loop's median time over 9 runs, slept instead.
  std::vector<double> loop_s;
  for (int k = 0; k < 9 && o.compute_sleep; ++k) {
    const double t0 = MPI_Wtime();
    memory_loop(work.as<float>(), loop_n);
    loop_s.push_back(MPI_Wtime() - t0);
  }
  std::sort(loop_s.begin(), loop_s.end());
  const std::chrono::duration<double> nap(loop_s.empty() ? 0.0 : loop_s[loop_s.size() / 2]);
  const auto compute = [&] {
    if (o.compute_sleep)
      std::this_thread::sleep_for(nap);
    else
      memory_loop(work.as<float>(), loop_n);
  };
  if (printer) {
    std::fprintf(text,
                 "# stage 3 against stage 2, %d ranks: each unit's forward and backward compute "
                 "a loop over %g MiB (read and written)%s\n"
                 "#   limit: per unit and pass the larger of the loop and the unit's raw MPI "
                 "communication, summed, plus the update (stage 2: plus the allgather)\n"
                 "#   exposed: the time inside gather() and the first data(), the slowest rank's "
                 "(least: the least rank's, which waits for the bytes and not for other ranks), "
                 "beside the raw allgathers' (2 per unit); goals: step <= %.1f x limit, exposed <= "
                 "%.0f%% where the loop is at "
                 "least the largest unit's allgather\n",
                 nranks, o.compute_mb,
                 o.compute_sleep ? ", slept instead of run (--compute sleep)" : "", kUnitsGoalRatio,
                 100 * kExposedGoal);
    std::fprintf(text, "# %5s %5s %9s %5s %9s %9s %9s %9s %6s %9s %9s %8s %6s\n", "stage", "dtype",
                 "params", "units", "loop", "gather", "step", "limit", "ratio", "exposed", "least",
                 "exp/gat", "ahead");
    std::fprintf(text, "# %5s %5s %9s %5s %9s %9s %9s %9s %6s %9s %9s %8s %6s\n", "", "", "", "",
                 "(ms)", "(ms/unit)", "(ms)", "(ms)", "", "(ms)", "(ms)", "", "");
  }
  bool differ = false, met = true;
  std::mt19937_64 order(777);
  for (std::size_t psi : o.params) {
    const std::vector<Tensor> layout = mlp_layout(psi);
    std::vector<Unit> units;
    std::vector<int> unit_of;
    std::size_t flat = 0;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      const std::string& name = layout[i].name;
      const std::string prefix = name.substr(0, name.find('.'));
      if (units.empty() || prefix != layout[units.back().first].name.substr(
                                         0, layout[units.back().first].name.find('.')))
        units.push_back({i, i, flat, 0});
      units.back().end = i + 1;
      units.back().numel += layout[i].numel;
      unit_of.push_back(static_cast<int>(units.size()) - 1);
      flat += layout[i].numel;
    }
    for (DType t : o.dtypes) {
      const std::size_t es = shardopt::dtype_size(t);
      shardopt::HostBuffer params(psi * es), grads(psi * es);
      Bench::fill_values(params.data(), t, psi, bench::mix64(kSeed), -1.0f, 1.0f);
      Bench::fill_values(grads.data(), t, psi,
                         bench::mix64(kSeed + 1 + static_cast<unsigned>(rank)), -1e-2f, 1e-2f);
      std::vector<shardopt::Param> ps;
      std::size_t off = 0;
      for (std::size_t i = 0; i < layout.size(); ++i) {
        shardopt::Param p;
        p.name = layout[i].name;
        p.data = params.as<unsigned char>() + off * es;
        p.numel = layout[i].numel;
        p.dtype = t;
        p.unit = unit_of[i];
        ps.push_back(std::move(p));
        off += layout[i].numel;
      }
      shardopt::ZeroOptions z;
      z.bucket_mb = o.bucket_mb;
      z.stream_grads = true;
      z.stage = 3;
      shardopt::ZeroRedundancyOptimizer three(comm, ps, engine_config(*o.optimizer), z);
      z.stage = 2;
      shardopt::ZeroRedundancyOptimizer two(comm, ps, engine_config(*o.optimizer), z);
      const auto grad_of = [&](std::size_t i) {
        return grads.as<unsigned char>() +
               (static_cast<const unsigned char*>(ps[i].data) - params.as<unsigned char>());
      };

      // The raw collectives' buffers: the largest unit, and the model.
      std::size_t most = 0;
      for (const Unit& u : units) most = std::max(most, (u.numel + n - 1) / n);
      const std::size_t whole = (psi + n - 1) / n;
      shardopt::HostBuffer ag(n * std::max(most, whole) * es), rs_in(n * most * es),
          rs_out(most * es);
      const MPI_Datatype mt = bench_mpi::raw_mpi_type(t);
      const auto timed = [&](auto&& fn) {
        MPI_Barrier(timing);
        const double t0 = MPI_Wtime();
        fn();
        return MPI_Wtime() - t0;
      };

      const std::size_t nu = units.size();
      // Per iteration: 0 step3, 1 update3, 2 exposed3, 3 step2, 4 update2,
      // 5 loop, 6 model allgather, then each unit's allgather and
      // reduce-scatter.
      const std::size_t parts = 7 + 2 * nu;
      std::vector<double> sample(parts);
      shardopt::StepInfo info3, info2;
      const auto step3 = [&] {
        double exposed = 0;
        sample[0] = timed([&] {
          for (int backward = 0; backward < 2; ++backward)
            for (std::size_t k = 0; k < nu; ++k) {
              const std::size_t u = backward ? nu - 1 - k : k;
              const double g0 = MPI_Wtime();
              three.gather(u);
              // The wait for a prefetched unit's bytes, where the code
              // first reads them.
              (void)three.data(units[u].first);
              exposed += MPI_Wtime() - g0;
              compute();
              if (backward)
                for (std::size_t i = units[u].end; i-- > units[u].first;)
                  three.grad_ready(i, grad_of(i));
              three.release(u);
            }
          info3 = three.step();
        });
        sample[1] = info3.update_seconds;
        sample[2] = exposed;
      };
      const auto step2 = [&] {
        sample[3] = timed([&] {
          for (int backward = 0; backward < 2; ++backward)
            for (std::size_t k = 0; k < nu; ++k) {
              const std::size_t u = backward ? nu - 1 - k : k;
              compute();
              if (backward)
                for (std::size_t i = units[u].end; i-- > units[u].first;)
                  two.grad_ready(i, grad_of(i));
            }
          info2 = two.step();
        });
        sample[4] = info2.update_seconds;
      };
      const auto limits = [&] {
        sample[5] = timed(compute);
        sample[6] = timed([&] {
          MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ag.data(), static_cast<int>(whole), mt,
                        raw);
        });
        for (std::size_t u = 0; u < nu; ++u) {
          const int per = static_cast<int>((units[u].numel + n - 1) / n);
          sample[7 + u] = timed(
              [&] { MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ag.data(), per, mt, raw); });
          sample[7 + nu + u] = timed([&] {
            MPI_Reduce_scatter_block(rs_in.data(), rs_out.data(), per, mt, MPI_SUM, raw);
          });
        }
      };
      const auto iteration = [&] {
        int what[] = {0, 1, 2};
        std::shuffle(std::begin(what), std::end(what), order);
        for (int w : what) {
          if (w == 0) step3();
          if (w == 1) step2();
          if (w == 2) limits();
        }
      };
      for (int i = 0; i < o.warmup; ++i) iteration();
      const auto iters = static_cast<std::size_t>(o.iters);
      std::vector<double> all(parts * iters), least(iters);
      std::int64_t ahead = 0, gathers = 0;
      for (std::size_t i = 0; i < iters; ++i) {
        iteration();
        for (std::size_t p = 0; p < parts; ++p) all[p * iters + i] = sample[p];
        least[i] = sample[2];
        ahead += info3.gathers_ahead;
        gathers += info3.gathers;
      }
      MPI_Allreduce(MPI_IN_PLACE, all.data(), static_cast<int>(all.size()), MPI_DOUBLE, MPI_MAX,
                    timing);
      MPI_Allreduce(MPI_IN_PLACE, least.data(), static_cast<int>(least.size()), MPI_DOUBLE, MPI_MIN,
                    timing);
      const auto part = [&](std::size_t p) {
        return report::stats_of(
            std::vector<double>(all.begin() + p * iters, all.begin() + (p + 1) * iters));
      };
      const double loop_us = part(5).median_us, model_ag_us = part(6).median_us;
      std::vector<double> ag_us(nu), rs_us(nu);
      double most_ag = 0;
      for (std::size_t u = 0; u < nu; ++u) {
        ag_us[u] = nranks > 1 ? part(7 + u).median_us : 0;
        rs_us[u] = nranks > 1 ? part(7 + nu + u).median_us : 0;
        most_ag = std::max(most_ag, ag_us[u]);
      }
      StageRow r3, r2;
      r3.stage = 3;
      r3.step = part(0);
      r3.update = part(1);
      r3.exposed_us = part(2).median_us;
      r3.exposed_least_us = report::stats_of(least).median_us;
      r3.ahead = ahead;
      r3.gathers = gathers;
      r2.stage = 2;
      r2.step = part(3);
      r2.update = part(4);
      for (std::size_t u = 0; u < nu; ++u) {
        r3.limit_us += std::max(loop_us, ag_us[u]) + std::max(loop_us, ag_us[u] + rs_us[u]);
        r2.limit_us += loop_us + std::max(loop_us, rs_us[u]);
      }
      r3.limit_us += r3.update.median_us;
      r2.limit_us += r2.update.median_us + (nranks > 1 ? model_ag_us : 0);
      const double gathers_us = 2 * sum_of(ag_us);

      // The same parameters at both stages after the same steps.
      bool same = true;
      for (std::size_t u = 0; u < nu; ++u) {
        three.gather(u);
        for (std::size_t i = units[u].first; i < units[u].end; ++i)
          same = same && std::memcmp(three.data(i), two.data(i), ps[i].numel * es) == 0;
        three.release(u);
      }
      same = shardopt::all_ranks(comm, same);
      differ = differ || !same;

      const shardopt::MemoryReport m3 = three.memory_report();
      const double state = 4.0 * static_cast<double>(o.optimizer->states.size() +
                                                     (o.optimizer->scratch != nullptr ? 1 : 0));
      const double formula3 =
          shardopt::zero_memory_formula(3, static_cast<double>(psi), nranks, t, state);
      const bool compute_bound = loop_us >= most_ag;
      const double exposed_share = gathers_us > 0 ? r3.exposed_us / gathers_us : 0;
      const bool row_met = r3.ratio() <= kUnitsGoalRatio &&
                           (!compute_bound || nranks == 1 || exposed_share <= kExposedGoal);
      met = met && row_met;
      if (!printer) continue;
      for (const StageRow* r : {&r2, &r3}) {
        const bool s3 = r->stage == 3;
        if (o.json) {
          std::printf(
              "{\"mode\":\"units\",\"stage\":%d,\"ranks\":%d,\"params\":%zu,\"dtype\":\"%s\","
              "\"units\":%zu,\"compute_mb\":%g,\"compute\":\"%s\",\"loop_us\":%.1f,"
              "\"gather_unit_us\":%.1f,"
              "\"step_us\":%.1f,\"step_min_us\":%.1f,\"step_max_us\":%.1f,\"update_us\":%.1f,"
              "\"limit_us\":%.1f,\"ratio\":%.4f,\"exposed_us\":%.1f,\"exposed_least_us\":%.1f,"
              "\"gathers_us\":%.1f,"
              "\"gathers_ahead\":%lld,\"gathers\":%lld,\"same_params\":%s}\n",
              r->stage, nranks, psi, shardopt::dtype_name(t), nu, o.compute_mb,
              o.compute_sleep ? "sleep" : "loop", loop_us, sum_of(ag_us) / static_cast<double>(nu),
              r->step.median_us, r->step.min_us, r->step.max_us, r->update.median_us, r->limit_us,
              r->ratio(), s3 ? r->exposed_us : 0.0, s3 ? r->exposed_least_us : 0.0,
              s3 ? gathers_us : 0.0, static_cast<long long>(r->ahead),
              static_cast<long long>(r->gathers), same ? "true" : "false");
        }
        std::fprintf(
            text, "  %5d %5s %9s %5zu %9.2f %9.2f %9.2f %9.2f %6.2f %9s %9s %8s %6s\n", r->stage,
            shardopt::dtype_name(t), cli::human_count(psi).c_str(), nu, loop_us / 1e3,
            sum_of(ag_us) / static_cast<double>(nu) / 1e3, r->step.median_us / 1e3,
            r->limit_us / 1e3, r->ratio(),
            s3 ? std::to_string(r->exposed_us / 1e3).substr(0, 6).c_str() : "-",
            s3 ? std::to_string(r->exposed_least_us / 1e3).substr(0, 6).c_str() : "-",
            s3 ? std::to_string(exposed_share).substr(0, 5).c_str() : "-",
            s3 ? (std::to_string(r->ahead) + "/" + std::to_string(r->gathers)).c_str() : "-");
      }
      std::fprintf(
          text,
          "#   stage 3 memory on rank 0 (MiB): %.1f allocated (param shard %.1f, gather "
          "pool %.1f, whole units %.2f, buckets %.1f), formula %.1f; parameters %s "
          "stage 2's\n",
          mib(static_cast<double>(m3.allocated())), mib(static_cast<double>(m3.param_shard)),
          mib(static_cast<double>(m3.gather_pool)), mib(static_cast<double>(m3.persistent_params)),
          mib(static_cast<double>(m3.buckets)), mib(formula3),
          same ? "equal to" : "DIFFERENT from");
      if (!compute_bound && nranks > 1)
        std::fprintf(text,
                     "#   the loop (%.2f ms) is shorter than the largest unit's allgather (%.2f "
                     "ms): the exposed-gather goal does not apply\n",
                     loop_us / 1e3, most_ag / 1e3);
    }
  }
  if (printer)
    std::fprintf(text, "# goal (stage 3 step <= %.1f x its limit, exposed gather <= %.0f%%): %s\n",
                 kUnitsGoalRatio, 100 * kExposedGoal, met ? "met" : "NOT met");
  return differ ? 1 : 0;
}

}  // namespace bench_step
