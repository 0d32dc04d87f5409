// shardopt-ckpt: inspect, verify, export, compare and benchmark checkpoint
// files (docs/checkpoint.md, "The shardopt-ckpt tool").
//
//   shardopt-ckpt info ckpt.safetensors
//   mpirun -n 4 shardopt-ckpt verify ckpt.safetensors ckpt.safetensors.1
//   mpirun -n 2 shardopt-ckpt export ckpt.safetensors model.safetensors --dtype bf16
//   shardopt-ckpt diff a.safetensors b.safetensors --rtol 1e-6
//   mpirun -n 2 shardopt-ckpt bench -p 25M -D /scratch/me
//
// Runs alone or under mpirun: the reading is cut into windows of at most
// --window bytes, dealt to the ranks in turn, and each round of windows is
// one collective read, so every rank holds about one window (export also
// holds its share of the output, written with one collective write). Rank 0
// prints. Every error is reported once,
// on stderr, and every rank exits with the same status. Uses only the public
// API of shardopt, MPI, nlohmann-json and the standard library.
//
// This file holds the command line and main(); common.hpp what the
// commands share; info.cpp, verify.cpp, export.cpp, diff.cpp and bench.cpp
// a command each (commands.hpp).
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../support/cli.hpp"
#include "commands.hpp"
#include "common.hpp"

namespace ckpt_tool {
namespace {

using cli::bad_value;
using cli::OptionSpec;
using cli::UsageError;

// ---------------------------------------------------------------------------
// Command lines: COMMAND [options] [operands]

// Splits the words after the command into options (handed to
// cli::for_each_option, which reports unknown ones) and operands; "--" ends
// the options.
template <class Apply>
std::vector<std::string> parse_words(int argc, char** argv, std::span<const OptionSpec> specs,
                                     Apply&& apply) {
  std::vector<char*> options{argv[0]};
  std::vector<std::string> operands;
  auto takes_value = [&](std::string_view arg) {
    for (const OptionSpec& s : specs) {
      if (!s.takes_value) continue;
      if (arg.starts_with("--") && arg.substr(2) == s.long_name) return true;
      if (arg.size() == 2 && s.short_name != 0 && arg[1] == s.short_name) return true;
    }
    return false;
  };
  bool only_operands = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (only_operands || arg.size() < 2 || arg[0] != '-') {
      operands.emplace_back(arg);
    } else if (arg == "--") {
      only_operands = true;
    } else {
      options.push_back(argv[i]);
      if (takes_value(arg) && i + 1 < argc) options.push_back(argv[++i]);
    }
  }
  cli::for_each_option(static_cast<int>(options.size()), options.data(), specs, apply);
  return operands;
}

// A byte count: 64M, 1G, 4096.
u64 parse_bytes(const std::string& label, std::string_view v) {
  const auto n = cli::parse_scaled(v, u64{1} << 40);
  if (!n) bad_value(label, v, "a positive byte count with an optional K, M or G suffix, e.g. 64M");
  return *n;
}

double parse_nonnegative(const std::string& label, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(x) || x < 0) {
    bad_value(label, v, "a finite number >= 0, e.g. 1e-6");
  }
  return x;
}

void expect_operands(const std::vector<std::string>& ops, std::size_t lo, std::size_t hi,
                     const char* what) {
  if (ops.size() < lo || ops.size() > hi) {
    throw UsageError{std::string("expected ") + what + ", got " + std::to_string(ops.size()) +
                     " operand" + (ops.size() == 1 ? "" : "s")};
  }
}

const char* kUsage =
    "usage: shardopt-ckpt COMMAND [options] OPERANDS...\n"
    "       mpirun -n N shardopt-ckpt COMMAND ...   (the reading and writing is shared\n"
    "                                                by the ranks; rank 0 prints)\n"
    "\n"
    "Commands:\n"
    "  info FILE           the header of a checkpoint, an export or any safetensors file:\n"
    "                      size, format and shardopt versions, content, step, optimizer,\n"
    "                      stage, ranks, dtype, checksum chunks, the parameter groups and\n"
    "                      a table of the tensors with totals\n"
    "      --json          one JSON object instead\n"
    "  verify FILE...      reads every byte of every tensor and checks every chunk's\n"
    "                      checksum; prints 'FILE: ok (...)' or the error per file\n"
    "      --allow-unchecksummed  a file without checksums is read through and passes\n"
    "                      (default: an error, there is nothing to verify)\n"
    "  export CKPT OUT     the parameters of checkpoint CKPT (its fp32 master tensors,\n"
    "                      the names of shardopt.params) as a plain export file OUT\n"
    "      -d, --dtype T   f32 (default), bf16 or f16 (rounded to nearest even)\n"
    "      --chunk-bytes SIZE  checksum chunk of OUT (default 1M)\n"
    "  diff A B            compares two files tensor by tensor (only in A, only in B,\n"
    "                      dtype or shape, max abs and rel difference, elements that\n"
    "                      differ) and their metadata (step, optimizer, groups, ...)\n"
    "      --atol X, --rtol Y  equal within |a - b| <= atol + rtol * |b| (b from B);\n"
    "                      without them, equal means bitwise equal\n"
    "      --params-only   only the parameters (the tensors of shardopt.params of A or B,\n"
    "                      all tensors of an export) and the step: a checkpoint against\n"
    "                      its export\n"
    "      -q, --quiet     print only what differs and the summary\n"
    "  bench               times ZeroRedundancyOptimizer::save and load (AdamW, stage 1,\n"
    "                      fp32) beside raw pwrite+fsync and pread of as many bytes in\n"
    "                      the same directory, in the same run\n"
    "      -p, --params LIST  parameter counts, K, M or G suffix (default 25M)\n"
    "      -D, --dir DIR   where to write (default .); the files are removed afterwards\n"
    "      -n, --iters N   timed iterations, the median is shown (default 5)\n"
    "      --warmup N      untimed iterations first (default 1)\n"
    "      --cold          drop the files' pages from the page cache (posix_fadvise)\n"
    "                      before each read: reads come from the device, not from memory\n"
    "      --json          one JSON object per row on stdout; the rest on stderr\n"
    "\n"
    "Options of verify, export and diff:\n"
    "  -w, --window SIZE   bytes a rank reads at a time (default 64M); each rank holds\n"
    "                      about that much (export: also its share of OUT)\n"
    "  -h, --help          this text\n"
    "\n"
    "Exit status: 0 success; 1 a file failed (verify), differs (diff) or an error; 2 a bad\n"
    "command line, and for diff any error (as diff(1)).\n";

// ---------------------------------------------------------------------------
// main

enum class Command { info, verify, export_, diff, bench };

struct Parsed {
  Command command = Command::info;
  std::vector<std::string> operands;
  bool help = false;
  InfoOptions info;
  VerifyOptions verify;
  ExportOptions export_;
  DiffOptions diff;
  BenchOptions bench;
};

Parsed parse_command_line(int argc, char** argv) {
  Parsed p;
  if (argc < 2) throw UsageError{"no command given; commands: info verify export diff bench"};
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    p.help = true;
    return p;
  }
  static constexpr OptionSpec kHelp = {'h', "help", false};
  static constexpr OptionSpec kWindow = {'w', "window", true};
  auto common = [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
    const std::string_view name = spec.long_name;
    if (name == "help") {
      p.help = true;
      return true;
    }
    if (name == "window") {
      const u64 b = parse_bytes(label, v);
      p.verify.window = p.export_.window = p.diff.window = b;
      return true;
    }
    return false;
  };
  if (cmd == "info") {
    p.command = Command::info;
    static constexpr OptionSpec kSpecs[] = {kHelp, {0, "json", false}};
    p.operands = parse_words(argc, argv, kSpecs,
                             [&](const OptionSpec& s, const std::string& l, std::string_view v) {
                               if (!common(s, l, v)) p.info.json = true;
                             });
    if (!p.help) expect_operands(p.operands, 1, 1, "one FILE: info FILE");
  } else if (cmd == "verify") {
    p.command = Command::verify;
    static constexpr OptionSpec kSpecs[] = {kHelp, kWindow, {0, "allow-unchecksummed", false}};
    p.operands = parse_words(argc, argv, kSpecs,
                             [&](const OptionSpec& s, const std::string& l, std::string_view v) {
                               if (!common(s, l, v)) p.verify.allow_unchecksummed = true;
                             });
    if (!p.help) expect_operands(p.operands, 1, SIZE_MAX, "FILE...: verify FILE...");
  } else if (cmd == "export") {
    p.command = Command::export_;
    static constexpr OptionSpec kSpecs[] = {
        kHelp, kWindow, {'d', "dtype", true}, {0, "chunk-bytes", true}};
    p.operands = parse_words(
        argc, argv, kSpecs, [&](const OptionSpec& s, const std::string& l, std::string_view v) {
          if (common(s, l, v)) return;
          if (std::string_view(s.long_name) == "dtype") {
            p.export_.dtype = cli::parse_choice<DType>(
                l, v, {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16}});
          } else {
            p.export_.chunk_bytes = parse_bytes(l, v);
          }
        });
    if (!p.help) expect_operands(p.operands, 2, 2, "CKPT and OUT: export CKPT OUT");
  } else if (cmd == "diff") {
    p.command = Command::diff;
    static constexpr OptionSpec kSpecs[] = {kHelp,
                                            kWindow,
                                            {0, "atol", true},
                                            {0, "rtol", true},
                                            {0, "params-only", false},
                                            {'q', "quiet", false}};
    p.operands = parse_words(argc, argv, kSpecs,
                             [&](const OptionSpec& s, const std::string& l, std::string_view v) {
                               if (common(s, l, v)) return;
                               const std::string_view name = s.long_name;
                               if (name == "atol") p.diff.atol = parse_nonnegative(l, v);
                               if (name == "rtol") p.diff.rtol = parse_nonnegative(l, v);
                               if (name == "params-only") p.diff.params_only = true;
                               if (name == "quiet") p.diff.quiet = true;
                             });
    if (!p.help) expect_operands(p.operands, 2, 2, "two files: diff A B");
  } else if (cmd == "bench") {
    p.command = Command::bench;
    static constexpr OptionSpec kSpecs[] = {kHelp,
                                            {'p', "params", true},
                                            {'D', "dir", true},
                                            {'n', "iters", true},
                                            {0, "warmup", true},
                                            {0, "cold", false},
                                            {0, "json", false}};
    p.operands = parse_words(
        argc, argv, kSpecs, [&](const OptionSpec& s, const std::string& l, std::string_view v) {
          if (common(s, l, v)) return;
          const std::string_view name = s.long_name;
          if (name == "params") {
            p.bench.params.clear();
            for (std::string_view item : cli::split(v)) {
              const auto n = cli::parse_scaled(item, std::uint64_t{1} << 34);
              if (!n || *n < 64) {
                bad_value(l, item,
                          "counts of at least 64 with an optional K, M or G suffix, e.g. 1M,25M");
              }
              p.bench.params.push_back(static_cast<std::size_t>(*n));
            }
          } else if (name == "dir") {
            if (v.empty()) bad_value(l, v, "a directory");
            p.bench.dir = std::string(v);
          } else if (name == "iters") {
            p.bench.iters = cli::parse_int(l, v, 1, 10000, "an integer >= 1");
          } else if (name == "warmup") {
            p.bench.warmup = cli::parse_int(l, v, 0, 10000, "an integer >= 0");
          } else if (name == "cold") {
            p.bench.cold = true;
          } else if (name == "json") {
            p.bench.json = true;
          }
        });
    if (!p.help) expect_operands(p.operands, 0, 0, "no operands: bench [options]");
    if (p.bench.params.empty()) p.bench.params.push_back(std::size_t{25} << 20);
  } else {
    throw UsageError{"unknown command '" + std::string(cmd) +
                     "'; commands: info verify export diff bench"};
  }
  return p;
}

int ckpt_main(int argc, char** argv) {
  World w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);

  Parsed p;
  try {
    p = parse_command_line(argc, argv);
  } catch (const UsageError& e) {
    cli::print_usage_error(kProgram, w.rank, e);
    return 2;
  }
  if (p.help) {
    if (w.rank == 0) std::fputs(kUsage, stdout);
    return 0;
  }

  // Library calls throw the same error on every rank, and local work is
  // agreed on (local()), so the errors above are reported and every rank
  // goes on or stops alike. Anything else may have struck one rank only, in
  // the middle of a collective the others wait in: abort the job rather than
  // hang (cli::ErrorExit: where every rank failed, the job ends normally).
  cli::ErrorExit error_exit;
  const int failed = p.command == Command::diff ? 2 : 1;
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    shardopt::Communicator tool(MPI_COMM_WORLD);
    w.tool = &tool;
    w.comm = tool.mpi_comm();
    int rc = 0;
    switch (p.command) {
      case Command::info:
        rc = run_info(comm, w, p.operands[0], p.info);
        break;
      case Command::verify:
        rc = run_verify(comm, w, p.operands, p.verify);
        break;
      case Command::export_:
        rc = run_export(comm, w, p.operands[0], p.operands[1], p.export_);
        break;
      case Command::diff:
        rc = run_diff(comm, w, p.operands[0], p.operands[1], p.diff);
        break;
      case Command::bench:
        rc = run_bench(comm, w, p.bench);
        break;
    }
    tool.free();
    comm.free();
    return rc;
  } catch (const std::exception& e) {
    return error_exit.end(kProgram, w.rank, cli::error_text(e), failed);
  }
}

}  // namespace
}  // namespace ckpt_tool

int main(int argc, char** argv) {
  return cli::run_with_mpi(ckpt_tool::kProgram, argc, argv, ckpt_tool::ckpt_main);
}
