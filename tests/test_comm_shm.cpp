// The shared-memory collectives (SHARDOPT_HOST_COMM=shm, the default on one
// node): sums in rank order, bitwise, on random data of every floating
// type; an allreduce adds exactly as a reduce-scatter; counts that cross
// many steps of the channel; non-blocking operations in flight together;
// a forced choice that cannot be used; and the MPI backend kept on request.
// The operations' general results are checked by the other comm tests,
// which run on this backend by default.
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/half.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

// Counts: within one step, across several (1 MiB slots hold 262144 f32
// elements; blocks per step are smaller at more ranks), and odd sizes.
const std::vector<std::size_t> kCounts = {1, 5, 4099, 300007};

// Rank r's random input of `count` elements, as float (exact in every type
// we convert to: bf16 and f16 values are drawn as such).
std::vector<float> input(int r, std::size_t count, DType t, std::uint64_t stream) {
  std::mt19937_64 rng = rank_rng(r, stream);
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  std::vector<float> v(count);
  for (float& x : v) {
    x = d(rng);
    if (t == DType::bf16) x = to_float(bf16_from_float(x));
    if (t == DType::f16) x = to_float(f16_from_float(x));
  }
  return v;
}

// Stored as type t.
std::vector<std::byte> encode(const std::vector<float>& v, DType t) {
  std::vector<std::byte> out(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) std::memcpy(out.data() + 4 * i, &v[i], 4);
    if (t == DType::f64) {
      const double x = v[i];
      std::memcpy(out.data() + 8 * i, &x, 8);
    }
    if (t == DType::bf16) {
      const bfloat16 h = bf16_from_float(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
    if (t == DType::f16) {
      const float16 h = f16_from_float(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// The reduction the shared-memory backend promises, computed here from
// every rank's input: left to right in rank order, in the type's
// arithmetic (f32 for the 16-bit types, rounded once), avg dividing after.
std::vector<std::byte> expected(int ranks, std::size_t count, DType t, ReduceOp op,
                                std::uint64_t stream) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < ranks; ++r) in.push_back(input(r, count, t, stream));
  std::vector<std::byte> out(count * dtype_size(t));
  for (std::size_t i = 0; i < count; ++i) {
    if (t == DType::f64) {
      double acc = in[0][i];
      for (int r = 1; r < ranks; ++r) acc += static_cast<double>(in[r][i]);
      if (op == ReduceOp::avg) acc /= ranks;
      std::memcpy(out.data() + 8 * i, &acc, 8);
      continue;
    }
    float acc = in[0][i];
    for (int r = 1; r < ranks; ++r) acc += in[r][i];
    if (op == ReduceOp::avg) acc /= static_cast<float>(ranks);
    const std::vector<std::byte> one = encode({acc}, t);
    std::memcpy(out.data() + i * one.size(), one.data(), one.size());
  }
  return out;
}

bool on_shared_memory(const Communicator& c) { return std::string(c.backend_name()) == "shm"; }

}  // namespace

TEST_CASE("shared-memory reductions add in rank order, bitwise", "[comm][shm]") {
  Communicator& c = world();
  if (!all_ranks_true(on_shared_memory(c))) {
    SUCCEED("host buffers move by " << c.backend_name() << ", not through shared memory");
    return;
  }
  const int n = c.size(), me = c.rank();
  std::uint64_t stream = 100;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      for (std::size_t count : kCounts) {
        ++stream;
        INFO(dtype_name(t) << " " << reduce_op_name(op) << ", " << count << " elements");
        const std::size_t es = dtype_size(t);
        // allreduce, out of place and in place.
        const std::vector<std::byte> mine = encode(input(me, count, t, stream), t);
        const std::vector<std::byte> want = expected(n, count, t, op, stream);
        std::vector<std::byte> got(mine.size());
        c.allreduce(mine.data(), got.data(), count, t, op);
        CHECK(all_ranks_true(got == want));
        got = mine;
        c.allreduce(got.data(), got.data(), count, t, op);
        CHECK(all_ranks_true(got == want));
        // reduce_scatter of blocks of `count`: this rank's block of the
        // reduction of the whole vectors.
        const std::size_t whole = count * static_cast<std::size_t>(n);
        const std::vector<std::byte> in = encode(input(me, whole, t, stream + 1000), t);
        const std::vector<std::byte> all = expected(n, whole, t, op, stream + 1000);
        const std::vector<std::byte> block(all.begin() + me * count * es,
                                           all.begin() + (me + 1) * count * es);
        std::vector<std::byte> part(count * es);
        c.reduce_scatter(in.data(), part.data(), count, t, op);
        CHECK(all_ranks_true(part == block));
        std::vector<std::byte> inplace = in;  // NCCL's in-place form: the block stays
        c.reduce_scatter(inplace.data(), inplace.data() + me * count * es, count, t, op);
        CHECK(all_ranks_true(
            std::equal(block.begin(), block.end(), inplace.begin() + me * count * es)));
      }
    }
  }
}

TEST_CASE("an allreduce adds exactly as a reduce-scatter and an allgather", "[comm][shm]") {
  // The ZeRO stages reduce with one or the other: on shared memory they
  // give the same bits, on data whose sums are not exact.
  Communicator& c = world();
  if (!all_ranks_true(on_shared_memory(c))) {
    SUCCEED("host buffers move by " << c.backend_name());
    return;
  }
  const std::size_t n = static_cast<std::size_t>(c.size());
  for (std::size_t block : {std::size_t{3}, std::size_t{70001}}) {
    std::vector<float> x = input(c.rank(), block * n, DType::f32, 7 + block);
    std::vector<float> reduced(block * n), parts(block * n);
    c.allreduce(x.data(), reduced.data(), block * n, DType::f32, ReduceOp::sum);
    c.reduce_scatter(x.data(), parts.data() + c.rank() * block, block, DType::f32, ReduceOp::sum);
    c.allgather(parts.data() + c.rank() * block, parts.data(), block, DType::f32);
    CHECK(all_ranks_true(std::memcmp(reduced.data(), parts.data(), reduced.size() * 4) == 0));
  }
}

TEST_CASE("shared-memory operations in flight together complete in any order",
          "[comm][shm][nonblocking]") {
  Communicator& c = world();
  const int n = c.size(), me = c.rank();
  constexpr std::size_t kBlock = 50021;
  constexpr int kOps = 5;
  std::vector<std::vector<float>> in(kOps), out(kOps);
  std::vector<Request> reqs;
  for (int k = 0; k < kOps; ++k) {
    in[k] = input(me, kBlock * n, DType::f32, 500 + k);
    out[k].assign(kBlock * n, -1.0f);
    if (k % 2 == 0) {
      reqs.push_back(
          c.ireduce_scatter(in[k].data(), out[k].data(), kBlock, DType::f32, ReduceOp::max));
    } else {
      reqs.push_back(c.iallgather(in[k].data(), out[k].data(), kBlock, DType::f32));
    }
  }
  for (int k = kOps - 1; k >= 0; --k) reqs[k].wait();  // the last first
  bool ok = true;
  for (int k = 0; k < kOps; ++k) {
    std::vector<float> want(kBlock * n, -1e30f);
    for (int r = 0; r < n; ++r) {
      const std::vector<float> theirs = input(r, kBlock * n, DType::f32, 500 + k);
      for (std::size_t i = 0; i < kBlock; ++i) {
        if (k % 2 == 0) {
          want[i] = std::max(want[i], theirs[me * kBlock + i]);  // this rank's block
        } else {
          want[r * kBlock + i] = theirs[i];  // rank r's first block
        }
      }
    }
    const std::size_t used = k % 2 == 0 ? kBlock : kBlock * n;
    ok = ok && std::equal(want.begin(), want.begin() + used, out[k].begin());
  }
  CHECK(all_ranks_true(ok));
}

TEST_CASE("the transport of host buffers can be chosen, and a choice that cannot work is refused",
          "[comm][shm][errors]") {
  {
    Communicator mpi(MPI_COMM_WORLD, {.host_comm = HostComm::mpi});
    CHECK(std::string(mpi.backend_name()) == "mpi-host");
    float x = 1.0f;
    mpi.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum);
    CHECK(x == static_cast<float>(mpi.size()));
    mpi.free();
  }
  Communicator& w = world();
  if (w.nodes().nodes == 1) {
    Communicator shm(MPI_COMM_WORLD, {.host_comm = HostComm::shm});
    CHECK(std::string(shm.backend_name()) == "shm");
    double x = shm.rank() + 0.5;
    shm.allreduce(&x, &x, 1, DType::f64, ReduceOp::max);
    CHECK(x == shm.size() - 0.5);
    shm.free();
  } else {
    CHECK(all_ranks_true(
        throws_error([] { Communicator c(MPI_COMM_WORLD, {.host_comm = HostComm::shm}); },
                     ErrorCode::invalid_config, "needs every rank on one node")));
  }
  // Ranks that ask for different transports: an error on every rank, before
  // any of them makes shared memory.
  if (w.size() > 1) {
    const HostComm mine = w.rank() == 1 ? HostComm::shm : HostComm::mpi;
    CHECK(all_ranks_true(throws_error([&] { Communicator c(MPI_COMM_WORLD, {.host_comm = mine}); },
                                      ErrorCode::invalid_config, "different transports")));
  }
}
