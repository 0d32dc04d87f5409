// shardopt-bench-comm: the command line (options.hpp).
#include "options.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "../support/cli.hpp"
#include "collective.hpp"

namespace bench_comm {
namespace {

using cli::bad_value;
using cli::OptionSpec;
using cli::parse_int;
using cli::UsageError;

}  // namespace

// A bad command line; every rank parses the same argv and throws the same one.
const char* const kUsage =
    "usage: shardopt-bench-comm [options]\n"
    "\n"
    "Times shardopt's allreduce, reduce_scatter, allgather and broadcast beside the same raw\n"
    "MPI calls, out-of-place and in-place, and checks the results. Run it under mpirun/srun.\n"
    "\n"
    "  -b, --minbytes SIZE    smallest buffer size (default 1K)\n"
    "  -e, --maxbytes SIZE    largest buffer size (default 64M)\n"
    "  -f, --stepfactor N     multiply the size by N from one row to the next, N >= 2\n"
    "                         (default 4; 2 for a full sweep)\n"
    "  -w, --warmup N         untimed iterations of each before timing (default 5)\n"
    "  -n, --iters N          timed iterations of each, at least (default 20); small sizes\n"
    "                         run more, about 0.1 s worth, up to 1000\n"
    "  -d, --dtype T          f32 f64 bf16 f16 i32 i64 (default f32)\n"
    "  -o, --redop OP         sum avg max min (default sum); avg needs a floating -d\n"
    "  -t, --op NAME          allreduce reduce_scatter allgather broadcast all, or a\n"
    "                         comma-separated list (default all)\n"
    "  -r, --root R           root rank of broadcast (default 0)\n"
    "  -c, --check 0|1        check the results (default 1)\n"
    "      --memory M         host or device (default host): where shardopt's buffers are;\n"
    "                         device times the collectives on device buffers (the staged\n"
    "                         backend) against the slower of the same MPI call on pinned\n"
    "                         host buffers and the copies between device and pinned host\n"
    "                         memory\n"
    "      --json             one JSON object per row on stdout instead of the table\n"
    "  -h, --help             this text\n"
    "\n"
    "SIZE is a number of bytes with an optional K, M or G suffix (powers of 1024). As in\n"
    "nccl-tests, SIZE is the total buffer: allreduce and broadcast move SIZE/elem elements;\n"
    "reduce_scatter reduces SIZE bytes into blocks of SIZE/(ranks*elem) elements; allgather\n"
    "gathers blocks of SIZE/(ranks*elem) elements into SIZE bytes. Sizes whose element count\n"
    "rounds to 0 are skipped.\n"
    "\n"
    "Columns: time is the median over iterations of the slowest rank's time (each iteration\n"
    "starts after a barrier); algbw = size / time; busbw = algbw * 2(n-1)/n (allreduce),\n"
    "(n-1)/n (reduce_scatter, allgather), 1 (broadcast); mpi is the median time of the same\n"
    "MPI call (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast, with\n"
    "MPI_IN_PLACE for in-place) on a duplicate of MPI_COMM_WORLD, timed alternately with\n"
    "shardopt on the same buffers; ratio = mpi / time (above 1: shardopt is faster).\n"
    "MPI has no bf16 or f16 type: their MPI reference is MPI_UINT16_T with MPI_SUM/MAX/MIN,\n"
    "integer arithmetic on the bits, a timing reference only. MPI has no average: the MPI\n"
    "reference of avg is MPI_SUM. shardopt's broadcast is always in place, so broadcast has\n"
    "in-place columns only.\n"
    "\n"
    "#wrong: after timing, inputs are re-initialized and shardopt runs once more; #wrong is\n"
    "the number of output elements, over all ranks, that differ from the expected value,\n"
    "which every rank computes by regenerating every rank's inputs. Inputs are random\n"
    "integers small enough that every partial result is exact in the type (for avg,\n"
    "multiples of the number of ranks), so every element must match exactly.\n"
    "\n"
    "After the table, one line per collective gives its smallest ratio over sizes >= 64 KiB\n"
    "beside the goal (>= 0.98; >= 0.8 with --memory device), and a last line the total\n"
    "#wrong (on stderr with --json).\n"
    "\n"
    "Exit status: 0 all results right, 1 a wrong result or an error, 2 a bad option.\n"
    "With --json, rank 0 prints one object per row with the keys op, bytes, count, dtype,\n"
    "redop, ranks, inplace, iters, time_us, min_us, max_us, algbw_gbps, busbw_gbps,\n"
    "mpi_time_us, mpi_min_us, mpi_max_us, ratio, wrong (null when -c 0), backend, memory,\n"
    "nodes, local_ranks (ranks per node; -1 when nodes hold different numbers);\n"
    "with --memory device also copy_time_us (the slower of the copy down and the copy back)\n"
    "and limit_us (the slower of mpi_time_us and copy_time_us); ratio is then limit / time.\n";

namespace {

std::size_t parse_size(const std::string& label, std::string_view s) {
  const auto v = cli::parse_scaled(s, std::numeric_limits<std::uint64_t>::max());
  if (!v) bad_value(label, s, "a positive number of bytes with an optional K, M or G suffix");
  return static_cast<std::size_t>(*v);
}

constexpr OptionSpec kOptionSpecs[] = {
    {'b', "minbytes", true}, {'e', "maxbytes", true}, {'f', "stepfactor", true},
    {'w', "warmup", true},   {'n', "iters", true},    {'d', "dtype", true},
    {'o', "redop", true},    {'t', "op", true},       {'r', "root", true},
    {'c', "check", true},    {0, "json", false},      {'h', "help", false},
    {0, "memory", true},
};

void apply_option(Options& o, const OptionSpec& spec, const std::string& label,
                  std::string_view v) {
  const std::string_view name = spec.long_name;
  if (name == "minbytes") {
    o.min_bytes = parse_size(label, v);
  } else if (name == "maxbytes") {
    o.max_bytes = parse_size(label, v);
  } else if (name == "stepfactor") {
    o.factor = static_cast<std::size_t>(parse_int(label, v, 2, 1 << 20, "an integer >= 2"));
  } else if (name == "warmup") {
    o.warmup = parse_int(label, v, 0, 1 << 24, "an integer >= 0");
  } else if (name == "iters") {
    o.iters = parse_int(label, v, 1, 1 << 24, "an integer >= 1");
  } else if (name == "dtype") {
    constexpr DType kTypes[] = {DType::f32, DType::f64, DType::bf16,
                                DType::f16, DType::i32, DType::i64};
    const auto it = std::find_if(std::begin(kTypes), std::end(kTypes),
                                 [&](DType t) { return v == shardopt::dtype_name(t); });
    if (it == std::end(kTypes)) bad_value(label, v, "f32 f64 bf16 f16 i32 i64");
    o.dtype = *it;
  } else if (name == "redop") {
    constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
    const auto it = std::find_if(std::begin(kOps), std::end(kOps),
                                 [&](ReduceOp op) { return v == shardopt::reduce_op_name(op); });
    if (it == std::end(kOps)) bad_value(label, v, "sum avg max min");
    o.redop = *it;
  } else if (name == "op") {
    constexpr const char* kAccepted =
        "allreduce reduce_scatter allgather broadcast all, or a comma-separated list of them";
    o.ops.clear();
    std::string_view rest = v;
    while (true) {
      const std::size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      if (item == "all") {
        for (Collective c : kAllCollectives) o.ops.push_back(c);
      } else {
        const auto it = std::find_if(std::begin(kAllCollectives), std::end(kAllCollectives),
                                     [&](Collective c) { return item == collective_name(c); });
        if (it == std::end(kAllCollectives)) bad_value(label, v, kAccepted);
        o.ops.push_back(*it);
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    // Each collective once, in the canonical order.
    std::vector<Collective> unique;
    for (Collective c : kAllCollectives) {
      if (std::find(o.ops.begin(), o.ops.end(), c) != o.ops.end()) unique.push_back(c);
    }
    o.ops = std::move(unique);
  } else if (name == "root") {
    o.root = parse_int(label, v, 0, std::numeric_limits<int>::max(), "a rank, 0 to ranks-1");
  } else if (name == "check") {
    o.check = parse_int(label, v, 0, 1, "0 1") == 1;
  } else if (name == "json") {
    o.json = true;
  } else if (name == "memory") {
    if (v != "host" && v != "device") bad_value(label, v, "host device");
    o.device = v == "device";
  } else if (name == "help") {
    o.help = true;
  }
}

}  // namespace

bool wants_device(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--memory=device" ||
        (a == "--memory" && i + 1 < argc && std::string_view(argv[i + 1]) == "device"))
      return true;
  }
  return false;
}

Options parse_options(int argc, char** argv, int nranks) {
  Options o;
  cli::for_each_option(argc, argv, kOptionSpecs,
                       [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
                         apply_option(o, spec, label, v);
                       });
  if (o.help) return o;

  if (o.max_bytes < o.min_bytes) {
    throw UsageError{"-e (--maxbytes) " + std::to_string(o.max_bytes) +
                     " is smaller than -b (--minbytes) " + std::to_string(o.min_bytes)};
  }
  const std::size_t elem = shardopt::dtype_size(o.dtype);
  const std::size_t max_count = static_cast<std::size_t>(std::numeric_limits<int>::max());
  if (o.max_bytes / elem > max_count) {
    throw UsageError{"-e (--maxbytes) " + std::to_string(o.max_bytes) + " is too large for -d " +
                     shardopt::dtype_name(o.dtype) +
                     ": the raw MPI reference takes an int count, so at most " +
                     std::to_string(max_count * elem) + " bytes"};
  }
  if (o.root >= nranks) {
    throw UsageError{"bad value '" + std::to_string(o.root) +
                     "' for -r (--root); accepted: a rank, 0 to " + std::to_string(nranks - 1)};
  }
  const bool reduces = std::any_of(o.ops.begin(), o.ops.end(), is_reduction);
  if (reduces && o.redop == ReduceOp::avg && !shardopt::is_floating(o.dtype)) {
    throw UsageError{std::string("-o (--redop) avg needs a floating -d (--dtype): f32 f64 bf16 "
                                 "f16, not ") +
                     shardopt::dtype_name(o.dtype)};
  }
  return o;
}

}  // namespace bench_comm
