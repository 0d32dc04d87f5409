// shardopt-bench-comm: what rank 0 prints (output.hpp).
#include "output.hpp"

#include <cstdio>

#include "../support/bench_mpi.hpp"
#include "collective.hpp"

namespace bench_comm {

using bench_mpi::TableLine;

namespace {
// The transport of the benchmarked buffers.
const char* backend_of(const Options& o, const shardopt::Communicator& comm) {
  return o.device ? comm.device_backend_name() : comm.backend_name();
}
}  // namespace

void print_header(const Options& o, const shardopt::Communicator& comm, int iters_cap) {
  std::printf("# %s: shardopt collectives beside the same MPI calls\n", kProgram);
  std::printf("# %s\n", shardopt::build_info_string().c_str());
  std::printf("# ranks %d (backend %s), dtype %s, redop %s, root %d, sizes %zu..%zu B (x%zu)\n",
              comm.size(), backend_of(o, comm), shardopt::dtype_name(o.dtype),
              shardopt::reduce_op_name(o.redop), o.root, o.min_bytes, o.max_bytes, o.factor);
  std::printf("# memory %s%s%s\n", o.device ? "device (" : "host",
              o.device ? shardopt::device_runtime_name() : "", o.device ? ")" : "");
  std::printf(
      "# warmup %d, iters %d (small sizes: more, about %.0f ms per series, up to %d), "
      "check %s\n",
      o.warmup, o.iters, kSeriesBudgetS * 1e3, iters_cap, o.check ? "on" : "off");
  if (o.device)
    std::printf(
        "# time: median of the slowest rank on device buffers; limit: the slower of the same "
        "MPI call on host buffers (timed alternately) and the copies of the data down to "
        "host memory and back, each timed alone; ratio = limit / time\n");
  else
    std::printf(
        "# time: median of the slowest rank; mpi: the same MPI call, timed alternately on "
        "the same buffers; ratio = mpi / time; floor: %s, timed alternately; xfloor = floor / "
        "time\n",
        comm.nodes().nodes > 1
            ? "the bytes the hierarchical algorithm moves between nodes, moved alone (each "
              "rank exchanging its block with the rank at its place on every other node, all "
              "at once)"
            : "the memory traffic the operation needs on every rank at once (read every "
              "rank's slices of its block, write its own: reduce-scatter; read and write the "
              "other blocks: allgather), without communication");
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
    names.add(" %10s %8s %8s %6s %10s %6s %10s %6s ", "time", "algbw", "busbw", "#wrong",
              o.device ? "limit" : "mpi", "ratio", "floor", "xfloor");
    units.add(" %10s %8s %8s %6s %10s %6s %10s %6s ", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "",
              "(us)", "");
  }
  names.print();
  units.print();
}

namespace {

void add_variant(TableLine& line, const Row* r, int nranks) {
  if (r == nullptr) {
    line.add(" %10s %8s %8s %6s %10s %6s %10s %6s ", "-", "-", "-", "-", "-", "-", "-", "-");
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
           algbw * busbw_factor(r->op, nranks), wrong, limit_us(*r), ratio_of(*r));
  if (r->device || r->floor.median_us <= 0) {
    line.add("%10s %6s ", "-", "-");
  } else {
    line.add("%10.2f %6.3f ", r->floor.median_us, floor_ratio_of(*r));
  }
}

}  // namespace

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

void print_json(const Options& o, const Row& r, const shardopt::Communicator& comm) {
  const int nranks = comm.size();
  const double algbw = algbw_gbps(r);
  char extra[160] = "";
  if (r.device)
    std::snprintf(extra, sizeof extra, ",\"copy_time_us\":%.3f,\"limit_us\":%.3f", r.copy.median_us,
                  limit_us(r));
  else
    std::snprintf(extra, sizeof extra, ",\"floor\":\"%s\",\"floor_us\":%.3f,\"floor_ratio\":%.4f",
                  comm.nodes().nodes > 1 ? "network" : "memory", r.floor.median_us,
                  floor_ratio_of(r));
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
      "\"mpi_max_us\":%.3f,\"ratio\":%.4f,\"wrong\":%s,\"backend\":\"%s\",\"memory\":\"%s\","
      "\"nodes\":%d,\"local_ranks\":%d%s}\n",
      collective_name(r.op), r.bytes, r.count, shardopt::dtype_name(o.dtype),
      is_reduction(r.op) ? shardopt::reduce_op_name(o.redop) : "none", nranks,
      r.inplace ? "true" : "false", r.iters, r.so.median_us, r.so.min_us, r.so.max_us, algbw,
      algbw * busbw_factor(r.op, nranks), r.mpi.median_us, r.mpi.min_us, r.mpi.max_us, ratio_of(r),
      wrong, backend_of(o, comm), o.device ? "device" : "host", comm.nodes().nodes,
      comm.nodes().uniform ? comm.nodes().local_ranks : -1, extra);
  std::fflush(stdout);
}

}  // namespace bench_comm
