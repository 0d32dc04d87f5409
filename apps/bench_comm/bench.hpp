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

#include "../bench_mpi.hpp"
#include "../report.hpp"
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
      : opt_(opt),
        comm_(comm),
        raw_(raw),
        timing_(timing),
        rank_(comm.rank()),
        nranks_(comm.size()),
        send_(static_cast<T*>(send)),
        recv_(static_cast<T*>(recv)),
        dsend_(static_cast<T*>(dsend)),
        drecv_(static_cast<T*>(drecv)),
        data_(comm.size(), exact_integer_limit<T>(), opt.redop) {
    // Several nodes of as many ranks each: the ranks at one place of every
    // node, for network_limit.
    const shardopt::NodeLayout& layout = comm.nodes();
    if (layout.nodes > 1 && layout.uniform)
      MPI_Comm_split(raw, layout.local_rank, layout.node, &inter_);
    fill_input(send_, max_elements(), rank_, 0);
    upload(dsend_, send_, max_elements());
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
    row.device = dsend_ != nullptr;

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
    upload(drecv_, recv_, row.bytes / sizeof(T));
    auto prepare = [&] {
      if (restore) std::memcpy(recv_, send_, restore);
      if (restore) upload(drecv_, send_, restore / sizeof(T));
    };
    auto run_shardopt = [&] { call_shardopt(op, inplace, count); };
    auto run_mpi = [&] { call_mpi(op, inplace, count); };
    auto run_floor = [&] {
      if (inter_ != MPI_COMM_NULL) {
        network_limit(op, count);
      } else {
        memory_limit(op, inplace, count);
      }
    };
    const bool floor = !row.device && (inter_ == MPI_COMM_NULL || op != Collective::broadcast);
    time_series(prepare, run_shardopt, run_mpi, floor ? &run_floor : nullptr, row);
    if (row.device) row.copy = time_copies(row.bytes, row.iters);
    row.wrong = opt_.check ? check(op, inplace, count) : -1;
    return row;
  }

 private:
  std::size_t max_elements() const { return opt_.max_bytes / sizeof(T); }

  // n elements from host to device (nothing without device buffers).
  static void upload(T* dev, const T* host, std::size_t n) {
    if (dev != nullptr) shardopt::device_copy(dev, host, n * sizeof(T));
  }

  // The copies a staged operation of `bytes` makes: its input down to host
  // memory, its output back up, each timed alone like the operations; the
  // slower of the two medians' series.
  Stats time_copies(std::size_t bytes, int iters) {
    std::vector<double> down(static_cast<std::size_t>(iters)), up(down.size());
    for (int i = 0; i < iters; ++i) {
      MPI_Barrier(timing_);
      double t0 = MPI_Wtime();
      shardopt::device_copy(recv_, dsend_, bytes);
      down[std::size_t(i)] = MPI_Wtime() - t0;
      MPI_Barrier(timing_);
      t0 = MPI_Wtime();
      shardopt::device_copy(drecv_, send_, bytes);
      up[std::size_t(i)] = MPI_Wtime() - t0;
    }
    MPI_Allreduce(MPI_IN_PLACE, down.data(), iters, MPI_DOUBLE, MPI_MAX, timing_);
    MPI_Allreduce(MPI_IN_PLACE, up.data(), iters, MPI_DOUBLE, MPI_MAX, timing_);
    const Stats d = stats_of(down), u = stats_of(up);
    return d.median_us >= u.median_us ? d : u;
  }

  void call_shardopt(Collective op, bool inplace, std::size_t count) {
    const DType t = opt_.dtype;
    // With device buffers, shardopt runs on their copies.
    T* send_ = dsend_ != nullptr ? dsend_ : this->send_;
    T* recv_ = drecv_ != nullptr ? drecv_ : this->recv_;
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
    const MPI_Datatype t = bench_mpi::raw_mpi_type(opt_.dtype);
    const MPI_Op mop = bench_mpi::raw_mpi_op(opt_.redop);
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

  // The memory traffic the operation must make on this rank, with trivial
  // arithmetic and no communication (every rank at once, so the node's
  // memory bandwidth is shared as in the operation): its time is the limit
  // of a collective through memory the ranks share (docs/perf: a
  // reduce-scatter reads the S bytes of every rank's slices of its block and
  // writes its S / N; an allgather reads and writes the S - S / N of the
  // other blocks; an allreduce both; a broadcast reads and writes S on each
  // rank but the root; out of place, an allgather also copies this rank's
  // own block). Bytes XORed: the inputs' values do not matter.
  void memory_limit(Collective op, bool inplace, std::size_t count) {
    const std::size_t n = static_cast<std::size_t>(nranks_);
    const std::size_t block = count * sizeof(T);
    const auto* in = reinterpret_cast<const unsigned char*>(send_);
    auto* out = reinterpret_cast<unsigned char*>(recv_);
    auto reduce = [&](std::size_t part, unsigned char* to) {
      constexpr std::size_t kTile = 4096;
      for (std::size_t t = 0; t < part; t += kTile) {
        const std::size_t len = std::min(kTile, part - t);
        unsigned char* __restrict d = to + t;
        const unsigned char* __restrict s0 = in + t;
        for (std::size_t i = 0; i < len; ++i) d[i] = s0[i];
        for (std::size_t q = 1; q < n; ++q) {
          const unsigned char* __restrict s = in + q * part + t;
          for (std::size_t i = 0; i < len; ++i) d[i] ^= s[i];
        }
      }
    };
    auto copy_others = [&](std::size_t part, bool own) {
      for (std::size_t q = 0; q < n; ++q)
        if (own || q != static_cast<std::size_t>(rank_))
          std::memcpy(out + q * part, in + q * part, part);
    };
    switch (op) {
      case Collective::reduce_scatter:
        reduce(block, out);
        break;
      case Collective::allgather:
        copy_others(block, !inplace);
        break;
      case Collective::allreduce: {
        const std::size_t part = block / n;
        reduce(part, out + static_cast<std::size_t>(rank_) * part);
        copy_others(part, false);
        break;
      }
      case Collective::broadcast:
        if (rank_ != opt_.root) std::memcpy(out, in, block);
        break;
    }
  }

  // Across nodes: the bytes the hierarchical algorithm must move between
  // nodes, moved alone (every rank at once, so the nodes' links are shared
  // as in the operation): each rank exchanges a block of count elements
  // (a reduce-scatter's or an allgather's; an allreduce's block is count /
  // ranks, exchanged twice) with the rank at its place on every other node.
  void network_limit(Collective op, std::size_t count) {
    const std::size_t n = static_cast<std::size_t>(nranks_);
    std::size_t block = count * sizeof(T);
    int rounds = 1;
    if (op == Collective::allreduce) {
      block = count / n * sizeof(T);
      rounds = 2;
    }
    int me = 0, nodes = 1;
    MPI_Comm_rank(inter_, &me);
    MPI_Comm_size(inter_, &nodes);
    const auto* in = reinterpret_cast<const unsigned char*>(send_);
    auto* out = reinterpret_cast<unsigned char*>(recv_);
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
    // With device buffers: the inputs go up, shardopt runs, the output comes
    // back, and it is checked on the host.
    const std::size_t used =
        op == Collective::allreduce || op == Collective::broadcast ? count : n * count;
    const auto call_shardopt = [&](Collective o, bool in, std::size_t c) {
      upload(dsend_, send_, used);
      upload(drecv_, recv_, used);
      this->call_shardopt(o, in, c);
      if (drecv_ != nullptr) shardopt::device_copy(recv_, drecv_, used * sizeof(T));
    };
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
  T* dsend_;  // device copies (--memory device), else null
  T* drecv_;
  InputData data_;
  MPI_Comm inter_ = MPI_COMM_NULL;  // across nodes (network_limit), else null
};

}  // namespace bench_comm
