// shardopt-bench-comm: broadcast (collective.hpp says what a description
// holds), always in place, as shardopt's broadcast is. Included by
// collective.hpp.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstring>

#include "../support/bench_mpi.hpp"

namespace bench_comm {

struct Broadcast : WholeBuffer {
  static constexpr const char* name = "broadcast";
  static constexpr bool reduces = false;
  static double busbw(int) { return 1.0; }

  // The root's data in recv.
  template <class T>
  static void place(const Ctx<T>& c, bool, std::size_t count) {
    if (c.rank == c.opt.root) std::memcpy(c.recv, c.send, count * sizeof(T));
  }
  template <class T>
  static void shardopt(const Ctx<T>& c, bool, std::size_t count) {
    c.comm.broadcast(c.so_recv(), count, c.opt.dtype, c.opt.root);
  }
  template <class T>
  static void mpi(const Ctx<T>& c, bool, std::size_t count) {
    MPI_Bcast(c.recv, static_cast<int>(count), bench_mpi::raw_mpi_type(c.opt.dtype), c.opt.root,
              c.raw);
  }
  // Every rank but the root reads and writes the buffer.
  template <class T>
  static void traffic(const Ctx<T>& c, bool, std::size_t count) {
    if (c.rank != c.opt.root) std::memcpy(c.recv, c.send, count * sizeof(T));
  }
  template <class T>
  static void prepare_check(const Ctx<T>& c, bool, std::size_t count) {
    if (c.rank == c.opt.root)
      c.fill_input(c.recv, count, c.rank, 0);
    else
      c.fill_sentinel(c.recv, count);
  }
  template <class T>
  static long long wrong(const Ctx<T>& c, std::size_t count) {
    return c.count_wrong_copied(c.recv, count, c.opt.root, 0);
  }
};

}  // namespace bench_comm
