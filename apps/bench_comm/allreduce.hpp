// shardopt-bench-comm: allreduce (collective.hpp says what a description
// holds). Included by collective.hpp.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "../support/bench_mpi.hpp"

namespace bench_comm {

struct Allreduce : WholeBuffer, NothingToPlace {
  static constexpr const char* name = "allreduce";
  static constexpr bool reduces = true;
  static double busbw(int n) { return 2.0 * (n - 1) / n; }
  template <class T>
  static void shardopt(const Ctx<T>& c, bool inplace, std::size_t count) {
    c.comm.allreduce(inplace ? c.so_recv() : c.so_send(), c.so_recv(), count, c.opt.dtype,
                     c.opt.redop);
  }
  template <class T>
  static void mpi(const Ctx<T>& c, bool inplace, std::size_t count) {
    MPI_Allreduce(inplace ? MPI_IN_PLACE : static_cast<const void*>(c.send), c.recv,
                  static_cast<int>(count), bench_mpi::raw_mpi_type(c.opt.dtype),
                  bench_mpi::raw_mpi_op(c.opt.redop), c.raw);
  }
  // A reduce-scatter of this rank's part, then the allgather of the others'.
  template <class T>
  static void traffic(const Ctx<T>& c, bool, std::size_t count) {
    const std::size_t part = count * sizeof(T) / static_cast<std::size_t>(c.nranks);
    c.reduce_traffic(part, reinterpret_cast<unsigned char*>(c.recv) + c.own(part));
    c.copy_traffic(part, false);
  }
  template <class T>
  static void prepare_check(const Ctx<T>& c, bool inplace, std::size_t count) {
    c.fill_input(c.send, count, c.rank, 0);
    if (inplace)
      c.fill_input(c.recv, count, c.rank, 0);
    else
      c.fill_sentinel(c.recv, count);
  }
  template <class T>
  static long long wrong(const Ctx<T>& c, std::size_t count) {
    return c.count_wrong_reduced(c.recv, count, 0);
  }
};

}  // namespace bench_comm
