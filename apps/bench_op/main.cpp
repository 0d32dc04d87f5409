// shardopt-bench-op: shardopt's bf16 and f16 reduction ops beside MPI's own
// sum of the same bytes.
//
// MPI has no bf16 or f16 type: shardopt's collectives reduce them with
// user-defined MPI ops that convert each element to f32, combine and round
// once (lib/comm/mpi/mpi_types.cpp). MPI calls the op on every chunk it
// reduces, so the op's speed is part of every bf16 reduce-scatter and
// allreduce through MPI. This program times the op alone, through
// MPI_Reduce_local on one process, beside MPI_SUM on MPI_UINT16_T over the
// same bytes (an integer sum: the speed of MPI's own reduction of 16-bit
// words, not the same arithmetic) and MPI_SUM on MPI_FLOAT over half as many
// elements (the same bytes as f32), in pairs timed alternately in a random
// order. It measures an internal part of the library, so unlike the other
// benchmarks it links the static library and its internal header.
//
//   shardopt-bench-op                       # 16K, 256K, 4M, 64M elements
//   shardopt-bench-op -s 1M -n 51 --json
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../support/cli.hpp"
#include "../support/machine.hpp"
#include "../support/report.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "shardopt/build_info.hpp"
#include "shardopt/half.hpp"
#include "shardopt/memory.hpp"

namespace {

constexpr const char* kProgram = "shardopt-bench-op";

struct Options {
  std::vector<std::size_t> sizes = {std::size_t{16} << 10, std::size_t{256} << 10,
                                    std::size_t{4} << 20, std::size_t{64} << 20};
  int reps = 31;
  int warmup = 3;
  // The widest vector path the ops may use (detail::limit_half_ops).
  shardopt::detail::HalfOpPath path = shardopt::detail::half_op_widest();
  bool json = false;
  bool help = false;
};

const char* kUsage =
    "usage: shardopt-bench-op [options]\n"
    "\n"
    "Times shardopt's bf16 and f16 sum ops (the user-defined MPI ops its collectives\n"
    "reduce 16-bit floats with) through MPI_Reduce_local on one process, beside MPI_SUM\n"
    "on MPI_UINT16_T over the same bytes and MPI_SUM on MPI_FLOAT over half as many\n"
    "elements (the same bytes), each pair timed alternately in a random order.\n"
    "\n"
    "  -s, --sizes LIST   16-bit elements per call, comma-separated, with an optional\n"
    "                     K, M or G suffix (default 16K,256K,4M,64M)\n"
    "  -n, --reps N       timed pairs per row (default 31)\n"
    "  -w, --warmup N     untimed pairs first (default 3)\n"
    "  -p, --path NAME    the widest vector path the ops may use: scalar, avx2,\n"
    "                     avx512 or avx512bf16 (default: the widest this CPU runs)\n"
    "      --json         one JSON object per row on stdout; the rest on stderr\n"
    "  -h, --help         this text\n"
    "\n"
    "Columns: type (bf16 or f16), elements, the op's time (median, and min-max over\n"
    "the pairs) and ns per element, MPI_UINT16_T's and MPI_FLOAT's medians, and\n"
    "vs_u16 = MPI_UINT16_T time / the op's time (>= 1: the op is at least as fast as\n"
    "MPI's integer sum of the same bytes). The inputs are random finite values; inout\n"
    "is restored before every call, outside the timing. With --json each row has the\n"
    "keys type, elements, reps, op_us, op_us_min, op_us_max, u16_us, u16_us_min,\n"
    "u16_us_max, f32_us, ns_per_element, vs_u16, vs_f32.\n"
    "Exit status: 0 ran, 1 an MPI call failed, 2 a bad option.\n";

constexpr const char* kPaths[] = {"scalar", "avx2", "avx512", "avx512bf16"};

int path_index(std::string_view name) {
  for (int i = 0; i < 4; ++i)
    if (name == kPaths[i]) return i;
  return -1;
}

Options parse(int argc, char** argv) {
  Options o;
  static constexpr cli::OptionSpec kSpecs[] = {{'s', "sizes", true},  {'n', "reps", true},
                                               {'w', "warmup", true}, {'p', "path", true},
                                               {0, "json", false},    {'h', "help", false}};
  cli::for_each_option(
      argc, argv, kSpecs,
      [&](const cli::OptionSpec& spec, const std::string& label, std::string_view v) {
        const std::string_view name = spec.long_name;
        if (name == "sizes") {
          o.sizes.clear();
          for (std::string_view item : cli::split(v)) {
            const auto n = cli::parse_scaled(item, std::uint64_t{1} << 30);
            if (!n) cli::bad_value(label, v, "counts with a K, M or G suffix");
            o.sizes.push_back(*n);
          }
        } else if (name == "reps") {
          o.reps = cli::parse_int(label, v, 1, 100000, "1 to 100000");
        } else if (name == "warmup") {
          o.warmup = cli::parse_int(label, v, 0, 1000, "0 to 1000");
        } else if (name == "path") {
          const int i = path_index(v);
          if (i < 0) cli::bad_value(label, v, "scalar, avx2, avx512 or avx512bf16");
          o.path = static_cast<shardopt::detail::HalfOpPath>(i);
        } else if (name == "json") {
          o.json = true;
        } else {
          o.help = true;
        }
      });
  return o;
}

double seconds_of(const auto& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Random finite values of the 16-bit type `t`, as bits.
std::vector<std::uint16_t> random_bits(shardopt::DType t, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) {
    const float f = u(rng);
    x = t == shardopt::DType::bf16 ? shardopt::bf16_from_float(f).bits
                                   : shardopt::f16_from_float(f).bits;
  }
  return v;
}

int run(const Options& o) {
  using shardopt::DType;
  FILE* info = o.json ? stderr : stdout;
  shardopt::detail::limit_half_ops(o.path);
  const int widest = static_cast<int>(shardopt::detail::half_op_widest());
  const int used = std::min(static_cast<int>(o.path), widest);
  std::fprintf(info, "# %s: %s\n# machine: %s\n# vector path: %s (widest on this CPU: %s)\n",
               kProgram, shardopt::build_info_string().c_str(), machine::cpu_model().c_str(),
               kPaths[used], kPaths[widest]);
  if (!o.json) {
    std::printf("# %-4s %8s %10s %19s %7s %10s %10s %7s %7s\n", "type", "elements", "op_us",
                "min-max", "ns/el", "u16_us", "f32_us", "vs_u16", "vs_f32");
  }
  std::mt19937_64 order(0x5eed);
  double worst = 1e300, worst_large = 1e300;
  // 128 MiB a buffer: beyond the last-level cache of common nodes.
  constexpr std::size_t kLarge = std::size_t{64} << 20;
  for (const std::size_t n : o.sizes) {
    const int count = static_cast<int>(n);
    shardopt::HostBuffer in(n * 2), inout(n * 2);
    for (const DType t : {DType::bf16, DType::f16}) {
      const std::vector<std::uint16_t> a = random_bits(t, n, 1 + n), b = random_bits(t, n, 2 + n);
      std::memcpy(in.as<void>(), a.data(), n * 2);
      const MPI_Op op = shardopt::detail::mpi_op(t, shardopt::ReduceOp::sum);
      // One timed call of MPI_Reduce_local(in, inout) with inout restored first.
      auto call = [&](MPI_Datatype type, int elements, MPI_Op o2) {
        std::memcpy(inout.as<void>(), b.data(), n * 2);
        return seconds_of([&] {
          if (MPI_Reduce_local(in.as<void>(), inout.as<void>(), elements, type, o2) != MPI_SUCCESS)
            throw std::runtime_error("MPI_Reduce_local failed");
        });
      };
      std::vector<double> t_op, t_u16, t_f32;
      for (int r = 0; r < o.warmup + o.reps; ++r) {
        double x[3];
        int which[3] = {0, 1, 2};
        std::shuffle(which, which + 3, order);
        for (int w : which) {
          x[w] = w == 0   ? call(MPI_UINT16_T, count, op)
                 : w == 1 ? call(MPI_UINT16_T, count, MPI_SUM)
                          : call(MPI_FLOAT, count / 2, MPI_SUM);
        }
        if (r < o.warmup) continue;
        t_op.push_back(x[0]);
        t_u16.push_back(x[1]);
        t_f32.push_back(x[2]);
      }
      const report::Stats s_op = report::stats_of(t_op), s_u16 = report::stats_of(t_u16),
                          s_f32 = report::stats_of(t_f32);
      const double vs_u16 = s_u16.median_us / s_op.median_us;
      const double vs_f32 = s_f32.median_us / s_op.median_us;
      const double ns = s_op.median_us * 1e3 / static_cast<double>(n);
      worst = std::min(worst, vs_u16);
      if (n >= kLarge) worst_large = std::min(worst_large, vs_u16);
      const char* name = t == DType::bf16 ? "bf16" : "f16";
      if (o.json) {
        using report::num;
        std::printf(
            "{\"type\": \"%s\", \"elements\": %zu, \"reps\": %d, \"op_us\": %s, \"op_us_min\": "
            "%s, \"op_us_max\": %s, \"u16_us\": %s, \"u16_us_min\": %s, \"u16_us_max\": %s, "
            "\"f32_us\": %s, \"ns_per_element\": %s, \"vs_u16\": %s, \"vs_f32\": %s}\n",
            name, n, o.reps, num(s_op.median_us, 3).c_str(), num(s_op.min_us, 3).c_str(),
            num(s_op.max_us, 3).c_str(), num(s_u16.median_us, 3).c_str(),
            num(s_u16.min_us, 3).c_str(), num(s_u16.max_us, 3).c_str(),
            num(s_f32.median_us, 3).c_str(), num(ns, 4).c_str(), num(vs_u16, 3).c_str(),
            num(vs_f32, 3).c_str());
      } else {
        char range[48];
        std::snprintf(range, sizeof range, "%.1f-%.1f", s_op.min_us, s_op.max_us);
        std::printf("%-6s %8s %10.2f %19s %7.3f %10.2f %10.2f %7.3f %7.3f\n", name,
                    cli::human_count(n).c_str(), s_op.median_us, range, ns, s_u16.median_us,
                    s_f32.median_us, vs_u16, vs_f32);
      }
      std::fflush(stdout);
    }
  }
  std::fprintf(info, "# smallest vs_u16 (MPI_UINT16_T time / the op's time): %.3f\n", worst);
  // In cache the conversions bound the op; beyond it, memory, as for MPI's sum.
  if (worst_large < 1e300)
    std::fprintf(info, "# goal: vs_u16 >= 1 at >= 64M elements (memory-bound): %.3f, %s\n",
                 worst_large, worst_large >= 0.97 ? "met (within the 3% timing noise)" : "not met");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run_with_mpi(kProgram, argc, argv, [](int ac, char** av) {
    Options o;
    try {
      o = parse(ac, av);
    } catch (const cli::UsageError& e) {
      cli::print_usage_error(kProgram, 0, e);
      return 2;
    }
    if (o.help) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    try {
      return run(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
      return 1;
    }
  });
}
