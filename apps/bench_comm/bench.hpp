// shardopt-bench-comm: the benchmark of one element type: each collective
// of shardopt timed beside the same raw MPI call, and its check.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "../support/bench_mpi.hpp"
#include "../support/report.hpp"
#include "collective.hpp"
#include "data.hpp"
#include "options.hpp"

namespace bench_comm {

using report::Stats;
using report::stats_of;

struct Row {
  Collective op;
  std::size_t nominal_bytes;  // the size asked for
  std::size_t bytes;          // the size moved: the count times elem (times ranks)
  std::size_t count;          // elements per rank block (allreduce, broadcast: all)
  bool inplace;
  int iters;
  Stats so, mpi;
  long long wrong;  // -1: not checked
  bool device;      // --memory device: copy holds the copies' time
  Stats copy;       // the slower of the copy down and the copy back
  Stats floor;      // host: the same traffic without the rest (memory_limit, network_limit)
};

// The time the operation chases: MPI's on host buffers, or with device
// buffers the slower of that and the copies through host memory.
inline double limit_us(const Row& r) {
  return r.device ? std::max(r.mpi.median_us, r.copy.median_us) : r.mpi.median_us;
}

inline double algbw_gbps(const Row& r) {
  return r.so.median_us > 0 ? static_cast<double>(r.bytes) / (r.so.median_us * 1e-6) / 1e9 : 0.0;
}
inline double ratio_of(const Row& r) {
  return r.so.median_us > 0 ? limit_us(r) / r.so.median_us : 0;
}
// Host buffers: the floor's time (memory on one node, network across
// nodes) over shardopt's.
inline double floor_ratio_of(const Row& r) {
  return !r.device && r.so.median_us > 0 ? r.floor.median_us / r.so.median_us : 0;
}

template <class T>
class Bench {
 public:
  // With --memory device, dsend and drecv are device buffers of the size of
  // send and recv: shardopt runs on them, MPI on the host ones.
  Bench(const Options& opt, shardopt::Communicator& comm, MPI_Comm raw, MPI_Comm timing, void* send,
        void* recv, void* dsend = nullptr, void* drecv = nullptr)
      : c_{opt,
           comm,
           raw,
           comm.rank(),
           comm.size(),
           static_cast<T*>(send),
           static_cast<T*>(recv),
           static_cast<T*>(dsend),
           static_cast<T*>(drecv),
           InputData(comm.size(), exact_integer_limit<T>(), opt.redop)},
        opt_(opt),
        timing_(timing) {
    // Several nodes of as many ranks each: the ranks at one place of every
    // node, for network_limit.
    const shardopt::NodeLayout& layout = comm.nodes();
    if (layout.nodes > 1 && layout.uniform)
      MPI_Comm_split(raw, layout.local_rank, layout.node, &inter_);
    c_.fill_input(c_.send, max_elements(), c_.rank, 0);
    c_.upload(c_.dsend, c_.send, max_elements());
  }

  // One row of results for (op, nominal size, variant), or none if the count is 0.
  std::optional<Row> run(Collective op, std::size_t nominal, bool inplace) {
    return with_collective(op, [&]<class C>() { return run<C>(op, nominal, inplace); });
  }

 private:
  template <class C>
  std::optional<Row> run(Collective op, std::size_t nominal, bool inplace) {
    const std::size_t n = static_cast<std::size_t>(c_.nranks);
    const std::size_t count = C::blocked ? nominal / (n * sizeof(T)) : nominal / sizeof(T);
    if (count == 0) return std::nullopt;
    Row row{};
    row.op = op;
    row.nominal_bytes = nominal;
    row.count = count;
    row.bytes = count * sizeof(T) * (C::blocked ? n : 1);
    row.inplace = inplace;
    row.device = c_.dsend != nullptr;

    // Restores the input of an in-place reduction before each iteration, so
    // every iteration reduces the same random data (repeated in-place sums
    // would overflow into inf or wrap around).
    const std::size_t restore = (inplace && C::reduces) ? row.bytes : 0;
    C::place(c_, inplace, count);
    c_.upload(c_.drecv, c_.recv, row.bytes / sizeof(T));
    auto prepare = [&] {
      if (restore) std::memcpy(c_.recv, c_.send, restore);
      if (restore) c_.upload(c_.drecv, c_.send, restore / sizeof(T));
    };
    auto run_shardopt = [&] { C::shardopt(c_, inplace, count); };
    auto run_mpi = [&] { C::mpi(c_, inplace, count); };
    auto run_floor = [&] {
      if (inter_ != MPI_COMM_NULL) {
        network_limit(op, count);
      } else {
        C::traffic(c_, inplace, count);
      }
    };
    const bool floor = !row.device && (inter_ == MPI_COMM_NULL || op != Collective::broadcast);
    time_series(prepare, run_shardopt, run_mpi, floor ? &run_floor : nullptr, row);
    if (row.device) row.copy = time_copies(row.bytes, row.iters);
    row.wrong = opt_.check ? check<C>(inplace, count) : -1;
    return row;
  }

  std::size_t max_elements() const { return opt_.max_bytes / sizeof(T); }

  // The copies a staged operation of `bytes` makes: its input down to host
  // memory, its output back up, each timed alone like the operations; the
  // slower of the two medians' series.
  Stats time_copies(std::size_t bytes, int iters) {
    std::vector<double> down(static_cast<std::size_t>(iters)), up(down.size());
    for (int i = 0; i < iters; ++i) {
      MPI_Barrier(timing_);
      double t0 = MPI_Wtime();
      shardopt::device_copy(c_.recv, c_.dsend, bytes);
      down[std::size_t(i)] = MPI_Wtime() - t0;
      MPI_Barrier(timing_);
      t0 = MPI_Wtime();
      shardopt::device_copy(c_.drecv, c_.send, bytes);
      up[std::size_t(i)] = MPI_Wtime() - t0;
    }
    MPI_Allreduce(MPI_IN_PLACE, down.data(), iters, MPI_DOUBLE, MPI_MAX, timing_);
    MPI_Allreduce(MPI_IN_PLACE, up.data(), iters, MPI_DOUBLE, MPI_MAX, timing_);
    const Stats d = stats_of(down), u = stats_of(up);
    return d.median_us >= u.median_us ? d : u;
  }

  // Across nodes: the bytes the hierarchical algorithm must move between
  // nodes, moved alone (every rank at once, so the nodes' links are shared
  // as in the operation): each rank exchanges a block of count elements
  // (a reduce-scatter's or an allgather's; an allreduce's block is count /
  // ranks, exchanged twice) with the rank at its place on every other node.
  void network_limit(Collective op, std::size_t count) {
    const std::size_t n = static_cast<std::size_t>(c_.nranks);
    std::size_t block = count * sizeof(T);
    int rounds = 1;
    if (op == Collective::allreduce) {
      block = count / n * sizeof(T);
      rounds = 2;
    }
    int me = 0, nodes = 1;
    MPI_Comm_rank(inter_, &me);
    MPI_Comm_size(inter_, &nodes);
    const auto* in = reinterpret_cast<const unsigned char*>(c_.send);
    auto* out = reinterpret_cast<unsigned char*>(c_.recv);
    std::vector<MPI_Request> reqs;
    for (int round = 0; round < rounds; ++round) {
      reqs.clear();
      for (int m = 0, k = 0; m < nodes; ++m) {
        if (m == me) continue;
        reqs.push_back(MPI_REQUEST_NULL);
        MPI_Irecv(out + k * block, static_cast<int>(block), MPI_BYTE, m, 0, inter_, &reqs.back());
        reqs.push_back(MPI_REQUEST_NULL);
        MPI_Isend(in + k * block, static_cast<int>(block), MPI_BYTE, m, 0, inter_, &reqs.back());
        ++k;
      }
      MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
    }
  }

  // Times shardopt (A), MPI (B) and, when given, the memory limit (C) as
  // A B C A B C ..., each iteration alone after a barrier; an iteration's
  // time is the slowest rank's.
  template <class Prepare, class A, class B, class C>
  void time_series(Prepare& prepare, A& run_a, B& run_b, C* run_c, Row& row) {
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
    std::vector<double> t(3 * static_cast<std::size_t>(iters));
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
      if (run_c != nullptr) t[2 * iters + i] = once(*run_c);
    }
    MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, timing_);
    row.iters = iters;
    auto series = [&](int k) {
      return stats_of(std::vector<double>(t.begin() + k * iters, t.begin() + (k + 1) * iters));
    };
    row.so = series(0);
    row.mpi = series(1);
    if (run_c != nullptr) row.floor = series(2);
  }

  // Re-initializes inputs and outputs, runs shardopt once, and returns the
  // number of wrong output elements over all ranks. With device buffers:
  // the inputs go up, shardopt runs, the output comes back, and it is
  // checked on the host.
  template <class C>
  long long check(bool inplace, std::size_t count) {
    const std::size_t used = C::used(count, c_.nranks);
    C::prepare_check(c_, inplace, count);
    c_.upload(c_.dsend, c_.send, used);
    c_.upload(c_.drecv, c_.recv, used);
    C::shardopt(c_, inplace, count);
    c_.download(c_.recv, c_.drecv, used);
    long long wrong = C::wrong(c_, count);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, timing_);
    return wrong;
  }

  Ctx<T> c_;
  const Options& opt_;
  MPI_Comm timing_;                 // barriers and the reductions of times and counts run here
  MPI_Comm inter_ = MPI_COMM_NULL;  // across nodes (network_limit), else null
};

}  // namespace bench_comm
