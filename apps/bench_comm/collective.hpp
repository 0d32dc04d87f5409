// shardopt-bench-comm: what every collective's description works on, and
// the choice of a description by name. Each collective is one small file of
// its own (allreduce.hpp, reduce_scatter.hpp, allgather.hpp,
// broadcast.hpp), as nccl-tests gives each collective one: its name, how its
// element count follows from the buffer size, its bus bandwidth factor, and
// four hooks: shardopt's call, the same raw MPI call, the memory traffic of
// its limit, and the check of its result.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "data.hpp"
#include "options.hpp"

namespace bench_comm {

// The buffers and data of one element type, with the helpers the hooks
// share. With --memory device, dsend and drecv are device buffers of the
// size of send and recv: shardopt runs on them, MPI on the host ones.
template <class T>
struct Ctx {
  const Options& opt;
  shardopt::Communicator& comm;
  MPI_Comm raw;  // the raw MPI calls run here
  int rank, nranks;
  T* send;
  T* recv;
  T* dsend;  // device copies (--memory device), else null
  T* drecv;
  InputData data;

  // What shardopt's call moves: the device copies where there are some.
  T* so_send() const { return dsend != nullptr ? dsend : send; }
  T* so_recv() const { return drecv != nullptr ? drecv : recv; }
  std::size_t own(std::size_t count) const { return static_cast<std::size_t>(rank) * count; }

  // n elements between host and device (nothing without device buffers).
  static void upload(T* dev, const T* host, std::size_t n) {
    if (dev != nullptr) shardopt::device_copy(dev, host, n * sizeof(T));
  }
  void download(T* host, const T* dev, std::size_t n) const {
    if (dev != nullptr) shardopt::device_copy(host, dev, n * sizeof(T));
  }

  void fill_input(T* p, std::size_t count, int r, std::size_t first) const {
    for (std::size_t k = 0; k < count; ++k) p[k] = from_integer<T>(data.value(r, first + k));
  }
  static void fill_sentinel(T* p, std::size_t count) { std::fill(p, p + count, sentinel<T>()); }

  // Elements of got[0, count) that differ from the reduction over all ranks
  // of their inputs first .. first + count.
  long long count_wrong_reduced(const T* got, std::size_t count, std::size_t first) const {
    long long wrong = 0;
    const ReduceOp op = opt.redop;
    for (std::size_t k = 0; k < count; ++k) {
      std::int64_t acc = data.value(0, first + k);
      for (int q = 1; q < nranks; ++q) {
        const std::int64_t v = data.value(q, first + k);
        if (op == ReduceOp::max) {
          acc = std::max(acc, v);
        } else if (op == ReduceOp::min) {
          acc = std::min(acc, v);
        } else {
          acc += v;
        }
      }
      if (op == ReduceOp::avg) acc /= nranks;  // exact: the inputs are multiples of nranks
      if (!equals_integer(got[k], acc)) ++wrong;
    }
    return wrong;
  }

  // Elements of got[0, count) that differ from rank src's inputs first ...
  long long count_wrong_copied(const T* got, std::size_t count, int src, std::size_t first) const {
    long long wrong = 0;
    for (std::size_t k = 0; k < count; ++k)
      if (!equals_integer(got[k], data.value(src, first + k))) ++wrong;
    return wrong;
  }

  // The memory traffic of a reduction of `part` bytes from each rank's
  // slice of send into `to`: every slice read, the result written (bytes
  // XORed: the values do not matter).
  void reduce_traffic(std::size_t part, unsigned char* to) const {
    constexpr std::size_t kTile = 4096;
    const auto* in = reinterpret_cast<const unsigned char*>(send);
    for (std::size_t t = 0; t < part; t += kTile) {
      const std::size_t len = std::min(kTile, part - t);
      unsigned char* __restrict d = to + t;
      const unsigned char* __restrict s0 = in + t;
      for (std::size_t i = 0; i < len; ++i) d[i] = s0[i];
      for (std::size_t q = 1; q < static_cast<std::size_t>(nranks); ++q) {
        const unsigned char* __restrict s = in + q * part + t;
        for (std::size_t i = 0; i < len; ++i) d[i] ^= s[i];
      }
    }
  }
  // The copy of every rank's block of `part` bytes (this rank's own too
  // when `own`), from send into recv.
  void copy_traffic(std::size_t part, bool with_own) const {
    const auto* in = reinterpret_cast<const unsigned char*>(send);
    auto* out = reinterpret_cast<unsigned char*>(recv);
    for (std::size_t q = 0; q < static_cast<std::size_t>(nranks); ++q)
      if (with_own || q != static_cast<std::size_t>(rank))
        std::memcpy(out + q * part, in + q * part, part);
  }
};

// What descriptions share. A collective whose count is each rank's block
// (the buffer is ranks x count elements): its link carries (n-1)/n of the
// data (nccl-tests' bus bandwidth factor).
struct PerBlock {
  static constexpr bool blocked = true;
  static double busbw(int n) { return static_cast<double>(n - 1) / n; }
  // The elements of recv the operation uses.
  static std::size_t used(std::size_t count, int n) { return static_cast<std::size_t>(n) * count; }
};
// A collective whose count is the whole buffer's.
struct WholeBuffer {
  static constexpr bool blocked = false;
  static std::size_t used(std::size_t count, int) { return count; }
};
// Nothing to put in place before timing (in place, recv holds the input).
struct NothingToPlace {
  template <class T>
  static void place(const Ctx<T>&, bool, std::size_t) {}
};

}  // namespace bench_comm

#include "allgather.hpp"
#include "allreduce.hpp"
#include "broadcast.hpp"
#include "reduce_scatter.hpp"

namespace bench_comm {

// f.template operator()<C>() with C the description of collective c.
template <class F>
decltype(auto) with_collective(Collective c, F&& f) {
  switch (c) {
    case Collective::reduce_scatter:
      return f.template operator()<ReduceScatter>();
    case Collective::allgather:
      return f.template operator()<Allgather>();
    case Collective::broadcast:
      return f.template operator()<Broadcast>();
    default:
      return f.template operator()<Allreduce>();
  }
}

inline const char* collective_name(Collective c) {
  return with_collective(c, []<class C>() { return C::name; });
}
inline bool is_reduction(Collective c) {
  return with_collective(c, []<class C>() { return C::reduces; });
}
// nccl-tests' bus bandwidth factors: the fraction of the data each rank's
// link must carry for an optimal algorithm.
inline double busbw_factor(Collective c, int n) {
  return with_collective(c, [n]<class C>() { return C::busbw(n); });
}

}  // namespace bench_comm
