// The transport auto chooses per operation and size on one node
// (lib/comm/shm/shm_backend.cpp, mpi_is_faster): the blocking operations
// MPI was measured faster at go to MPI's own blocking call, with the same
// bits as shared memory gives, and nothing else does.
//
// The calls are counted through MPI's profiling interface: this program
// defines MPI_Bcast, MPI_Allgather and MPI_Allreduce, which count and call
// PMPI_*, so that the library's calls are seen where MPI receives them.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/config.hpp"
#include "shardopt/half.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {
std::atomic<long> g_bcasts{0}, g_allgathers{0}, g_allreduces{0};
}  // namespace

extern "C" int MPI_Bcast(void* buf, int count, MPI_Datatype t, int root, MPI_Comm comm) {
  g_bcasts.fetch_add(1);
  return PMPI_Bcast(buf, count, t, root, comm);
}
extern "C" int MPI_Allgather(const void* send, int scount, MPI_Datatype st, void* recv, int rcount,
                             MPI_Datatype rt, MPI_Comm comm) {
  g_allgathers.fetch_add(1);
  return PMPI_Allgather(send, scount, st, recv, rcount, rt, comm);
}
extern "C" int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype t, MPI_Op op,
                             MPI_Comm comm) {
  g_allreduces.fetch_add(1);
  return PMPI_Allreduce(send, recv, count, t, op, comm);
}

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

// World()'s transport (auto, unless SHARDOPT_HOST_COMM says otherwise) is
// compared with a communicator of the same ranks that keeps every operation
// on shared memory; null where world() does not use shared memory (one
// rank, several nodes, SHARDOPT_HOST_COMM=mpi): nothing is chosen per size.
std::unique_ptr<Communicator> slots_only() {
  if (!all_ranks_true(std::string(world().backend_name()) == "shm")) return nullptr;
  return std::make_unique<Communicator>(MPI_COMM_WORLD, CommOptions{.host_comm = HostComm::shm});
}

// Random bytes of a floating type (bf16 values drawn as such), per rank.
std::vector<std::byte> random_bytes(int rank, std::size_t count, DType t, std::uint64_t stream) {
  std::mt19937_64 rng = rank_rng(rank, stream);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<std::byte> out(count * dtype_size(t));
  for (std::size_t i = 0; i < count; ++i) {
    const float x = d(rng);
    if (t == DType::bf16) {
      const bfloat16 h = bf16_from_float(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &x, 4);
    }
  }
  return out;
}

// How many of `counter`'s calls fn() makes on this rank.
template <class F>
long calls_of(const std::atomic<long>& counter, F&& fn) {
  const long before = counter.load();
  fn();
  return counter.load() - before;
}

}  // namespace

TEST_CASE("auto's choice per operation and size", "[comm][shm][choice]") {
  const std::unique_ptr<Communicator> shm = slots_only();
  if (!shm) {
    SUCCEED("host buffers move by " << world().backend_name() << ": no choice per size");
    return;
  }
  Communicator& w = world();
  SECTION("the same bits as shared memory alone") {
    const int n = w.size(), me = w.rank();
    std::uint64_t stream = 9000;
    bool same = true;
    for (std::size_t bytes : {4 * KiB, 60 * KiB, 64 * KiB, 256 * KiB, 260 * KiB, MiB, MiB + 64}) {
      // broadcast from the last rank
      const std::vector<std::byte> mine = random_bytes(me, bytes / 4, DType::f32, ++stream);
      std::vector<std::byte> a = mine, b = mine;
      w.broadcast(a.data(), bytes / 4, DType::f32, n - 1);
      shm->broadcast(b.data(), bytes / 4, DType::f32, n - 1);
      same = same && a == b;
      // allgather of `bytes` in all, out of place and in place
      const std::size_t block = std::max<std::size_t>(1, bytes / 4 / n);
      const std::vector<std::byte> part = random_bytes(me, block, DType::f32, ++stream);
      a.assign(block * n * 4, std::byte{0});
      b = a;
      w.allgather(part.data(), a.data(), block, DType::f32);
      shm->allgather(part.data(), b.data(), block, DType::f32);
      same = same && a == b;
      std::memcpy(a.data() + me * block * 4, part.data(), block * 4);
      std::memcpy(b.data() + me * block * 4, part.data(), block * 4);
      w.allgather(a.data() + me * block * 4, a.data(), block, DType::f32);
      shm->allgather(b.data() + me * block * 4, b.data(), block, DType::f32);
      same = same && a == b;
      // allreduce in place: f32 and bf16, sum and average
      for (DType t : {DType::f32, DType::bf16}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          const std::size_t count = bytes / dtype_size(t);
          a = random_bytes(me, count, t, ++stream);
          b = a;
          w.allreduce(a.data(), a.data(), count, t, op);
          shm->allreduce(b.data(), b.data(), count, t, op);
          same = same && a == b;
        }
      }
    }
    CHECK(all_ranks_true(same));
  }
  SECTION("the blocking operations MPI was measured faster at go to MPI's own call") {
    const int n = w.size();
    // Only auto chooses; SHARDOPT_HOST_COMM=shm keeps everything on the slots.
    const bool chooses = settings().host_comm == HostComm::automatic;
    std::vector<float> buf(4 * MiB / 4, 1.0f), out(4 * MiB / 4);
    std::vector<bfloat16> half(MiB / 2, bf16_from_float(1.0f));
    // MPI_Bcast, MPI_Allreduce or MPI_Allgather calls of op on world() beyond
    // those of the same op on shared memory alone (the argument checks may
    // make calls of their own, the same on both).
    auto through_mpi = [&](const std::atomic<long>& counter, auto&& op) {
      return calls_of(counter, [&] { op(w); }) - calls_of(counter, [&] { op(*shm); });
    };
    auto bcast = [&](std::size_t bytes) {
      return through_mpi(
          g_bcasts, [&](Communicator& c) { c.broadcast(buf.data(), bytes / 4, DType::f32, 0); });
    };
    // Broadcast: at 2 ranks from 64 KiB, at more up to 1 MiB.
    CHECK(all_ranks_true(bcast(4 * KiB) == (chooses && n > 2 ? 1 : 0)));
    CHECK(all_ranks_true(bcast(MiB) == (chooses ? 1 : 0)));
    CHECK(all_ranks_true(bcast(4 * MiB) == (chooses && n == 2 ? 1 : 0)));
    // Allreduce: in place at 2 ranks from 256 KiB to 16 MiB, but not the
    // average of 16-bit floats (MPI rounds it twice).
    const long in_place = through_mpi(g_allreduces, [&](Communicator& c) {
      c.allreduce(buf.data(), buf.data(), MiB / 4, DType::f32, ReduceOp::sum);
    });
    const long apart = through_mpi(g_allreduces, [&](Communicator& c) {
      c.allreduce(buf.data(), out.data(), MiB / 4, DType::f32, ReduceOp::sum);
    });
    const long half_avg = through_mpi(g_allreduces, [&](Communicator& c) {
      c.allreduce(half.data(), half.data(), half.size(), DType::bf16, ReduceOp::avg);
    });
    CHECK(all_ranks_true(in_place == (chooses && n == 2 ? 1 : 0) && apart == 0 && half_avg == 0));
    // Allgather: at 4 ranks and more, of 64 to 256 KiB in all.
    const std::size_t block = 128 * KiB / 4 / n;
    const long gather = through_mpi(g_allgathers, [&](Communicator& c) {
      c.allgather(buf.data(), out.data(), block, DType::f32);
    });
    CHECK(all_ranks_true(gather == (chooses && n >= 4 ? 1 : 0)));
    // Non-blocking operations stay on shared memory, whose worker moves them
    // while the caller computes.
    const long nonblocking = through_mpi(g_bcasts, [&](Communicator& c) {
      c.ibroadcast(buf.data(), MiB / 4, DType::f32, 0).wait();
    });
    CHECK(all_ranks_true(nonblocking == 0));
  }
}
