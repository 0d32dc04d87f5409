// shardopt-train: what rank 0 prints (output.hpp).
#include "output.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "../support/report.hpp"

namespace train {
namespace {

using report::json_number;

// The loss the default run must end below (README.md, tests/cli/test_train.sh).
constexpr double kDemoThreshold = 1e-2;

std::string format_bytes(double bytes) {
  char s[64];
  if (bytes >= 1024.0 * 1024.0) {
    std::snprintf(s, sizeof s, "%.2f MiB", bytes / (1024.0 * 1024.0));
  } else if (bytes >= 1024.0) {
    std::snprintf(s, sizeof s, "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(s, sizeof s, "%.0f B", bytes);
  }
  return s;
}

const char* precision_name(DType t) { return shardopt::dtype_name(t); }

// A JSON string: quotes, backslashes and control characters escaped.
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// LoadReport::summary() on one line: its lines joined with "; ".
std::string one_line(const std::string& text) {
  std::string out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view line = std::string_view(text).substr(at, end - at);
    const std::size_t first = line.find_first_not_of(" \t");
    if (first != std::string_view::npos) {
      if (!out.empty()) out += "; ";
      out += line.substr(first);
    }
    at = end + 1;
  }
  return out;
}

}  // namespace

bool output_is_terminal() {
  if (isatty(STDOUT_FILENO) == 0) return false;
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                        std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr;
  if (!launched) return true;
  const std::string link = "/proc/" + std::to_string(getppid()) + "/fd/1";
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::read_symlink(link, ec);
  if (ec) return false;
  const std::string t = target.string();
  return t.starts_with("/dev/pts/") || t.starts_with("/dev/tty");
}

void print_resumed(const RunContext& c, const Resumed& r) {
  const shardopt::LoadReport& rep = r.report;
  const std::string summary = one_line(rep.summary());
  std::string applied = "[";
  for (std::size_t i = 0; i < r.applied.size(); ++i) {
    if (i > 0) applied += ',';
    applied += json_string(r.applied[i]);
  }
  applied += ']';
  if (c.o.json) {
    std::printf(
        "{\"type\":\"resume\",\"path\":%s,\"step\":%lld,\"saved_ranks\":%d,\"ranks\":%d,"
        "\"loaded\":%zu,\"missing\":%zu,\"unexpected\":%zu,\"mismatched\":%zu,"
        "\"hyper_parameters\":%s,\"applied\":%s,\"seconds\":%.6f,\"summary\":%s}\n",
        json_string(r.path).c_str(), static_cast<long long>(rep.step), rep.saved_ranks, c.ranks,
        rep.loaded.size(), rep.missing.size(), rep.unexpected.size(), rep.mismatched.size(),
        rep.hyper_parameters ? "true" : "false", applied.c_str(), r.seconds,
        json_string(summary).c_str());
  } else {
    // The summary gives the step and the rank count the file was saved at.
    std::printf("# resumed from %s at %d rank%s: %s; read in %.3f s\n", r.path.c_str(), c.ranks,
                c.ranks == 1 ? "" : "s", summary.c_str(), r.seconds);
    for (const std::string& a : r.applied)
      std::printf("# from the command line, replacing the checkpoint's: %s\n", a.c_str());
  }
  std::fflush(stdout);
}

void print_written(const RunContext& c, const char* kind, const std::string& path,
                   std::int64_t step, double seconds) {
  if (c.o.json) {
    std::printf("{\"type\":\"%s\",\"step\":%lld,\"path\":%s,\"seconds\":%.6f}\n", kind,
                static_cast<long long>(step), json_string(path).c_str(), seconds);
  } else {
    std::printf("%s# step %lld: %s written to %s in %.3f s\n", c.live ? "\r\033[K" : "",
                static_cast<long long>(step),
                std::string_view(kind) == "export" ? "parameters" : "checkpoint", path.c_str(),
                seconds);
  }
  std::fflush(stdout);
}

void print_stopped(const RunContext& c, const char* signal, std::int64_t step) {
  const Options& o = c.o;
  if (o.json) {
    std::printf(
        "{\"type\":\"stopped\",\"signal\":\"%s\",\"step\":%lld,\"steps\":%d,"
        "\"checkpoint\":%s,\"exit_status\":%d}\n",
        signal, static_cast<long long>(step), o.steps, json_string(o.checkpoint).c_str(),
        kExitStopped);
  } else {
    std::printf(
        "%s# stopped by %s at step %lld of %d: the checkpoint %s holds it; resume with "
        "--resume %s (exit status %d)\n",
        c.live ? "\r\033[K" : "", signal, static_cast<long long>(step), o.steps,
        o.checkpoint.c_str(), o.checkpoint.c_str(), kExitStopped);
  }
  std::fflush(stdout);
}

void print_start(const RunContext& c, const ModelTensors& m,
                 const shardopt::ZeroRedundancyOptimizer& opt,
                 const shardopt::OptimizerConfig& config) {
  const Options& o = c.o;
  const shardopt::MemoryReport mem = opt.memory_report();
  const double psi = static_cast<double>(m.numel());
  const double formula = shardopt::zero_memory_formula(o.stage, psi, c.ranks, o.precision,
                                                       shardopt::state_bytes_per_param(config));
  // What the formula counts, measured: shardopt's allocations but its
  // buckets (and at stage 3 the pool of the layers in use), the model's
  // parameters (at stage 3 the optimizer's shard of them), and in stages 0
  // and 1 its gradients (stage 2 counts the gradient shard instead: a code
  // that frees or reuses its gradient buffers after grad_ready needs no full
  // ones).
  const double comparable =
      static_cast<double>(mem.allocated() - mem.buckets - mem.gather_pool + mem.user_params +
                          (o.stage < 2 ? mem.user_grads : 0));
  const double bucket_mb = o.bucket_mb > 0.0 ? o.bucket_mb : shardopt::settings().bucket_mb;
  const char* scaling = o.uses_scaler() ? "dynamic" : "none";
  const train::Shape shape = student_shape(o);
  // Which ranks share a node: "2 nodes (2 per node)" (NodeLayout::summary()
  // after its rank count), and the most ranks a node holds.
  const shardopt::NodeLayout& nodes = c.comm.nodes();
  const std::string layout = nodes.summary();
  const std::string on_nodes = layout.substr(layout.find(" on ") + 4);
  const int most_per_node =
      *std::max_element(nodes.ranks_per_node.begin(), nodes.ranks_per_node.end());
  std::string per_node_json;
  for (const int k : nodes.ranks_per_node) {
    if (!per_node_json.empty()) per_node_json += ',';
    per_node_json += std::to_string(k);
  }
  std::string dims;
  for (std::size_t i = 0; i < shape.dims.size(); ++i) {
    dims += (i == 0 ? "" : " -> ") + std::to_string(shape.dims[i]);
  }
  if (o.json) {
    // Each tensor's elements and unit as the optimizer registered them:
    // what shardopt-plan -t NUMELS --units UNITS takes to plan this run.
    std::string numels, units;
    for (std::size_t i = 0; i < opt.num_params(); ++i) {
      if (i > 0) {
        numels += ',';
        units += ',';
      }
      numels += std::to_string(opt.param(i).numel);
      units += std::to_string(opt.param(i).unit);
    }
    std::printf(
        "{\"type\":\"start\",\"ranks\":%d,\"nodes\":%d,\"ranks_per_node\":[%s],\"stage\":%d,"
        "\"optimizer\":\"%s\",\"lr\":%s,"
        "\"schedule\":\"%s\",\"precision\":\"%s\",\"loss_scale\":\"%s\",\"clip\":%s,"
        "\"params\":%zu,\"tensors\":%zu,\"layers\":%d,\"inputs\":%d,\"hidden\":%d,"
        "\"outputs\":%d,\"teacher_hidden\":%d,\"batch\":%d,\"global_batch\":%lld,"
        "\"micro_batches\":%d,\"steps\":%d,\"bucket_mb\":%s,\"scattered\":%s,\"seed\":%llu,"
        "\"device\":\"%s\",\"device_comm\":\"%s\",\"numels\":\"%s\",\"units\":\"%s\","
        "\"memory\":{\"master_params\":%zu,\"optimizer_state\":%zu,\"grad_shard\":%zu,"
        "\"reduced_grads\":%zu,\"owned_grads\":%zu,\"buckets\":%zu,\"allocated\":%zu,"
        "\"user_params\":%zu,\"user_grads\":%zu,\"param_shard\":%zu,\"gather_pool\":%zu,"
        "\"persistent_params\":%zu,\"working_copies\":%zu,"
        "\"comparable\":%.0f,\"formula\":%.0f}}\n",
        c.ranks, nodes.nodes, per_node_json.c_str(), o.stage, o.optimizer.name(),
        json_number(o.learning_rate()).c_str(),
        o.schedule == Schedule::cosine ? "cosine" : "constant", precision_name(o.precision),
        scaling, o.clip ? json_number(*o.clip).c_str() : "null", m.numel(), m.count(), o.layers,
        o.inputs, o.hidden, o.outputs, o.teacher_hidden, o.batch,
        static_cast<long long>(o.batch) * c.ranks, o.micro_batches, o.steps,
        json_number(bucket_mb).c_str(), o.scattered ? "true" : "false",
        static_cast<unsigned long long>(o.seed), o.device ? "cuda" : "host",
        c.comm.device_backend_name(), numels.c_str(), units.c_str(), mem.master_params,
        mem.optimizer_state, mem.grad_shard, mem.reduced_grads, mem.owned_grads, mem.buckets,
        mem.allocated(), mem.user_params, mem.user_grads, mem.param_shard, mem.gather_pool,
        mem.persistent_params, m.working_bytes(), comparable, formula);
    std::fflush(stdout);
    return;
  }
  std::printf("# %s: a data-parallel MLP learning a teacher network, on shardopt's ZeRO engine\n",
              kProgram);
  std::printf("# %s\n", shardopt::build_info_string().c_str());
  std::printf("# ranks %d on %s, stage %d, optimizer %s (lr %g, %s schedule), precision %s%s%s\n",
              c.ranks, on_nodes.c_str(), o.stage, o.optimizer.name(), o.learning_rate(),
              o.schedule == Schedule::cosine ? "cosine" : "constant", precision_name(o.precision),
              o.param_remainders ? " with remainders" : "",
              o.reduce_in_fp32 ? ", reduced in fp32" : "");
  std::printf("# loss scale %s, clip %s, buckets %g MiB, %s buffers in %s\n", scaling,
              o.clip ? json_number(*o.clip).c_str() : "none", bucket_mb,
              o.scattered ? "scattered" : "contiguous", o.device ? "device memory" : "host memory");
  if (o.device) {
    std::printf("# device runtime %s, device collectives %s\n", shardopt::device_runtime_name(),
                c.comm.device_backend_name());
  }
  std::printf("# model %s (%zu parameters in %zu tensors), teacher hidden width %d\n", dims.c_str(),
              m.numel(), m.count(), o.teacher_hidden);
  std::printf("# batch %d per rank (%lld in all), %d micro-batch%s, %d steps, seed %llu\n", o.batch,
              static_cast<long long>(o.batch) * c.ranks, o.micro_batches,
              o.micro_batches == 1 ? "" : "es", o.steps, static_cast<unsigned long long>(o.seed));
  const auto b = [](std::size_t bytes) { return format_bytes(static_cast<double>(bytes)); };
  std::printf(
      "# memory on rank 0: shardopt allocated %s: master params %s, optimizer state %s,\n"
      "#   grad shard %s, reduced grads %s, owned grads %s, buckets %s\n",
      b(mem.allocated()).c_str(), b(mem.master_params).c_str(), b(mem.optimizer_state).c_str(),
      b(mem.grad_shard).c_str(), b(mem.reduced_grads).c_str(), b(mem.owned_grads).c_str(),
      b(mem.buckets).c_str());
  if (o.stage == 3)
    std::printf("#   param shard %s, gather pool %s, whole units %s\n", b(mem.param_shard).c_str(),
                b(mem.gather_pool).c_str(), b(mem.persistent_params).c_str());
  std::printf("#   the trainer's buffers: params %s, grads %s", b(mem.user_params).c_str(),
              b(mem.user_grads).c_str());
  if (m.working_bytes() > 0) {
    std::printf(", fp32 working copies %s", b(m.working_bytes()).c_str());
  }
  std::printf("\n");
  std::printf(
      "#   ZeRO formula (stage %d, %zu params, %d ranks, %s, %g B of state a param): %s;\n"
      "#   measured alike (allocated less buckets%s, plus params%s): %s\n",
      o.stage, m.numel(), c.ranks, precision_name(o.precision),
      shardopt::state_bytes_per_param(config), format_bytes(formula).c_str(),
      o.stage == 3 ? " and the gather pool" : "", o.stage < 2 ? " and grads" : "",
      format_bytes(comparable).c_str());
  if (most_per_node > 1) {
    // memory_report() is one rank's; a node holds the sum over its ranks
    // (each rank's about rank 0's).
    std::printf("#   a node holds its ranks' sum: about %d x %s = %s allocated by shardopt%s\n",
                most_per_node, b(mem.allocated()).c_str(),
                format_bytes(static_cast<double>(mem.allocated()) * most_per_node).c_str(),
                nodes.uniform ? "" : " on the largest node");
  }
  std::printf("#\n");
  std::printf("# %6s %11s %9s %9s %9s %9s %9s %9s %10s\n", "step", "loss", "lr", "compute",
              "reduce", "update", "gather", "step", "samples/s");
  std::printf("# %6s %11s %9s %9s %9s %9s %9s %9s\n", "", "", "", "(ms)", "(ms)", "(ms)", "(ms)",
              "(ms)");
  std::fflush(stdout);
}

void print_log(const RunContext& c, const LogLine& l) {
  const Options& o = c.o;
  if (o.json) {
    std::printf(
        "{\"type\":\"step\",\"step\":%d,\"loss\":%s,\"lr\":%s,\"compute_ms\":%.4f,"
        "\"reduce_ms\":%.4f,\"update_ms\":%.4f,\"gather_ms\":%.4f,\"step_ms\":%.4f,"
        "\"samples_per_s\":%.1f,\"loss_scale\":%s,\"grad_norm\":%s,\"skipped\":%d,"
        "\"exposed_comm_ms\":%.4f,\"reduce_mb\":%.4f,\"gather_mb\":%.4f,"
        "\"reduce_busbw_gbps\":%.4f,\"gather_busbw_gbps\":%.4f}\n",
        l.step, json_number(l.loss).c_str(), json_number(l.lr).c_str(), l.per_step.compute * 1e3,
        l.per_step.reduce * 1e3, l.per_step.update * 1e3, l.per_step.gather * 1e3,
        l.per_step.total * 1e3, l.samples_per_s, json_number(l.loss_scale).c_str(),
        l.grad_norm >= 0.0 || !std::isfinite(l.grad_norm) ? json_number(l.grad_norm).c_str()
                                                          : "null",
        l.skipped, l.per_step.exposed * 1e3, l.per_step.reduce_bytes / 1e6,
        l.per_step.gather_bytes / 1e6, l.per_step.reduce_busbw(c.ranks),
        l.per_step.gather_busbw(c.ranks));
    std::fflush(stdout);
    return;
  }
  std::string extra;
  char piece[64];
  if (o.uses_scaler()) {
    std::snprintf(piece, sizeof piece, "  scale %g", l.loss_scale);
    extra += piece;
  }
  if (o.clip) {
    std::snprintf(piece, sizeof piece, "  norm %.3e", l.grad_norm);
    extra += piece;
  }
  if (l.skipped > 0) {
    std::snprintf(piece, sizeof piece, "  skipped %d", l.skipped);
    extra += piece;
  }
  if (c.ranks > 1) {
    std::snprintf(piece, sizeof piece, "  exposed %.3f ms, busbw %.2f/%.2f GB/s",
                  l.per_step.exposed * 1e3, l.per_step.reduce_busbw(c.ranks),
                  l.per_step.gather_busbw(c.ranks));
    extra += piece;
  }
  std::printf("%s  %6d %11.4e %9.2e %9.3f %9.3f %9.3f %9.3f %9.3f %10.0f%s\n",
              c.live ? "\r\033[K" : "", l.step, l.loss, l.lr, l.per_step.compute * 1e3,
              l.per_step.reduce * 1e3, l.per_step.update * 1e3, l.per_step.gather * 1e3,
              l.per_step.total * 1e3, l.samples_per_s, extra.c_str());
  std::fflush(stdout);
}

void print_summary(const RunContext& c, const Summary& s) {
  const Options& o = c.o;
  const Times& worst = s.worst;
  // Means per step tried in this run (none: zero times).
  const double n = std::max(1.0, static_cast<double>(s.attempts));
  const double global_batch = static_cast<double>(o.batch) * c.ranks;
  const double samples_per_s = worst.total > 0.0 ? global_batch * n / worst.total : 0.0;
  const double ratio = s.final_loss > 0.0 ? s.initial_loss / s.final_loss : 0.0;
  const char* verdict = s.final_loss < kDemoThreshold ? "below" : "not below";
  if (o.json) {
    std::printf(
        "{\"type\":\"summary\",\"steps\":%d,\"applied\":%lld,\"skipped\":%d,"
        "\"initial_loss\":%s,\"final_loss\":%s,\"eval_samples\":%lld,\"compute_ms\":%.4f,"
        "\"reduce_ms\":%.4f,\"update_ms\":%.4f,\"gather_ms\":%.4f,\"step_ms\":%.4f,"
        "\"samples_per_s\":%.1f,\"wall_s\":%.3f,\"params_identical\":%s,\"saved\":%s,"
        "\"start_step\":%lld,\"final_step\":%lld,\"checkpoints\":%d,\"checkpoint_s\":%.6f,"
        "\"exported\":%s,\"export_s\":%.6f}\n",
        s.attempts, static_cast<long long>(s.applied), s.skipped,
        json_number(s.initial_loss, "%.6e").c_str(), json_number(s.final_loss, "%.6e").c_str(),
        static_cast<long long>(o.eval_samples) * c.ranks, worst.compute / n * 1e3,
        worst.reduce / n * 1e3, worst.update / n * 1e3, worst.gather / n * 1e3,
        worst.total / n * 1e3, samples_per_s, worst.total, s.identical ? "true" : "false",
        !o.save_params.empty() && s.save_error.empty() ? "true" : "false",
        static_cast<long long>(s.start_step), static_cast<long long>(s.final_step), s.checkpoints,
        s.checkpoint_seconds, o.export_path.empty() ? "false" : "true", s.export_seconds);
  } else {
    std::printf("%s#\n", c.live ? "\r\033[K" : "");
    std::string from;
    if (s.resumed) from = ", resumed at step " + std::to_string(s.start_step);
    std::printf(
        "# summary: %d steps (%lld applied, %d skipped%s); loss on %lld held-out samples: "
        "initial %.4e, final %.4e (%.0fx lower)\n",
        s.attempts, static_cast<long long>(s.applied), s.skipped, from.c_str(),
        static_cast<long long>(o.eval_samples) * c.ranks, s.initial_loss, s.final_loss, ratio);
    std::printf(
        "# mean step (ms, slowest rank): compute %.3f, reduce %.3f, update %.3f, gather %.3f, "
        "total %.3f; %.0f samples/s; %.2f s of steps\n",
        worst.compute / n * 1e3, worst.reduce / n * 1e3, worst.update / n * 1e3,
        worst.gather / n * 1e3, worst.total / n * 1e3, samples_per_s, worst.total);
    std::printf("# final loss %.4e: %s %g, the threshold the default run must reach\n",
                s.final_loss, verdict, kDemoThreshold);
    if (s.checkpoints > 0) {
      std::printf("# %d checkpoint%s written to %s: %.3f s of saving (slowest rank)\n",
                  s.checkpoints, s.checkpoints == 1 ? "" : "s", o.checkpoint.c_str(),
                  s.checkpoint_seconds);
    }
    if (s.identical) {
      std::printf("# parameters identical on every rank%s%s\n",
                  s.saved && !o.save_params.empty() ? "; written to " : "",
                  s.saved && !o.save_params.empty() ? o.save_params.c_str() : "");
    }
  }
  std::fflush(stdout);
}

}  // namespace train
