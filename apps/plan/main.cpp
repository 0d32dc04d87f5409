// shardopt-plan: main() and what it prints (the table, the advice, --json).
// One process, no MPI ranks: plan_memory() and plan_layout() are local.
#include <cstdio>
#include <string>

#include "plan/plan.hpp"
#include "shardopt/error.hpp"
#include "support/cli.hpp"

namespace {

constexpr const char* kProgram = "shardopt-plan";

double to_mib(std::size_t b) { return double(b) / (1024.0 * 1024.0); }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

void print_json(const plan::Options& o, const plan::Plan& p) {
  for (const plan::StageEstimate& e : p.stages) {
    const shardopt::MemoryReport& m = e.memory;
    std::printf(
        "{\"stage\":%d,\"nodes\":%d,\"ranks_per_node\":%d,\"ranks\":%d,\"threads\":%d,"
        "\"device\":%s,"
        "\"params\":%zu,\"tensors\":%zu,\"dtype\":\"%s\",\"optimizer\":\"%s\",\"bucket_mb\":%g,"
        "\"buckets\":%zu,\"master_params\":%zu,\"optimizer_state\":%zu,\"grad_shard\":%zu,"
        "\"reduced_grads\":%zu,\"owned_grads\":%zu,\"bucket_bytes\":%zu,\"user_params\":%zu,"
        "\"user_grads\":%zu,\"allocated\":%zu,\"device_bytes\":%zu,\"host_bytes\":%zu,"
        "\"node_shared\":%zu,\"per_rank_bytes\":%zu,\"shm_per_node_bytes\":%zu,"
        "\"param_shard\":%zu,\"gather_pool\":%zu,\"persistent_params\":%zu,\"units\":%zu,",
        e.stage, o.nodes, o.ranks_per_node, o.nodes * o.ranks_per_node, o.threads,
        o.device ? "true" : "false", p.model.total(), p.model.numel.size(),
        shardopt::dtype_name(p.dtype), p.optimizer_key.c_str(), p.bucket_mb, e.buckets,
        m.master_params, m.optimizer_state, m.grad_shard, m.reduced_grads, m.owned_grads, m.buckets,
        m.user_params, m.user_grads, m.allocated(), m.device_bytes, m.host_bytes, m.node_shared,
        e.per_rank, p.shm_per_node, m.param_shard, m.gather_pool, m.persistent_params, p.units);
    if (e.largest)
      std::printf("\"largest_params\":%llu,", static_cast<unsigned long long>(*e.largest));
    else
      std::printf("\"largest_params\":null,");
    if (p.timed)
      std::printf(
          "\"reduce_ms\":%.4f,\"reduce_total_ms\":%.4f,\"update_ms\":%.4f,\"gather_ms\":%.4f,"
          "\"step_ms\":%.4f,",
          e.reduce * 1e3, e.reduce_total * 1e3, e.update * 1e3, e.gather * 1e3, e.step * 1e3);
    else
      std::printf(
          "\"reduce_ms\":null,\"reduce_total_ms\":null,\"update_ms\":null,\"gather_ms\":null,"
          "\"step_ms\":null,");
    std::printf("\"fused\":%s,\"update_bytes_per_param\":%g,\"advice\":%s}\n",
                e.fused ? "true" : "false", e.update_bytes_per_param,
                json_string(p.advice).c_str());
  }
}

void print_table(const plan::Options& o, const plan::Plan& p) {
  const int ranks = o.nodes * o.ranks_per_node;
  bool third = false;
  for (const plan::StageEstimate& e : p.stages) third = third || e.stage == 3;
  // Units: stage 3's gathers, and with --units the ends of buckets.
  const std::string units =
      third || !p.model.units.empty()
          ? " in " + std::to_string(p.units) + " unit" + (p.units == 1 ? "" : "s")
          : "";
  std::printf("# shardopt-plan: %s: %zu tensor%s%s, %zu parameters, %s, %s\n",
              p.model.source.c_str(), p.model.numel.size(), p.model.numel.size() == 1 ? "" : "s",
              units.c_str(), p.model.total(), shardopt::dtype_name(p.dtype),
              p.optimizer_key.c_str());
  std::printf(
      "# job: %d node%s x %d rank%s per node = %d ranks, %d thread%s per rank, parameters in "
      "%s memory; buckets of %g MiB; gradients %s%s\n",
      o.nodes, o.nodes == 1 ? "" : "s", o.ranks_per_node, o.ranks_per_node == 1 ? "" : "s", ranks,
      o.threads, o.threads == 1 ? "" : "s", o.device ? "device" : "host", p.bucket_mb,
      o.grads == plan::GradMode::owned  ? "owned by the optimizer"
      : o.grads == plan::GradMode::user ? "in the application's buffers"
                                        : "streamed (stream_grads)",
      o.separate ? ", one buffer per parameter" : ", one flat buffer");
  if (p.timed) {
    const auto from = [](const plan::Hop& h) { return h.known ? h.from : std::string("-"); };
    std::printf("# rates: node hop %s, network hop %s, update %.1f GB/s per rank (%s)\n",
                from(p.machine.reduce_scatter.node).c_str(),
                from(p.machine.reduce_scatter.net).c_str(), p.machine.update_gbps,
                p.machine.update_from.c_str());
    for (const std::string& n : p.machine.notes) std::printf("# note: %s\n", n.c_str());
  }
  std::printf("#\n%-32s", "# per rank, MiB");
  for (const plan::StageEstimate& e : p.stages)
    std::printf(" %12s", ("stage " + std::to_string(e.stage)).c_str());
  std::printf("\n");
  const auto row = [&](const char* name, auto get) {
    std::printf("%-32s", name);
    for (const plan::StageEstimate& e : p.stages) std::printf(" %12.1f", to_mib(get(e)));
    std::printf("\n");
  };
  using E = plan::StageEstimate;
  row("parameters (yours)", [](const E& e) { return e.memory.user_params; });
  row("gradients (yours)", [](const E& e) { return e.memory.user_grads; });
  row("fp32 master / remainders", [](const E& e) { return e.memory.master_params; });
  row("optimizer state", [](const E& e) { return e.memory.optimizer_state; });
  row("gradient shard (fp32)", [](const E& e) { return e.memory.grad_shard; });
  row("reduced gradients (fp32)", [](const E& e) { return e.memory.reduced_grads; });
  row("owned gradients", [](const E& e) { return e.memory.owned_grads; });
  row("buckets and scratch", [](const E& e) { return e.memory.buckets; });
  if (third) {
    row("parameter shard (stage 3)", [](const E& e) { return e.memory.param_shard; });
    row("gather pool (stage 3)", [](const E& e) { return e.memory.gather_pool; });
    row("whole units (stage 3)", [](const E& e) { return e.memory.persistent_params; });
  }
  row("total", [](const E& e) { return e.per_rank; });
  row("  shardopt's (memory_report)", [](const E& e) { return e.memory.allocated(); });
  row("  of it node-shared", [](const E& e) { return e.memory.node_shared; });
  if (o.memory > 0) {
    std::printf("%-32s", ("largest model in " + std::to_string(o.memory >> 20) + " MiB").c_str());
    for (const plan::StageEstimate& e : p.stages)
      if (e.largest)
        std::printf(" %10.3fe9", double(*e.largest) / 1e9);
      else
        std::printf(" %12s", "-");
    std::printf("\n");
  }
  if (p.timed) {
    std::printf("#\n%-32s", "# per step, ms");
    for (const plan::StageEstimate& e : p.stages)
      std::printf(" %12s", ("stage " + std::to_string(e.stage)).c_str());
    std::printf("\n");
    const auto trow = [&](const char* name, auto get) {
      std::printf("%-32s", name);
      for (const plan::StageEstimate& e : p.stages) std::printf(" %12.3f", 1e3 * get(e));
      std::printf("\n");
    };
    trow(o.backward_ms > 0 ? "reduce (after the backward)" : "reduce",
         [](const E& e) { return e.reduce; });
    trow("update", [](const E& e) { return e.update; });
    trow("gather", [](const E& e) { return e.gather; });
    trow("step", [](const E& e) { return e.step; });
  }
  std::printf("#\n# buckets per step:");
  for (const plan::StageEstimate& e : p.stages) std::printf(" %zu", e.buckets);
  if (p.shm_per_node > 0)
    std::printf(
        "; the shared-memory transport maps about %.1f MiB per node (2 communicators, "
        "2 slots of SHARDOPT_SHM_CHUNK_KB per rank each)",
        to_mib(p.shm_per_node));
  std::printf("\n# %s\n", p.advice.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  plan::Options o;
  try {
    o = plan::parse_options(argc, argv);
  } catch (const cli::UsageError& e) {
    if (e.message.empty()) {
      std::fputs(plan::usage().c_str(), stdout);
      return 0;
    }
    cli::print_usage_error(kProgram, 0, e);
    return 2;
  }
  try {
    const plan::Plan p = plan::estimate(o);
    if (o.json)
      print_json(o, p);
    else
      print_table(o, p);
    if (!p.fits) {  // the table says how far off; the status says it failed
      std::fprintf(stderr, "%s: %s\n", kProgram, p.advice.c_str());
      return 1;
    }
  } catch (const plan::InputError& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.message.c_str());
    return 1;
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
  return 0;
}
