// shardopt-plan: memory per rank (shardopt::plan_memory, the engine's own
// layout and buffer sizes), the step's time from the machine's rates, the
// largest model that fits, and the advice.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "plan/plan.hpp"
#include "shardopt/config.hpp"
#include "support/optim_steps.hpp"

namespace plan {

namespace {

using shardopt::DType;

std::size_t gather_limit_bytes(const Options& o) {
  return static_cast<std::size_t>(o.gather_limit_mb * 1024.0 * 1024.0);
}

// The engine's inputs for the tensors and units of `m`: the model, or the
// flat model of the largest one (load_model's and flat_model's cuts).
shardopt::MemoryPlan memory_plan(const Options& o, const Plan& p, int stage, const Model& m) {
  shardopt::MemoryPlan plan;
  plan.numel = m.numel;
  // The same units at every stage: they end buckets at stages 0-2 too, so
  // the plan of stages 0-2 is that of a run registering them.
  plan.units = m.units;
  plan.dtype = p.dtype;
  plan.groups = {p.optimizer};
  plan.options.stage = stage;
  plan.options.bucket_mb = o.bucket_mb;
  plan.options.reduce_in_fp32 = o.reduce_fp32;
  plan.options.param_remainders = o.remainders;
  // Streamed gradients are stages 2 and 3's; stages 0 and 1 keep owned ones.
  plan.options.stream_grads = o.grads == GradMode::stream && stage >= 2;
  plan.options.gather_limit_bytes = gather_limit_bytes(o);
  plan.options.persist_below_bytes = static_cast<std::size_t>(o.persist_below_kb * 1024.0);
  plan.ranks = o.nodes * o.ranks_per_node;
  plan.rank = 0;  // every rank's shard has the same size
  plan.nodes = o.nodes;
  plan.device = o.device;
  plan.user_grads = o.grads == GradMode::user;
  plan.contiguous = !o.separate;
  plan.threads = o.threads;
  return plan;
}

// The gather limit asked must hold the largest unit gathered (the engine
// refuses it otherwise); said here in the command line's words. The limit
// counts each unit rounded up to 256 bytes.
void check_gather_limit(const Options& o, const std::vector<shardopt::LayoutPlan::Unit>& units) {
  const std::size_t limit = (gather_limit_bytes(o) + 255) / 256 * 256;
  if (limit == 0) return;
  for (std::size_t u = 0; u < units.size(); ++u)
    if (!units[u].persistent && units[u].bytes > limit) {
      char b[320];
      std::snprintf(b, sizeof b,
                    "--gather-limit-mb %g is below unit %zu's %.3f MiB (gathered whole, to its "
                    "last bucket's padding): raise it to %.3f or more, or give 0 for the "
                    "automatic pool",
                    o.gather_limit_mb, u, double(units[u].bytes) / 1048576.0,
                    std::ceil(double(units[u].bytes) / 1048576.0 * 1000.0) / 1000.0);
      throw InputError{b};
    }
}

std::size_t per_rank(const shardopt::MemoryReport& r) {
  return r.allocated() + r.user_params + r.user_grads;
}

// The benchmarks' precision of the update (optim_steps.hpp): the gradient
// it reads (stage 2: the fp32 shard) and the copy it writes.
const bench::Precision& precision_of(DType dtype, bool remainders, bool fp32_grads) {
  const char* name = dtype == DType::f32    ? "fp32"
                     : remainders           ? "bf16-rem"
                     : fp32_grads           ? (dtype == DType::bf16 ? "fp32-bf16" : "f16")
                     : dtype == DType::bf16 ? "bf16"
                                            : "f16";
  for (const bench::Precision& q : bench::kPrecisions)
    if (std::string(q.name) == name) return q;
  return bench::kPrecisions[0];
}

const bench::OptimizerEntry& entry_of(const std::string& key) {
  for (const bench::OptimizerEntry& e : bench::optimizers())
    if (key == e.name) return e;
  return bench::optimizers().front();
}

// The largest flat model whose per-rank memory fits in `memory`, by
// bisection on plan_memory (monotone in the parameter count). With --units,
// or at stage 3, the flat model is cut as -p cuts it, into as many tensors
// of near-equal size as the model has units (each its own unit), so that
// stage 3 gathers it in as many pieces as the model.
std::uint64_t largest(const Options& o, const Plan& p, int stage) {
  const bool cut = o.unit_count > 0 || !o.unit_list.empty() || stage == 3;
  const std::size_t parts = cut ? p.units : 1;
  const auto fits = [&](std::uint64_t n) {
    const shardopt::MemoryPlan plan = memory_plan(o, p, stage, flat_model(o, n, parts));
    // A unit past --gather-limit-mb: the engine would refuse the model.
    if (stage == 3 && o.gather_limit_mb > 0) {
      try {
        check_gather_limit(o, shardopt::plan_layout(plan).units);
      } catch (const InputError&) {
        return false;
      }
    }
    return per_rank(shardopt::plan_memory(plan)) <= o.memory;
  };
  if (!fits(parts)) return 0;
  std::uint64_t lo = parts, hi = 2 * parts;
  while (fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  // To within 0.1%: a few dozen layouts at most.
  while (hi - lo > std::max<std::uint64_t>(1, lo / 1000)) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return b;
}
std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f ms", s * 1e3);
  return b;
}

}  // namespace

Plan estimate(const Options& o) {
  Plan p;
  p.model = load_model(o);
  p.dtype = o.dtype ? *o.dtype : p.model.dtype ? *p.model.dtype : DType::f32;
  p.optimizer_key = !o.optimizer.empty() ? o.optimizer
                    : !p.model.optimizer.empty() && p.model.optimizer != "custom"
                        ? p.model.optimizer
                        : "adam";
  const auto opt = optimizer_of(p.optimizer_key);
  if (!opt)
    throw InputError{"the file's optimizer '" + p.optimizer_key +
                     "' is not one shardopt-plan knows; name one with -o"};
  p.optimizer = *opt;
  p.bucket_mb = o.bucket_mb > 0 ? o.bucket_mb : shardopt::settings().bucket_mb;
  const int ranks = o.nodes * o.ranks_per_node, local = o.ranks_per_node;
  p.timed = !o.comm_files.empty() || o.net_gbps > 0 || o.node_gbps > 0 || o.mem_gbps > 0 ||
            !o.optim_file.empty();
  if (p.timed)
    p.machine = load_machine(o, p.optimizer, precision_of(p.dtype, o.remainders, false).name);
  const auto hop_needed = [&](const Hop& h, const char* what, const char* fix) {
    if (!h.known) throw InputError{std::string("the step's time needs ") + what + ": " + fix};
  };
  if (p.timed) {
    if (local > 1) {
      hop_needed(p.machine.reduce_scatter.node, "the rates within a node",
                 "give -c with a one-node shardopt-bench-comm file, or --node-gbps");
    }
    if (o.nodes > 1)
      hop_needed(p.machine.reduce_scatter.net, "the network's rates",
                 "give -c with a several-node shardopt-bench-comm file, or --net-gbps");
    if (p.machine.update_gbps <= 0)
      throw InputError{
          "the step's time needs the update's rate: give -u with a "
          "shardopt-bench-optim --json file, or --mem-gbps"};
  }
  const bool host_shm = !o.device && ranks > 1 && o.nodes == 1 &&
                        shardopt::settings().host_comm != shardopt::HostComm::mpi;
  if (!o.device && local > 1 && shardopt::settings().host_comm != shardopt::HostComm::mpi)
    p.shm_per_node = 2 * 2 * shardopt::settings().shm_chunk_kb * 1024 * std::size_t(local);

  const bench::OptimizerEntry& entry = entry_of(p.optimizer_key);
  const DType reduce_type = (o.reduce_fp32 || p.dtype == DType::f32) ? DType::f32 : p.dtype;
  const std::size_t elem = shardopt::dtype_size(p.dtype), rsize = shardopt::dtype_size(reduce_type);
  p.units = count_units(p.model.units, p.model.numel.size());
  for (int stage : o.stages) {
    StageEstimate e;
    e.stage = stage;
    const shardopt::MemoryPlan plan = memory_plan(o, p, stage, p.model);
    // The buckets and the shard, as the engine cuts them.
    const shardopt::LayoutPlan layout = shardopt::plan_layout(plan);
    check_gather_limit(o, layout.units);  // stage 3's units; none at stages 0-2
    e.memory = shardopt::plan_memory(plan);
    e.per_rank = per_rank(e.memory);
    const std::vector<std::size_t>& buckets = layout.buckets;
    const std::size_t shard = layout.shard;
    e.buckets = buckets.size();
    e.update_elements = layout.storage;
    if (o.memory > 0) e.largest = largest(o, p, stage);
    // Stage 2's fused step (stage 3 reduces as stage 2): one node's shared
    // memory, host gradients the engine can read whole (shardopt/zero.hpp;
    // GradReducer).
    e.fused = stage >= 2 && host_shm && o.grads != GradMode::stream && !o.reduce_fp32 &&
              shardopt::settings().fused_update && p.optimizer_key != "lamb";
    const bench::Precision& prec = precision_of(p.dtype, o.remainders, stage >= 2 || o.reduce_fp32);
    e.update_bytes_per_param = double(bench::bytes_per_param(entry, prec));
    // Fused: every rank's gradients read instead of the reduced fp32 shard;
    // the user's (not in shared memory) are first copied by the kernel
    // into a slice in cache and read from there.
    if (e.fused)
      e.update_bytes_per_param +=
          double(ranks) * double(elem) - 4.0 +
          (o.grads == GradMode::user ? 2.0 * double(ranks - 1) * double(elem) : 0.0);
    if (!p.timed) {
      p.stages.push_back(e);
      continue;
    }
    const Machine& m = p.machine;
    // The reduction: per bucket a reduce-scatter (stages 0, 1: and the
    // allgather of the reduced gradients); stage 2's (and 3's) start as the
    // backward pass makes their gradients (buckets from the last), one at a
    // time.
    const double backward = o.backward_ms * 1e-3;
    double done = 0, produced = 0, own = 0;
    for (std::size_t k = buckets.size(); k-- > 0;) {
      const double bytes = double(buckets[k]) * double(rsize);
      double t = stage < 2 ? collective_seconds(m.reduce_scatter_inplace, bytes, o.nodes, local) +
                                 collective_seconds(m.allgather, bytes, o.nodes, local)
                           : collective_seconds(m.reduce_scatter, bytes, o.nodes, local);
      // On one rank stage 2's reduce-scatter is a copy into the shard (the
      // others are in place: nothing).
      if (ranks == 1 && stage >= 2) t += 2.0 * bytes / (m.update_gbps * 1e9);
      // Streamed gradients are copied into their bucket first (read the
      // gradient, write the bucket), and the reduced piece lands beside it
      // and is then added into the shard (read it, write fp32), at the
      // update's memory rate.
      if (o.grads == GradMode::stream && stage >= 2)
        t += (double(buckets[k]) * double(elem + rsize) +
              double(buckets[k]) / double(ranks) * double(rsize + 4)) /
             (m.update_gbps * 1e9);
      if (e.fused) t = 0;
      own += t;
      produced += double(buckets[k]);
      const double ready = stage >= 2 ? backward * produced / double(shard * ranks) : backward;
      done = std::max(done, ready) + t;
    }
    e.reduce_total = own;
    e.reduce = std::max(0.0, done - backward);
    e.update = double(e.update_elements) * e.update_bytes_per_param / (m.update_gbps * 1e9);
    const auto allgather = [&](std::size_t padded) {
      return collective_seconds(m.allgather, double(padded) * double(elem), o.nodes, local);
    };
    if (stage == 1 || stage == 2)
      for (std::size_t padded : buckets) e.gather += allgather(padded);
    // Stage 3: each unit gathered bucket by bucket, in the forward pass and
    // again in the backward pass (ZeroOptions::reshard_after_forward, the
    // default, frees it in between), the whole units once after the
    // update. Prefetch moves this under the layers' compute; how much it
    // hides depends on the compute, which the plan does not know, so it is
    // all counted: an upper bound on what a step exposes.
    for (const shardopt::LayoutPlan::Unit& u : layout.units)
      for (std::size_t b = u.first_bucket; b < u.end_bucket; ++b)
        e.gather += (u.persistent ? 1.0 : 2.0) * allgather(buckets[b]);
    e.step = e.reduce + e.update + e.gather;
    p.stages.push_back(e);
  }

  // The advice: the fastest stage that fits, else the smallest; stage 3
  // only when no other stage asked fits, since it asks the code to gather
  // and release each unit.
  std::string a;
  const auto fits = [&](const StageEstimate& e) { return o.memory == 0 || e.per_rank <= o.memory; };
  const StageEstimate *smallest = nullptr, *lowest = nullptr, *third = nullptr;
  const StageEstimate* smallest_other = nullptr;  // the smallest but stage 3
  bool other_fits = false;
  for (const StageEstimate& e : p.stages) {
    if (smallest == nullptr || e.per_rank < smallest->per_rank) smallest = &e;
    if (e.stage != 3 && (smallest_other == nullptr || e.per_rank < smallest_other->per_rank))
      smallest_other = &e;
    if (fits(e) && (lowest == nullptr || e.stage < lowest->stage)) lowest = &e;
    if (e.stage == 3) third = &e;
    other_fits = other_fits || (e.stage != 3 && fits(e));
  }
  const StageEstimate* pick = nullptr;
  for (const StageEstimate& e : p.stages) {
    if (!fits(e) || (e.stage == 3 && other_fits)) continue;
    if (pick == nullptr || (p.timed ? e.step < pick->step * 0.97 : e.per_rank < pick->per_rank))
      pick = &e;
  }
  const std::string in = o.memory > 0 ? " in " + mib(double(o.memory)) : "";
  if (pick == nullptr) {
    p.fits = false;
    a = "The model does not fit" + in + " per rank at any stage asked (stage " +
        std::to_string(smallest->stage) + " needs " + mib(double(smallest->per_rank)) +
        "): use more ranks (the shards shrink as 1/N), " +
        (third == nullptr ? "stage 3 (-s 3: the parameters sharded too), " : "") +
        "bf16 with --remainders, or a smaller model.";
  } else if (pick->stage == 3 && smallest_other != nullptr) {
    a = "Use stage 3: it is the only stage asked that fits" + in + " (stage " +
        std::to_string(smallest_other->stage) + " needs " + mib(double(smallest_other->per_rank)) +
        "), " + mib(double(pick->per_rank)) + " per rank";
    if (p.timed)
      a += ", a step of at most " + ms(pick->step) + " (reduce " + ms(pick->reduce) + ", update " +
           ms(pick->update) + ", gather " + ms(pick->gather) +
           ": the units' gathers, which prefetch hides under the layers' compute as far as it "
           "can)";
    a += ".";
  } else {
    a = "Use stage " + std::to_string(pick->stage) + ": ";
    if (p.timed) {
      a += "its step is the fastest";
      if (o.memory > 0) a += " of those that fit" + in;
      a += " (" + ms(pick->step) + ": reduce " + ms(pick->reduce) + ", update " + ms(pick->update) +
           ", gather " + ms(pick->gather) + ")";
    } else {
      a += "it holds the least per rank";
      if (third != nullptr && pick != third) a += " short of stage 3";
    }
    a += ", " + mib(double(pick->per_rank)) + " per rank.";
    if (third != nullptr && pick != third && fits(*third) && third->per_rank < pick->per_rank)
      a += " Stage 3 holds " + mib(double(third->per_rank)) +
           " per rank (the parameters sharded too) for two gathers of each unit a step" +
           (p.timed ? " (at most " + ms(third->step) + " a step)" : std::string()) +
           ": the code gathers and releases each unit (docs/zero.md).";
    if (pick->stage == 0 && ranks > 1)
      a += " Stage 0 updates the whole model on every rank; stage 1 shards the update for "
           "the same traffic plus a parameter allgather.";
    if (pick->stage >= 2 && o.grads != GradMode::stream)
      a += " With --grads stream (ZeroOptions::stream_grads) no full-size gradient is kept.";
    if (p.timed && pick->buckets > 1) {
      // Each bucket pays the start-up of its collectives; a bucket is worth
      // it when that is under 5% of its transfer.
      const Collective& c = p.machine.reduce_scatter;
      const double lat = collective_seconds(c, 0.0, o.nodes, local);
      const double per_byte = collective_seconds(c, 1e9, o.nodes, local) / 1e9 - lat / 1e9;
      if (per_byte > 0 && lat > 0) {
        const double good = 20.0 * lat / per_byte / (1024.0 * 1024.0);
        char b[200];
        if (good > p.bucket_mb)
          std::snprintf(b, sizeof b,
                        " Buckets of %.3g MiB pay a start-up of %.0f%% of their transfer: "
                        "raise -b (SHARDOPT_BUCKET_MB) to %.3g MiB or more.",
                        p.bucket_mb, 100.0 * lat / (per_byte * p.bucket_mb * 1048576.0), good);
        else
          std::snprintf(b, sizeof b,
                        " Buckets of %.3g MiB are large enough (start-up under 5%% of a "
                        "transfer from %.3g MiB); smaller ones overlap more of the backward pass.",
                        p.bucket_mb, good);
        a += b;
      }
    }
  }
  // The lowest stage that fits: the least the code must do for the model to
  // fit, whatever the step costs.
  if (o.memory > 0 && lowest != nullptr && lowest == pick && smallest_other != nullptr &&
      pick->stage != 3)
    a += " It is the lowest stage that fits" + in + ".";
  else if (o.memory > 0 && lowest != nullptr && lowest != pick)
    a += " Stage " + std::to_string(lowest->stage) + " is the lowest that fits" + in + ".";
  if (third != nullptr && p.units == 1 && o.unit_count == 0 && o.unit_list.empty())
    a += std::string(" At stage 3 the model is one unit (") +
         (o.params ? "-p gives one tensor" : "one tensor") +
         "): each gather holds the whole model on every rank; give --units N to plan it as N "
         "units, as a code gathers its layers.";
  p.advice = a;
  return p;
}

}  // namespace plan
