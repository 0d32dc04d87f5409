// shardopt-bench-comm: shardopt's collectives beside the same raw MPI calls.
//
// For each collective and buffer size it times shardopt and the MPI call that
// does the same thing, on the same buffers, one iteration of each in turn (so
// that drift of a shared machine falls on both alike), and prints the table
// nccl-tests users know: size, count, type, redop, then for out-of-place and
// in-place the median time of the slowest rank, algorithm and bus bandwidth,
// the number of wrong elements of one checked run, the MPI time and the ratio
// MPI time / shardopt time.
//
//   mpirun -n 2 shardopt-bench-comm -b 1K -e 64M -f 2
//
// Uses only the public API of shardopt, MPI and the standard library.
#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "report.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using cli::bad_value;
using cli::OptionSpec;
using cli::parse_int;
using cli::UsageError;
using report::Stats;
using report::stats_of;

using shardopt::DType;
using shardopt::ReduceOp;

constexpr const char* kProgram = "shardopt-bench-comm";

// The ratio goal applies to sizes of at least this many bytes.
constexpr std::size_t kGoalBytes = 64 * 1024;
constexpr double kGoalRatio = 0.98;
// Small sizes run more iterations than -n: about this long per timed series,
// up to kMaxScaledIters iterations.
constexpr double kSeriesBudgetS = 0.1;
constexpr int kMaxScaledIters = 1000;
// Seed of the input data; rank r's data is a function of (seed, r, index).
constexpr std::uint64_t kSeed = 0x243f6a8885a308d3ULL;

// ---------------------------------------------------------------------------
// Collectives

enum class Collective { allreduce, reduce_scatter, allgather, broadcast };
constexpr Collective kAllCollectives[] = {Collective::allreduce, Collective::reduce_scatter,
                                          Collective::allgather, Collective::broadcast};

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::allreduce:
      return "allreduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::allgather:
      return "allgather";
    case Collective::broadcast:
      return "broadcast";
  }
  return "?";
}

bool is_reduction(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce_scatter;
}

// nccl-tests' bus bandwidth factors: the fraction of the data each rank's
// link must carry for an optimal algorithm.
double busbw_factor(Collective c, int n) {
  switch (c) {
    case Collective::allreduce:
      return 2.0 * (n - 1) / n;
    case Collective::reduce_scatter:
    case Collective::allgather:
      return static_cast<double>(n - 1) / n;
    case Collective::broadcast:
      return 1.0;
  }
  return 1.0;
}

// ---------------------------------------------------------------------------
// Options

struct Options {
  std::size_t min_bytes = 1024;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::size_t factor = 4;
  int warmup = 5;
  int iters = 20;
  DType dtype = DType::f32;
  ReduceOp redop = ReduceOp::sum;
  std::vector<Collective> ops{std::begin(kAllCollectives), std::end(kAllCollectives)};
  int root = 0;
  bool check = true;
  bool json = false;
  bool help = false;
};

// A bad command line; every rank parses the same argv and throws the same one.
constexpr const char* kUsage =
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
    "beside the goal (>= 0.98), and a last line the total #wrong (on stderr with --json).\n"
    "\n"
    "Exit status: 0 all results right, 1 a wrong result or an error, 2 a bad option.\n"
    "With --json, rank 0 prints one object per row with the keys op, bytes, count, dtype,\n"
    "redop, ranks, inplace, iters, time_us, min_us, max_us, algbw_gbps, busbw_gbps,\n"
    "mpi_time_us, mpi_min_us, mpi_max_us, ratio, wrong (null when -c 0).\n";

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
  } else if (name == "help") {
    o.help = true;
  }
}

// Parses argv the same way on every rank; throws UsageError.
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

// ---------------------------------------------------------------------------
// Element types

// The largest magnitude M such that every integer in [-M, M] is exact in T.
template <class T>
constexpr std::int64_t exact_integer_limit() {
  if constexpr (std::is_same_v<T, float>) {
    return std::int64_t{1} << 24;
  } else if constexpr (std::is_same_v<T, double>) {
    return std::int64_t{1} << 53;
  } else if constexpr (std::is_same_v<T, shardopt::bfloat16>) {
    return 256;
  } else if constexpr (std::is_same_v<T, shardopt::float16>) {
    return 2048;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return std::numeric_limits<std::int32_t>::max();
  } else {
    return std::int64_t{1} << 62;
  }
}

// Exact for |v| <= exact_integer_limit<T>().
template <class T>
T from_integer(std::int64_t v) {
  if constexpr (std::is_same_v<T, shardopt::bfloat16>) {
    return shardopt::bf16_from_float(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, shardopt::float16>) {
    return shardopt::f16_from_float(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// A value outside every input and result: NaN for floating types, the most
// negative value for integers. Output buffers are filled with it before the
// checked run, so an element the collective did not write is counted wrong.
template <class T>
T sentinel() {
  if constexpr (std::is_same_v<T, shardopt::bfloat16>) {
    return shardopt::bfloat16{0x7fc0};
  } else if constexpr (std::is_same_v<T, shardopt::float16>) {
    return shardopt::float16{0x7e00};
  } else if constexpr (std::is_floating_point_v<T>) {
    return std::numeric_limits<T>::quiet_NaN();
  } else {
    return std::numeric_limits<T>::min();
  }
}

template <class T>
bool equals_integer(T got, std::int64_t expected) {
  if constexpr (std::is_same_v<T, shardopt::bfloat16> || std::is_same_v<T, shardopt::float16>) {
    return shardopt::to_float(got) == static_cast<float>(expected);
  } else if constexpr (std::is_floating_point_v<T>) {
    return got == static_cast<T>(expected);  // NaN never equals
  } else {
    return static_cast<std::int64_t>(got) == expected;
  }
}

MPI_Datatype raw_mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;  // no MPI type: a timing reference only
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op raw_mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;  // MPI has no average
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// ---------------------------------------------------------------------------
// Input data

std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Rank r's input element i is value(r, i): a random integer u in
// [-range, range] times `scale`, zero unless (i + r) % stride == 0. Any rank
// can compute any rank's input, so each checks its output on its own.
//
// The range is chosen so that every partial sum over the ranks is an integer
// exact in the type, whatever the order of the reduction: for sum, ranks *
// range <= limit; for avg, inputs are multiples of the number of ranks
// (scale = ranks), so the average sum / ranks is the integer sum of the u.
// Where even range 1 is too much (bf16 beyond 256 ranks), only every
// stride-th rank contributes to an element.
class InputData {
 public:
  InputData(int nranks, std::int64_t exact_limit, ReduceOp op) {
    scale_ = op == ReduceOp::avg ? nranks : 1;
    const std::int64_t per_term = exact_limit / (static_cast<std::int64_t>(nranks) * scale_);
    if (per_term >= 1) {
      range_ = per_term;
    } else {
      const std::int64_t terms = std::max<std::int64_t>(1, exact_limit / scale_);
      stride_ = (nranks + terms - 1) / terms;
    }
    keys_.resize(static_cast<std::size_t>(nranks));
    for (int r = 0; r < nranks; ++r) keys_[r] = mix64(kSeed ^ mix64(static_cast<std::uint64_t>(r)));
  }

  std::int64_t value(int rank, std::size_t i) const {
    if (stride_ > 1 && (i + static_cast<std::size_t>(rank)) % stride_ != 0) return 0;
    const std::uint64_t h = mix64(keys_[rank] + i);
    const auto span = static_cast<std::uint64_t>(2 * range_ + 1);
    // Multiply-shift maps the top 32 bits onto [0, span) without a division.
    const std::uint64_t u = span <= (std::uint64_t{1} << 32) ? ((h >> 32) * span) >> 32 : h % span;
    return (static_cast<std::int64_t>(u) - range_) * scale_;
  }

 private:
  std::int64_t range_ = 1;
  std::int64_t scale_ = 1;
  std::int64_t stride_ = 1;
  std::vector<std::uint64_t> keys_;
};

// ---------------------------------------------------------------------------
// Timing

struct Row {
  Collective op;
  std::size_t nominal_bytes;  // the size asked for
  std::size_t bytes;          // the size moved: the count times elem (times ranks)
  std::size_t count;          // elements per rank block (allreduce, broadcast: all)
  bool inplace;
  int iters;
  Stats so, mpi;
  long long wrong;  // -1: not checked
};

double algbw_gbps(const Row& r) {
  return r.so.median_us > 0 ? static_cast<double>(r.bytes) / (r.so.median_us * 1e-6) / 1e9 : 0.0;
}
double ratio_of(const Row& r) { return r.so.median_us > 0 ? r.mpi.median_us / r.so.median_us : 0; }

// ---------------------------------------------------------------------------
// The benchmark of one element type

template <class T>
class Bench {
 public:
  Bench(const Options& opt, shardopt::Communicator& comm, MPI_Comm raw, MPI_Comm timing, void* send,
        void* recv)
      : opt_(opt),
        comm_(comm),
        raw_(raw),
        timing_(timing),
        rank_(comm.rank()),
        nranks_(comm.size()),
        send_(static_cast<T*>(send)),
        recv_(static_cast<T*>(recv)),
        data_(comm.size(), exact_integer_limit<T>(), opt.redop) {
    fill_input(send_, max_elements(), rank_, 0);
  }

  // One row of results for (op, nominal size, variant), or none if the count is 0.
  std::optional<Row> run(Collective op, std::size_t nominal, bool inplace) {
    const std::size_t n = static_cast<std::size_t>(nranks_);
    const bool blocked = op == Collective::reduce_scatter || op == Collective::allgather;
    const std::size_t count = blocked ? nominal / (n * sizeof(T)) : nominal / sizeof(T);
    if (count == 0) return std::nullopt;
    Row row{};
    row.op = op;
    row.nominal_bytes = nominal;
    row.count = count;
    row.bytes = count * sizeof(T) * (blocked ? n : 1);
    row.inplace = inplace;

    // Restores the input of an in-place reduction before each iteration, so
    // every iteration reduces the same random data (repeated in-place sums
    // would overflow into inf or wrap around).
    const std::size_t restore = (inplace && is_reduction(op)) ? row.bytes : 0;
    // The data the op sends in place: the root's buffer, this rank's block.
    if (op == Collective::broadcast && rank_ == opt_.root) {
      std::memcpy(recv_, send_, count * sizeof(T));
    }
    if (op == Collective::allgather && inplace) {
      std::memcpy(recv_ + static_cast<std::size_t>(rank_) * count, send_, count * sizeof(T));
    }
    auto prepare = [&] {
      if (restore) std::memcpy(recv_, send_, restore);
    };
    auto run_shardopt = [&] { call_shardopt(op, inplace, count); };
    auto run_mpi = [&] { call_mpi(op, inplace, count); };
    time_pair(prepare, run_shardopt, run_mpi, row);
    row.wrong = opt_.check ? check(op, inplace, count) : -1;
    return row;
  }

 private:
  std::size_t max_elements() const { return opt_.max_bytes / sizeof(T); }

  void call_shardopt(Collective op, bool inplace, std::size_t count) {
    const DType t = opt_.dtype;
    switch (op) {
      case Collective::allreduce:
        comm_.allreduce(inplace ? recv_ : send_, recv_, count, t, opt_.redop);
        break;
      case Collective::reduce_scatter:  // in place: MPI style, the block lands at the start
        comm_.reduce_scatter(inplace ? recv_ : send_, recv_, count, t, opt_.redop);
        break;
      case Collective::allgather:
        comm_.allgather(inplace ? recv_ + static_cast<std::size_t>(rank_) * count : send_, recv_,
                        count, t);
        break;
      case Collective::broadcast:
        comm_.broadcast(recv_, count, t, opt_.root);
        break;
    }
  }

  // The raw calls keep MPI's default error handler (MPI_ERRORS_ARE_FATAL,
  // inherited from MPI_COMM_WORLD): a failure stops the job with MPI's message.
  void call_mpi(Collective op, bool inplace, std::size_t count) {
    const MPI_Datatype t = raw_mpi_type(opt_.dtype);
    const MPI_Op mop = raw_mpi_op(opt_.redop);
    const int c = static_cast<int>(count);
    const void* in = inplace ? MPI_IN_PLACE : static_cast<const void*>(send_);
    switch (op) {
      case Collective::allreduce:
        MPI_Allreduce(in, recv_, c, t, mop, raw_);
        break;
      case Collective::reduce_scatter:
        MPI_Reduce_scatter_block(in, recv_, c, t, mop, raw_);
        break;
      case Collective::allgather:
        if (inplace) {
          MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv_, c, t, raw_);
        } else {
          MPI_Allgather(send_, c, t, recv_, c, t, raw_);
        }
        break;
      case Collective::broadcast:
        MPI_Bcast(recv_, c, t, opt_.root, raw_);
        break;
    }
  }

  // Times shardopt (A) and MPI (B) as A B A B ..., each iteration alone after
  // a barrier; an iteration's time is the slowest rank's.
  template <class Prepare, class A, class B>
  void time_pair(Prepare& prepare, A& run_a, B& run_b, Row& row) {
    auto once = [&](auto& fn) {
      prepare();
      MPI_Barrier(timing_);
      const double t0 = MPI_Wtime();
      fn();
      const double t1 = MPI_Wtime();
      return t1 - t0;
    };
    int iters = opt_.iters;
    if (opt_.warmup > 0) {
      double per_iteration = 0;  // of the last warm-up pair, barrier and restore included
      for (int i = 0; i < opt_.warmup; ++i) {
        const double w0 = MPI_Wtime();
        once(run_a);
        once(run_b);
        per_iteration = (MPI_Wtime() - w0) / 2;
      }
      // Every rank must run the same number of iterations: agree on the estimate.
      MPI_Allreduce(MPI_IN_PLACE, &per_iteration, 1, MPI_DOUBLE, MPI_MAX, timing_);
      const double wanted = per_iteration > 0 ? std::ceil(kSeriesBudgetS / per_iteration) : 1e9;
      const int cap = std::max(opt_.iters, kMaxScaledIters);
      iters = static_cast<int>(
          std::clamp(wanted, static_cast<double>(opt_.iters), static_cast<double>(cap)));
    }
    std::vector<double> t(2 * static_cast<std::size_t>(iters));
    // The order within each pair is drawn at random (the same draw on every
    // rank), so a slowdown that repeats with the iteration's parity cannot
    // fall on one side only.
    std::mt19937 order(12345);
    for (int i = 0; i < iters; ++i) {
      if (order() & 1u) {
        t[i] = once(run_a);
        t[iters + i] = once(run_b);
      } else {
        t[iters + i] = once(run_b);
        t[i] = once(run_a);
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, timing_);
    row.iters = iters;
    row.so = stats_of(std::vector<double>(t.begin(), t.begin() + iters));
    row.mpi = stats_of(std::vector<double>(t.begin() + iters, t.end()));
  }

  void fill_input(T* p, std::size_t count, int rank, std::size_t first) const {
    for (std::size_t k = 0; k < count; ++k) p[k] = from_integer<T>(data_.value(rank, first + k));
  }
  static void fill_sentinel(T* p, std::size_t count) { std::fill(p, p + count, sentinel<T>()); }

  // Elements of got[0, count) that differ from the reduction over all ranks
  // of their inputs first .. first + count.
  long long count_wrong_reduced(const T* got, std::size_t count, std::size_t first) const {
    long long wrong = 0;
    const ReduceOp op = opt_.redop;
    for (std::size_t k = 0; k < count; ++k) {
      std::int64_t acc = data_.value(0, first + k);
      for (int q = 1; q < nranks_; ++q) {
        const std::int64_t v = data_.value(q, first + k);
        if (op == ReduceOp::max) {
          acc = std::max(acc, v);
        } else if (op == ReduceOp::min) {
          acc = std::min(acc, v);
        } else {
          acc += v;
        }
      }
      if (op == ReduceOp::avg) acc /= nranks_;  // exact: the inputs are multiples of nranks
      if (!equals_integer(got[k], acc)) ++wrong;
    }
    return wrong;
  }

  // Elements of got[0, count) that differ from rank src's inputs first ...
  long long count_wrong_copied(const T* got, std::size_t count, int src, std::size_t first) const {
    long long wrong = 0;
    for (std::size_t k = 0; k < count; ++k) {
      if (!equals_integer(got[k], data_.value(src, first + k))) ++wrong;
    }
    return wrong;
  }

  // Re-initializes inputs and outputs, runs shardopt once, and returns the
  // number of wrong output elements over all ranks.
  long long check(Collective op, bool inplace, std::size_t count) {
    const std::size_t n = static_cast<std::size_t>(nranks_);
    const std::size_t own = static_cast<std::size_t>(rank_) * count;
    long long wrong = 0;
    switch (op) {
      case Collective::allreduce:
        fill_input(send_, count, rank_, 0);
        if (inplace) {
          fill_input(recv_, count, rank_, 0);
        } else {
          fill_sentinel(recv_, count);
        }
        call_shardopt(op, inplace, count);
        wrong = count_wrong_reduced(recv_, count, 0);
        break;
      case Collective::reduce_scatter:
        fill_input(send_, n * count, rank_, 0);
        if (inplace) {
          fill_input(recv_, n * count, rank_, 0);
        } else {
          fill_sentinel(recv_, count);
        }
        call_shardopt(op, inplace, count);
        wrong = count_wrong_reduced(recv_, count, own);
        break;
      case Collective::allgather:
        fill_input(send_, count, rank_, 0);
        fill_sentinel(recv_, n * count);
        if (inplace) fill_input(recv_ + own, count, rank_, 0);
        call_shardopt(op, inplace, count);
        for (int q = 0; q < nranks_; ++q) {
          wrong += count_wrong_copied(recv_ + static_cast<std::size_t>(q) * count, count, q, 0);
        }
        break;
      case Collective::broadcast:
        if (rank_ == opt_.root) {
          fill_input(recv_, count, rank_, 0);
        } else {
          fill_sentinel(recv_, count);
        }
        call_shardopt(op, inplace, count);
        wrong = count_wrong_copied(recv_, count, opt_.root, 0);
        break;
    }
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, timing_);
    return wrong;
  }

  const Options& opt_;
  shardopt::Communicator& comm_;
  MPI_Comm raw_;     // the raw MPI calls run here
  MPI_Comm timing_;  // barriers and the reductions of times and counts run here
  int rank_;
  int nranks_;
  T* send_;
  T* recv_;
  InputData data_;
};

// ---------------------------------------------------------------------------
// Output

struct Summary {
  double min_ratio = std::numeric_limits<double>::infinity();
  const Row* worst = nullptr;
  long long wrong = 0;
};

// One line of the table, built from printf-style pieces and printed
// without trailing blanks.
class TableLine {
 public:
  __attribute__((format(printf, 2, 3))) void add(const char* format, ...) {
    char piece[256];
    std::va_list args;
    va_start(args, format);
    std::vsnprintf(piece, sizeof piece, format, args);
    va_end(args);
    text_ += piece;
  }
  void print() {
    text_.erase(text_.find_last_not_of(' ') + 1);
    std::printf("%s\n", text_.c_str());
  }

 private:
  std::string text_;
};

void print_header(const Options& o, const shardopt::Communicator& comm, int iters_cap) {
  std::printf("# %s: shardopt collectives beside the same MPI calls\n", kProgram);
  std::printf("# %s\n", shardopt::build_info_string().c_str());
  std::printf("# ranks %d (backend %s), dtype %s, redop %s, root %d, sizes %zu..%zu B (x%zu)\n",
              comm.size(), comm.backend_name(), shardopt::dtype_name(o.dtype),
              shardopt::reduce_op_name(o.redop), o.root, o.min_bytes, o.max_bytes, o.factor);
  std::printf(
      "# warmup %d, iters %d (small sizes: more, about %.0f ms per series, up to %d), "
      "check %s\n",
      o.warmup, o.iters, kSeriesBudgetS * 1e3, iters_cap, o.check ? "on" : "off");
  std::printf(
      "# time: median of the slowest rank; mpi: the same MPI call, timed alternately on "
      "the same buffers; ratio = mpi / time\n");
  if (o.dtype == DType::bf16 || o.dtype == DType::f16) {
    std::printf("# mpi reference for %s: MPI_UINT16_T, integer arithmetic (MPI has no %s type)\n",
                shardopt::dtype_name(o.dtype), shardopt::dtype_name(o.dtype));
  }
  if (o.redop == ReduceOp::avg) {
    std::printf("# mpi reference for avg: MPI_SUM (MPI has no average)\n");
  }
  std::printf("#\n");
  TableLine title;
  title.add("# %-14s %12s %11s %5s %5s  %-54s  %-54s", "", "", "", "", "",
            "                     out-of-place", "                       in-place");
  title.print();
  TableLine names;
  names.add("# %-14s %12s %11s %5s %5s ", "op", "size", "count", "type", "redop");
  TableLine units;
  units.add("# %-14s %12s %11s %5s %5s ", "", "(B)", "(elements)", "", "");
  for (int v = 0; v < 2; ++v) {
    names.add(" %10s %8s %8s %6s %10s %6s ", "time", "algbw", "busbw", "#wrong", "mpi", "ratio");
    units.add(" %10s %8s %8s %6s %10s %6s ", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "");
  }
  names.print();
  units.print();
}

void add_variant(TableLine& line, const Row* r, int nranks) {
  if (r == nullptr) {
    line.add(" %10s %8s %8s %6s %10s %6s ", "-", "-", "-", "-", "-", "-");
    return;
  }
  const double algbw = algbw_gbps(*r);
  char wrong[32];
  if (r->wrong < 0) {
    std::snprintf(wrong, sizeof wrong, "N/A");
  } else {
    std::snprintf(wrong, sizeof wrong, "%lld", r->wrong);
  }
  line.add(" %10.2f %8.3f %8.3f %6s %10.2f %6.3f ", r->so.median_us, algbw,
           algbw * busbw_factor(r->op, nranks), wrong, r->mpi.median_us, ratio_of(*r));
}

void print_line(const Options& o, const Row* out, const Row* in, int nranks) {
  const Row& r = out != nullptr ? *out : *in;
  const char* redop = is_reduction(r.op) ? shardopt::reduce_op_name(o.redop) : "none";
  TableLine line;
  line.add("  %-14s %12zu %11zu %5s %5s ", collective_name(r.op), r.bytes, r.count,
           shardopt::dtype_name(o.dtype), redop);
  add_variant(line, out, nranks);
  add_variant(line, in, nranks);
  line.print();
  std::fflush(stdout);
}

void print_json(const Options& o, const Row& r, int nranks) {
  const double algbw = algbw_gbps(r);
  char wrong[32];
  if (r.wrong < 0) {
    std::snprintf(wrong, sizeof wrong, "null");
  } else {
    std::snprintf(wrong, sizeof wrong, "%lld", r.wrong);
  }
  std::printf(
      "{\"op\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"dtype\":\"%s\",\"redop\":\"%s\",\"ranks\":%d,"
      "\"inplace\":%s,\"iters\":%d,\"time_us\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f,"
      "\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,\"mpi_time_us\":%.3f,\"mpi_min_us\":%.3f,"
      "\"mpi_max_us\":%.3f,\"ratio\":%.4f,\"wrong\":%s}\n",
      collective_name(r.op), r.bytes, r.count, shardopt::dtype_name(o.dtype),
      is_reduction(r.op) ? shardopt::reduce_op_name(o.redop) : "none", nranks,
      r.inplace ? "true" : "false", r.iters, r.so.median_us, r.so.min_us, r.so.max_us, algbw,
      algbw * busbw_factor(r.op, nranks), r.mpi.median_us, r.mpi.min_us, r.mpi.max_us, ratio_of(r),
      wrong);
  std::fflush(stdout);
}

// The sizes of the sweep: min, min*f, ... up to max.
std::vector<std::size_t> sweep_sizes(const Options& o) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    if (s > o.max_bytes / o.factor) break;
    s *= o.factor;
  }
  return sizes;
}

// Runs the whole sweep; returns the exit status.
template <class T>
int run_benchmark(const Options& o, shardopt::Communicator& comm, MPI_Comm raw, MPI_Comm timing,
                  void* send, void* recv) {
  const int rank = comm.rank();
  const int nranks = comm.size();
  const bool printer = rank == 0;
  const bool table = printer && !o.json;
  if (table) print_header(o, comm, std::max(o.iters, kMaxScaledIters));

  Bench<T> bench(o, comm, raw, timing, send, recv);
  const std::vector<std::size_t> sizes = sweep_sizes(o);
  std::deque<Row> rows;  // stable addresses: the summaries point into it
  std::vector<std::pair<Collective, Summary>> summaries;
  long long wrong_total = 0;

  for (Collective op : o.ops) {
    Summary sum;
    for (std::size_t nominal : sizes) {
      // shardopt's broadcast is always in place: it has no out-of-place variant.
      std::optional<Row> out;
      if (op != Collective::broadcast) out = bench.run(op, nominal, false);
      std::optional<Row> in = bench.run(op, nominal, true);
      if (!in) continue;  // the count rounds to 0
      rows.push_back(*in);
      const Row* in_row = &rows.back();
      const Row* out_row = nullptr;
      if (out) {
        rows.push_back(*out);
        out_row = &rows.back();
      }
      for (const Row* r : {out_row, in_row}) {
        if (r == nullptr) continue;
        if (r->wrong > 0) sum.wrong += r->wrong;
        if (r->nominal_bytes >= kGoalBytes && ratio_of(*r) < sum.min_ratio) {
          sum.min_ratio = ratio_of(*r);
          sum.worst = r;
        }
      }
      if (table) print_line(o, out_row, in_row, nranks);
      if (printer && o.json) {
        if (out_row != nullptr) print_json(o, *out_row, nranks);
        print_json(o, *in_row, nranks);
      }
    }
    wrong_total += sum.wrong;
    summaries.emplace_back(op, sum);
  }

  if (printer) {
    // With --json, stdout holds the rows only; the summary goes to stderr.
    std::FILE* f = o.json ? stderr : stdout;
    for (const auto& [op, s] : summaries) {
      if (s.worst == nullptr) {
        std::fprintf(f, "# %s: no sizes >= 64 KiB, no ratio goal to check\n", collective_name(op));
        continue;
      }
      std::fprintf(f,
                   "# %s: min ratio %.3f over sizes >= 64 KiB (goal >= %.2f): %s "
                   "(worst: %zu B %s)\n",
                   collective_name(op), s.min_ratio, kGoalRatio,
                   s.min_ratio >= kGoalRatio ? "met" : "not met", s.worst->bytes,
                   s.worst->inplace ? "in-place" : "out-of-place");
    }
    if (o.check) {
      std::fprintf(f, "# #wrong total: %lld\n", wrong_total);
    } else {
      std::fprintf(f, "# #wrong total: not checked (-c 0)\n");
    }
    std::fflush(f);
  }
  return wrong_total > 0 ? 1 : 0;
}

template <class F>
int with_element_type(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(shardopt::bfloat16{});
    case DType::f16:
      return f(shardopt::float16{});
    case DType::i32:
      return f(std::int32_t{});
    case DType::i64:
      return f(std::int64_t{});
  }
  return 1;
}

// Everything that needs MPI; run_with_mpi's Environment outlives it.
int bench_main(int argc, char** argv) {
  int rank = 0;
  int nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  Options opt;
  try {
    opt = parse_options(argc, argv, nranks);
  } catch (const UsageError& e) {
    cli::print_usage_error(kProgram, rank, e);
    return 2;
  }
  if (opt.help) {
    if (rank == 0) std::fputs(kUsage, stdout);
    return 0;
  }

  // Local setup (settings, buffers) can fail on some ranks only: agree on it
  // before the first collective of shardopt, so that every rank stops.
  std::optional<shardopt::HostBuffer> send;
  std::optional<shardopt::HostBuffer> recv;
  std::string local_error;
  try {
    (void)shardopt::settings();
    const std::size_t bytes = std::max<std::size_t>(opt.max_bytes, 64);
    send.emplace(bytes);
    recv.emplace(bytes);
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  int failed = local_error.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) {
    if (!local_error.empty()) {
      cli::print_error(kProgram, rank, local_error);
    } else {
      cli::print_error(kProgram, rank, "stopping: another rank failed to set up (see its message)");
    }
    return 1;
  }

  // From here on a failure may happen on some ranks only, in the middle of a
  // collective the others are waiting in: abort the job rather than hang.
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    // The raw MPI calls get their own duplicate, as shardopt does. Barriers
    // and reductions of the results run on a third one: a collective that
    // follows a barrier on the same communicator measured up to 1% faster
    // here, which would favour whichever side shared the barrier's.
    MPI_Comm raw = MPI_COMM_NULL;
    MPI_Comm timing = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    MPI_Comm_dup(MPI_COMM_WORLD, &timing);
    const int status = with_element_type(opt.dtype, [&](auto tag) {
      return run_benchmark<decltype(tag)>(opt, comm, raw, timing, send->data(), recv->data());
    });
    MPI_Comm_free(&timing);
    MPI_Comm_free(&raw);
    comm.free();
    return status;
  } catch (const std::exception& e) {
    cli::print_error(kProgram, rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) { return cli::run_with_mpi(kProgram, argc, argv, bench_main); }
