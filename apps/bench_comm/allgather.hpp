// shardopt-bench-comm: allgather (collective.hpp says what a description
// holds). Included by collective.hpp.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstring>

#include "../support/bench_mpi.hpp"

namespace bench_comm {

struct Allgather : PerBlock {
  static constexpr const char* name = "allgather";
  static constexpr bool reduces = false;

  // In place: this rank's block already at its place in recv.
  template <class T>
  static void place(const Ctx<T>& c, bool inplace, std::size_t count) {
    if (inplace) std::memcpy(c.recv + c.own(count), c.send, count * sizeof(T));
  }
  template <class T>
  static void shardopt(const Ctx<T>& c, bool inplace, std::size_t count) {
    c.comm.allgather(inplace ? c.so_recv() + c.own(count) : c.so_send(), c.so_recv(), count,
                     c.opt.dtype);
  }
  template <class T>
  static void mpi(const Ctx<T>& c, bool inplace, std::size_t count) {
    const MPI_Datatype t = bench_mpi::raw_mpi_type(c.opt.dtype);
    const int n = static_cast<int>(count);
    if (inplace)
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c.recv, n, t, c.raw);
    else
      MPI_Allgather(c.send, n, t, c.recv, n, t, c.raw);
  }
  // The other blocks read and written (out of place, this rank's own too).
  template <class T>
  static void traffic(const Ctx<T>& c, bool inplace, std::size_t count) {
    c.copy_traffic(count * sizeof(T), !inplace);
  }
  template <class T>
  static void prepare_check(const Ctx<T>& c, bool inplace, std::size_t count) {
    c.fill_input(c.send, count, c.rank, 0);
    c.fill_sentinel(c.recv, used(count, c.nranks));
    if (inplace) c.fill_input(c.recv + c.own(count), count, c.rank, 0);
  }
  template <class T>
  static long long wrong(const Ctx<T>& c, std::size_t count) {
    long long w = 0;
    for (int q = 0; q < c.nranks; ++q)
      w += c.count_wrong_copied(c.recv + static_cast<std::size_t>(q) * count, count, q, 0);
    return w;
  }
};

}  // namespace bench_comm
