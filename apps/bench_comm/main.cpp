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
//
// options.cpp: the command line; data.hpp: the inputs and their check;
// bench.hpp: the timing of one element type; output.cpp: what it prints.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../support/bench_mpi.hpp"
#include "../support/cli.hpp"
#include "bench.hpp"
#include "options.hpp"
#include "output.hpp"
#include "shardopt/shardopt.hpp"

namespace bench_comm {
namespace {

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
                  void* send, void* recv, void* dsend, void* drecv) {
  const int rank = comm.rank();
  const int nranks = comm.size();
  const bool printer = rank == 0;
  const bool table = printer && !o.json;
  if (table) print_header(o, comm, std::max(o.iters, kMaxScaledIters));

  Bench<T> bench(o, comm, raw, timing, send, recv, dsend, drecv);
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
        if (!r->device && r->nominal_bytes >= kFloorGoalBytes &&
            floor_ratio_of(*r) < sum.min_floor) {
          sum.min_floor = floor_ratio_of(*r);
          sum.min_mpi_large = std::min(sum.min_mpi_large, ratio_of(*r));
          sum.floor_worst = r;
        } else if (!r->device && r->nominal_bytes >= kFloorGoalBytes) {
          sum.min_mpi_large = std::min(sum.min_mpi_large, ratio_of(*r));
        }
        if (r->nominal_bytes >= kGoalBytes && ratio_of(*r) < sum.min_ratio) {
          sum.min_ratio = ratio_of(*r);
          sum.worst = r;
        }
      }
      if (table) print_line(o, out_row, in_row, nranks);
      if (printer && o.json) {
        if (out_row != nullptr) print_json(o, *out_row, comm);
        print_json(o, *in_row, comm);
      }
    }
    wrong_total += sum.wrong;
    summaries.emplace_back(op, sum);
  }

  if (printer) {
    const double goal = o.device ? kDeviceGoalRatio : kGoalRatio;
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
                   collective_name(op), s.min_ratio, goal, s.min_ratio >= goal ? "met" : "not met",
                   s.worst->bytes, s.worst->inplace ? "in-place" : "out-of-place");
      if (s.floor_worst != nullptr) {
        std::fprintf(f,
                     "# %s: sizes >= 16 MiB: min xfloor %.3f (goal >= %.2f of the %s floor): "
                     "%s (worst: %zu B %s); min ratio to MPI %.2f\n",
                     collective_name(op), s.min_floor, kFloorGoalRatio,
                     comm.nodes().nodes > 1 ? "network" : "memory",
                     s.min_floor >= kFloorGoalRatio ? "met" : "not met", s.floor_worst->bytes,
                     s.floor_worst->inplace ? "in-place" : "out-of-place", s.min_mpi_large);
      }
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

// Calls f(T{}) with the element type T of t.
template <class F>
int with_element_type(DType t, F&& f) {
  using Types =
      std::tuple<float, double, shardopt::bfloat16, shardopt::float16, std::int32_t, std::int64_t>;
  int status = 1;
  // The DType values are the indices of Types.
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((static_cast<std::size_t>(t) == I ? (status = f(std::tuple_element_t<I, Types>{}), 0) : 0),
     ...);
  }
  (std::make_index_sequence<std::tuple_size_v<Types>>{});
  return status;
}

// Everything that needs MPI; run_with_mpi's Environment outlives it.
int bench_main(int argc, char** argv) {
  const bench_mpi::World world = bench_mpi::world();
  const int rank = world.rank, nranks = world.ranks;
  Options opt;
  const auto stop = bench_mpi::parse_or_stop(
      kProgram, rank, opt, [&] { return parse_options(argc, argv, nranks); }, kUsage);
  if (stop) return *stop;

  // Local setup (settings, buffers) can fail on some ranks only: agree on it
  // before the first collective of shardopt, so that every rank stops.
  // Host buffers: pre-touched ones, or with device buffers pinned ones (as
  // the staged backend's), which the copies and the MPI reference use.
  std::optional<shardopt::HostBuffer> send;
  std::optional<shardopt::HostBuffer> recv;
  shardopt::PinnedBuffer psend, precv;
  shardopt::DeviceBuffer dsend, drecv;
  std::string local_error;
  try {
    (void)shardopt::settings();
    const std::size_t bytes = std::max<std::size_t>(opt.max_bytes, 64);
    if (opt.device) {
      psend = shardopt::PinnedBuffer(bytes);
      precv = shardopt::PinnedBuffer(bytes);
      dsend = shardopt::DeviceBuffer(bytes);
      drecv = shardopt::DeviceBuffer(bytes);
    } else {
      send.emplace(bytes);
      recv.emplace(bytes);
    }
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

  return bench_mpi::run_or_abort(kProgram, rank, bench_mpi::Hint::omitted, [&] {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    bench_mpi::Comms comms = bench_mpi::Comms::duplicate();
    const int status = with_element_type(opt.dtype, [&](auto tag) {
      return run_benchmark<decltype(tag)>(
          opt, comm, comms.raw, comms.timing, opt.device ? psend.data() : send->data(),
          opt.device ? precv.data() : recv->data(), dsend.data(), drecv.data());
    });
    comms.free();
    comm.free();
    return status;
  });
}

}  // namespace
}  // namespace bench_comm

int main(int argc, char** argv) {
  // Device buffers go through the staged backend, whose progress thread
  // needs MPI_THREAD_MULTIPLE.
  const shardopt::ThreadLevel level = bench_comm::wants_device(argc, argv)
                                          ? shardopt::ThreadLevel::multiple
                                          : shardopt::required_thread_level;
  return cli::run_with_mpi(bench_comm::kProgram, argc, argv, bench_comm::bench_main, level);
}
