// shardopt-bench-optim: the functional optimizers on the host beside their
// memory limit.
//
// An optimizer step streams its arrays once: it is memory-bound, and its
// limit is the time the same memory traffic takes without the math. For each
// optimizer, precision, parameter count and thread count this program times
// the step and, alternately on the same arrays, a memory-only kernel that
// reads and writes exactly the streams the step does (same in-place writes,
// same OpenMP threads and partition, trivial arithmetic), and prints both
// rates and their ratio. STREAM triad is printed beside them for reference.
//
//   shardopt-bench-optim                 # 1M..256M params, 1..nproc threads
//   shardopt-bench-optim -s 16M,64M -o adam,adamw -p fp32,bf16 --json
//
// It runs as one process (the functional API needs no MPI_Init); it also
// runs under `mpirun -n 1`. Uses only the public API of shardopt, OpenMP and
// the standard library. The options, the sweep, the timing, the table and
// the goal are shared with shardopt-bench-optim-gpu (harness.hpp,
// over the optimizer table of optim_steps.hpp); this file holds what is the
// host's: the arrays in host memory, the thread counts and the load of
// other processes; limits.cpp the OpenMP memory-only kernels and STREAM
// triad.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../support/cli.hpp"
#include "../support/machine.hpp"
#include "../support/optim_steps.hpp"
#include "limits.hpp"
#include "shardopt/config.hpp"
#include "shardopt/half.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/types.hpp"
#include "sweep.hpp"

namespace {

using bench::Streams;
using shardopt::DType;

// The goal: at this many parameters and more (bench::kGoalNumel), with every
// core, each optimizer and precision runs at this fraction of its memory
// limit or better.
constexpr double kGoalRatio = 0.95;
// Small sizes run more than the minimum number of repetitions: about this
// long per timed series, up to kMaxReps.
constexpr double kSeriesBudgetS = 0.25;
constexpr int kMaxReps = 2000;

// ---------------------------------------------------------------------------
// Machine

// mpirun -n 2 would start two copies that compete for the same cores.
int launched_processes() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(var)) {
      const auto n = cli::parse_unsigned(v);
      if (n && *n > 1) return static_cast<int>(std::min<std::uint64_t>(*n, 1 << 20));
    }
  }
  return 1;
}

// CPU time used by other processes (and the kernel) since the last call, as a
// fraction of all cores over that wall time: 0 on a quiet machine. Busy rows
// are marked, since a step and its limit slowed down alike read as ratio 1.
class OtherLoad {
 public:
  OtherLoad() { sample(); }
  // The fraction since the last call (or construction); -1 if unknown.
  double fraction() {
    const auto [busy0, self0, wall0] = std::tuple{busy_s_, self_s_, wall_};
    if (!sample()) return -1;
    const double wall = std::chrono::duration<double>(wall_ - wall0).count();
    const double cores = static_cast<double>(omp_get_num_procs());
    if (wall <= 0) return -1;
    return std::max(0.0, ((busy_s_ - busy0) - (self_s_ - self0)) / (wall * cores));
  }

 private:
  bool sample() {
    wall_ = std::chrono::steady_clock::now();
    const machine::CpuTimes t = machine::cpu_times();
    self_s_ = t.self_s;
    if (t.ok) busy_s_ = t.busy_s;
    return t.ok;
  }
  double busy_s_ = 0, self_s_ = 0;
  std::chrono::steady_clock::time_point wall_;
};

// ---------------------------------------------------------------------------
// Host memory

class HostMemory final : public bench::Memory {
 public:
  HostMemory() {
    for (int t = 1; t <= nproc_; ++t) threads_.push_back(t);
  }

  const bench::Program& program() const override {
    static const bench::Program p{
        .name = "shardopt-bench-optim",
        .sizes_option = "sizes",
        .default_sizes = {std::size_t{1} << 20, std::size_t{4} << 20, std::size_t{16} << 20,
                          std::size_t{64} << 20, std::size_t{256} << 20},
        .series = {.warmup = 2, .reps = 7, .budget_s = kSeriesBudgetS, .max_reps = kMaxReps},
        .remainders = false,
        .table = {"threads", 7, 11, 2, "stream", true},
        .goal = {.at_least = kGoalRatio, .of_reference = false, .names_threads = true},
    };
    return p;
  }

  std::span<const cli::OptionSpec> own_options() const override {
    static constexpr cli::OptionSpec kSpecs[] = {{'t', "threads", true}, {'M', "max-memory", true}};
    return kSpecs;
  }

  void set_option(std::string_view name, const std::string& label, std::string_view v) override {
    if (name == "threads") {
      constexpr const char* kAccepted = "thread counts >= 1, comma-separated, or a range A-B";
      threads_.clear();
      for (std::string_view item : cli::split(v)) {
        const std::size_t dash = item.find('-');
        if (dash == std::string_view::npos) {
          threads_.push_back(cli::parse_int(label, item, 1, 4096, kAccepted));
        } else {
          const int lo = cli::parse_int(label, item.substr(0, dash), 1, 4096, kAccepted);
          const int hi = cli::parse_int(label, item.substr(dash + 1), 1, 4096, kAccepted);
          if (hi < lo) cli::bad_value(label, v, kAccepted);
          for (int t = lo; t <= hi; ++t) threads_.push_back(t);
        }
      }
      std::sort(threads_.begin(), threads_.end());
      threads_.erase(std::unique(threads_.begin(), threads_.end()), threads_.end());
    } else if (name == "max-memory") {
      const auto n = cli::parse_scaled(v, std::uint64_t{1} << 40);
      if (!n)
        cli::bad_value(label, v, "a positive number of bytes with an optional K, M or G suffix");
      max_memory_ = *n;
    }
  }

  std::string usage() const override;

  void check_launch() const override {
    if (const int n = launched_processes(); n > 1) {
      throw cli::UsageError{"started as " + std::to_string(n) +
                            " processes; it runs as one (mpirun -n 1, or no launcher): copies "
                            "would compete for the same cores and memory bandwidth"};
    }
  }

  int start(const bench::Options&, bench::Needs& needs, FILE* info) override {
    std::fprintf(info,
                 "# machine: %s, %d cores for OpenMP, vector unit %s%s%s, MemAvailable %.1f "
                 "GiB\n",
                 machine::cpu_model().c_str(), nproc_,
                 shardopt::kernels::cpu::detail::isa_name(limits::used_isa()),
                 std::getenv("SHARDOPT_CPU_ISA") != nullptr ? " (SHARDOPT_CPU_ISA=" : "",
                 std::getenv("SHARDOPT_CPU_ISA") != nullptr
                     ? (std::string(std::getenv("SHARDOPT_CPU_ISA")) + ")").c_str()
                     : "",
                 bench::gib(machine::mem_available_bytes()));
    if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr && nproc_ == 1) {
      std::fprintf(info,
                   "# note: mpirun binds a rank to one core; mpirun -n 1 --bind-to none "
                   "gives this process every core\n");
    }
    needs.grad32 = true;  // STREAM triad's output
    if (max_memory_ == 0) max_memory_ = machine::mem_available_bytes() / 4 * 3;
    return 0;
  }

  bool prepare(std::size_t n, const bench::Needs& needs, FILE* info) override {
    const std::size_t need = n * needs.bytes();
    if (max_memory_ != 0 && need > max_memory_) {
      std::fprintf(info,
                   "# skipping %s params: the arrays need %.2f GiB, over the limit %.2f GiB"
                   " (-M)\n",
                   cli::human_count(n).c_str(), bench::gib(need), bench::gib(max_memory_));
      return false;
    }
    omp_set_num_threads(nproc_);
    arrays_.reset();  // the last size's first
    arrays_.emplace(needs, n);
    key_ = bench::fill_key(n);
    const bench::ArraySet a = arrays();
    // All but the f32 gradients, which STREAM triad writes first (lanes()).
    for (const bench::Fill& f : bench::fills(a, key_)) {
      if (f.data != a.grad32) limits::fill(f, n);
    }
    return true;
  }

  bench::ArraySet arrays() override { return arrays_->pointers(); }

  // STREAM triad for each thread count, into the f32 gradients, which are
  // then filled.
  std::vector<bench::Lane> lanes(std::size_t n, const bench::Series& series) override {
    const bench::ArraySet a = arrays();
    float* out = static_cast<float*>(a.grad32);
    const float* in = a.state[0] != nullptr ? a.state[0] : a.param;
    std::vector<bench::Lane> lanes;
    for (const int t : threads_) {
      omp_set_num_threads(t);
      const double s = bench::time_median(
          *this, [&] { limits::triad(out, a.param, in, n); }, series);
      lanes.push_back({t, static_cast<double>(n) * 12 / s / 1e9});
    }
    omp_set_num_threads(nproc_);
    limits::fill(bench::grad_fill(a, DType::f32, key_), n);
    return lanes;
  }

  void enter(const bench::Lane& lane) override { omp_set_num_threads(lane.threads); }

  double seconds(const std::function<void()>& f) override { return bench::wall_seconds(f); }

  void memory_only(const Streams& s, const bench::OptimizerEntry& opt) override {
    limits::memory_only(s, static_cast<int>(opt.states.size()));
  }

  void row_started() override { load_ = OtherLoad{}; }
  double other_load() override { return load_.fraction(); }

  int goal_threads() const override { return threads_.empty() ? 0 : threads_.back(); }
  std::string goal_scope() const override {
    const int t = goal_threads();
    return " with " + std::to_string(t) + " thread" + (t == 1 ? "" : "s") + " (" +
           (t >= nproc_ ? "all cores" : "fewer than all cores") + ")";
  }

 private:
  const int nproc_ = omp_get_num_procs();
  std::vector<int> threads_;
  std::size_t max_memory_ = 0;  // 0: 3/4 of MemAvailable
  std::optional<bench::Arrays<shardopt::HostBuffer>> arrays_;
  std::uint64_t key_ = 0;
  OtherLoad load_;
};

namespace {
// "sgd 20, adam 28, ...": every optimizer's fp32 bytes per parameter.
std::string fp32_bytes() {
  std::string list;
  for (const auto& e : bench::optimizers()) {
    if (!list.empty()) list.append(", ");
    list.append(e.name).append(" ").append(
        std::to_string(bench::bytes_per_param(e, bench::kPrecisions[0])));
  }
  return cli::wrap(list, 11);
}
}  // namespace

std::string HostMemory::usage() const {
  return std::string(
             "usage: shardopt-bench-optim [options]\n"
             "\n"
             "Times shardopt's functional optimizers on host memory beside their memory limit,\n"
             "measured in the same run on the same arrays. Runs as one process (also under\n"
             "mpirun -n 1 --bind-to none: by default mpirun binds the rank to one core); OpenMP\n"
             "threads are set per row with omp_set_num_threads.\n"
             "\n"
             "  -s, --sizes LIST        parameter counts, comma-separated, with an optional K, M "
             "or\n"
             "                          G suffix (powers of 1024) (default 1M,4M,16M,64M,256M)\n"
             "  -t, --threads LIST      OpenMP thread counts, comma-separated, or a range A-B\n"
             "                          (default 1-nproc)\n") +
         bench::optimizer_and_precision_usage(program()) +
         "  -n, --reps N            timed repetitions of each series, at least (default 7);\n"
         "                          small sizes run more, about 0.25 s worth, up to 2000\n"
         "  -w, --warmup N          untimed repetitions first (default 2)\n"
         "  -M, --max-memory SIZE   skip sizes whose arrays need more bytes than this\n"
         "                          (K, M, G suffix; default 3/4 of MemAvailable at start)\n"
         "      --json              one JSON object per row on stdout; the rest on stderr\n"
         "  -h, --help              this text\n"
         "\n"
         "Arrays are allocated once per size as shardopt::HostBuffer (2 MiB aligned, huge\n"
         "pages, touched at allocation) and filled with random data (params in [-1,1),\n"
         "states in [0,1e-2), grads in [-1e-2,1e-2)). For each row the step and the limit kernel\n"
         "run alternately, in an order drawn at random per pair, after warm-up; the table\n"
         "shows medians.\n"
         "\n"
         "Columns:\n"
         "  B_pp     bytes per parameter, every read and write counted once; the formula\n"
         "           is printed per row: r = read, w = written, p = fp32 params, g = grads,\n"
         "           the optimizer's state arrays by name (exp_avg, ...), c = the 16-bit\n"
         "           param copy, update = LAMB's direction (two passes). fp32, per\n"
         "           optimizer (sgd with momentum 0.9):\n"
         "           " +
         fp32_bytes() +
         ";\n"
         "           bf16 or f16 mixed: the same (2 B less grad, 2 B copy); fp32 grads with\n"
         "           a bf16 copy: 2 B more.\n"
         "  time_us  median time of one step\n"
         "  GB/s     numel * B_pp / time_us\n"
         "  min-max  GB/s of the slowest and of the fastest step of the row: the spread\n"
         "           over its repetitions (this machine's memory bandwidth moves)\n"
         "  limit    GB/s of the memory-only kernel: the same arrays, the same reads and\n"
         "           in-place writes (every input stream read, every output stream\n"
         "           written: p, states += g * 0; c = the top 16 bits of p), trivial\n"
         "           arithmetic, the same OpenMP threads and static partition, the same\n"
         "           passes, the same accesses (16 elements at a time, every load before\n"
         "           the stores, on the same vector unit: SHARDOPT_CPU_ISA applies),\n"
         "           counted with the same B_pp (its median time; the next min-max is\n"
         "           its spread). The step cannot beat it by more than noise.\n"
         "  stream   GB/s of STREAM triad a[i] = b[i] + s * c[i] over three fp32 arrays of\n"
         "           numel elements, counted 12 B per element (read b, c, write a; STREAM's\n"
         "           24 B per double element are the same bytes).\n"
         "           A reference only: it understates the in-place limit, since its counted\n"
         "           bytes leave out the write-allocate read of a, which an in-place update\n"
         "           does not pay.\n"
         "  ratio    GB/s / limit of the medians: the fraction of the memory limit the\n"
         "           step reaches. Step and limit are timed in pairs, alternately, so\n"
         "           both medians come from the same stretch of the machine's time.\n"
         "  other    CPU time other processes used while the row ran, as a share of all\n"
         "           cores (from /proc/stat); over 5% the row is marked * and its times\n"
         "           are those of a busy machine, not of the kernel.\n"
         "\n"
         "After the table, one line per optimizer and precision gives its smallest ratio at\n"
         ">= 16M params with the most threads measured, beside the goal (>= 0.95), and a\n"
         "last line the verdict with the worst row. Timings are not pass/fail.\n"
         "\n"
         "Exit status: 0 all steps ran, 1 a step or an allocation failed, 2 a bad option.\n"
         "With --json, each row is an object with the keys optimizer, precision, numel,\n"
         "threads, bytes_per_param, time_us, gbps, limit_gbps, stream_gbps, ratio, reps\n"
         "(pairs timed), time_us_min, time_us_max, limit_time_us, limit_time_us_min,\n"
         "limit_time_us_max, gbps_min, gbps_max, limit_gbps_min, limit_gbps_max,\n"
         "other_load (the other column as a fraction, null if unknown).\n";
}

}  // namespace

int main(int argc, char** argv) {
  HostMemory memory;
  return bench::main_of(memory, argc, argv);
}
