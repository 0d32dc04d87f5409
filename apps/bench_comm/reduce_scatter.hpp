// shardopt-bench-comm: reduce_scatter (collective.hpp says what a
// description holds). Included by collective.hpp.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "../support/bench_mpi.hpp"

namespace bench_comm {

struct ReduceScatter : PerBlock, NothingToPlace {
  static constexpr const char* name = "reduce_scatter";
  static constexpr bool reduces = true;
  // In place: MPI's form, the block lands at the start of recv.
  template <class T>
  static void shardopt(const Ctx<T>& c, bool inplace, std::size_t count) {
    c.comm.reduce_scatter(inplace ? c.so_recv() : c.so_send(), c.so_recv(), count, c.opt.dtype,
                          c.opt.redop);
  }
  template <class T>
  static void mpi(const Ctx<T>& c, bool inplace, std::size_t count) {
    MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : static_cast<const void*>(c.send), c.recv,
                             static_cast<int>(count), bench_mpi::raw_mpi_type(c.opt.dtype),
                             bench_mpi::raw_mpi_op(c.opt.redop), c.raw);
  }
  // Every rank's slice of this rank's block read, the block written.
  template <class T>
  static void traffic(const Ctx<T>& c, bool, std::size_t count) {
    c.reduce_traffic(count * sizeof(T), reinterpret_cast<unsigned char*>(c.recv));
  }
  template <class T>
  static void prepare_check(const Ctx<T>& c, bool inplace, std::size_t count) {
    const std::size_t all = used(count, c.nranks);
    c.fill_input(c.send, all, c.rank, 0);
    if (inplace)
      c.fill_input(c.recv, all, c.rank, 0);
    else
      c.fill_sentinel(c.recv, count);
  }
  template <class T>
  static long long wrong(const Ctx<T>& c, std::size_t count) {
    return c.count_wrong_reduced(c.recv, count, c.own(count));
  }
};

}  // namespace bench_comm
