// Blocking Communicator operations against the reference: every operation,
// every DType, every ReduceOp that applies, every in-place form, counts from
// 0 to past 64 Ki, at whatever rank count the job has.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/config.hpp"
#include "test_comm_data.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

// 7 and 65537 divide by no rank count of 2 to 4; 1000 does not divide by 3.
const std::vector<std::size_t> kCounts = {0, 1, 7, 1000, 65537};

}  // namespace

TEST_CASE("a Communicator duplicates the communicator it is given", "[comm][basics]") {
  Communicator& c = world();
  CHECK(c.rank() == world_rank());
  CHECK(c.size() == world_size());
  CHECK(std::string(c.backend_name()) == expected_host_backend(c));
  CHECK_FALSE(c.is_freed());
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(c.mpi_comm(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT);  // same group, a different context
  // The default chunk comes from SHARDOPT_COMM_MAX_CHUNK, INT_MAX when unset.
  CHECK(c.max_chunk_elements() == settings().comm_max_chunk);
  if (std::getenv("SHARDOPT_COMM_MAX_CHUNK") == nullptr) {
    CHECK(c.max_chunk_elements() == static_cast<std::size_t>(INT_MAX));
  }
}

TEST_CASE("allreduce matches the reference", "[comm][allreduce]") {
  for (DType t : kAllDTypes)
    for (ReduceOp op : ops_for(t))
      for (Fill fill : {Fill::exact, Fill::random})
        for (std::size_t count : kCounts)
          for (Form form : forms_for(Coll::allreduce))
            check_blocking(world(), Spec{.coll = Coll::allreduce,
                                         .dtype = t,
                                         .op = op,
                                         .count = count,
                                         .form = form,
                                         .fill = fill});
}

TEST_CASE("reduce_scatter matches the reference", "[comm][reduce_scatter]") {
  for (DType t : kAllDTypes)
    for (ReduceOp op : ops_for(t))
      for (Fill fill : {Fill::exact, Fill::random})
        for (std::size_t count : kCounts)
          for (Form form : forms_for(Coll::reduce_scatter))
            check_blocking(world(), Spec{.coll = Coll::reduce_scatter,
                                         .dtype = t,
                                         .op = op,
                                         .count = count,
                                         .form = form,
                                         .fill = fill});
}

TEST_CASE("allgather matches the reference", "[comm][allgather]") {
  for (DType t : kAllDTypes)
    for (std::size_t count : kCounts)
      for (Form form : forms_for(Coll::allgather))
        check_blocking(world(),
                       Spec{.coll = Coll::allgather, .dtype = t, .count = count, .form = form});
}

TEST_CASE("broadcast from every root matches the reference", "[comm][broadcast]") {
  for (DType t : kAllDTypes)
    for (int root = 0; root < world().size(); ++root)
      for (std::size_t count : kCounts)
        check_blocking(world(), Spec{.coll = Coll::broadcast,
                                     .dtype = t,
                                     .count = count,
                                     .form = Form::in_place,
                                     .root = root});
}

TEST_CASE("barrier completes on every rank", "[comm][barrier]") {
  bool ok = no_throw([] {
    for (int i = 0; i < 5; ++i) world().barrier();
  });
  CHECK(all_ranks_true(ok));
}

TEST_CASE("a count of 0 accepts null buffers and touches nothing", "[comm][basics]") {
  Communicator& c = world();
  for (DType t : kAllDTypes) {
    INFO(dtype_name(t));
    const bool ok = no_throw([&] {
      c.allreduce(nullptr, nullptr, 0, t, ReduceOp::sum);
      c.allreduce(nullptr, nullptr, 0, t, ReduceOp::max);
      c.reduce_scatter(nullptr, nullptr, 0, t, ReduceOp::min);
      c.allgather(nullptr, nullptr, 0, t);
      c.broadcast(nullptr, 0, t, c.size() - 1);
      Request r = c.iallreduce(nullptr, nullptr, 0, t, ReduceOp::sum);
      r.wait();
    });
    CHECK(all_ranks_true(ok));
  }
}

// With ranks 0 and 1 contributing a and b and any other rank +0, the result
// does not depend on the order MPI combines in: exactly one rounding of a+b.
TEST_CASE("bf16 and f16 sums are computed in f32 and rounded once, to nearest even",
          "[comm][allreduce][half]") {
  Communicator& c = world();
  const int n = c.size();
  struct Case {
    DType dtype;
    float a, b, sum;  // sum: round-to-nearest-even of a + b in the 16-bit type
  };
  const Case cases[] = {
      {DType::bf16, 1.0f, 0x1p-8f, 1.0f},                      // tie, down to even
      {DType::bf16, 1.0f + 0x1p-7f, 0x1p-8f, 1.0f + 0x1p-6f},  // tie, up to even
      {DType::bf16, 1.0f, 0x1.8p-8f, 1.0f + 0x1p-7f},          // above the tie
      {DType::bf16, 256.0f, 1.0f, 256.0f},                     // 1 is half an ulp at 256
      {DType::bf16, 0x1.fep127f, 0x1.fep127f, INFINITY},       // overflow to inf
      {DType::f16, 1.0f, 0x1p-11f, 1.0f},
      {DType::f16, 1.0f + 0x1p-10f, 0x1p-11f, 1.0f + 0x1p-9f},
      {DType::f16, 2048.0f, 1.0f, 2048.0f},
      {DType::f16, 65504.0f, 65504.0f, INFINITY},
      {DType::f16, 0x1p-24f, 0x1p-24f, 0x1p-23f},  // subnormals add exactly
  };
  for (const Case& k : cases) {
    const float mine = c.rank() == 0 ? k.a : c.rank() == 1 ? k.b : 0.0f;
    const float want = n == 1 ? k.a : k.sum;
    std::uint16_t in[3];
    std::uint16_t out[3] = {0, 0, 0};
    for (auto& x : in) {
      x = k.dtype == DType::bf16 ? bf16_from_float(mine).bits : f16_from_float(mine).bits;
    }
    const bool ran = no_throw([&] { c.allreduce(in, out, 3, k.dtype, ReduceOp::sum); });
    bool ok = ran;
    for (std::uint16_t o : out) {
      const float got = k.dtype == DType::bf16 ? to_float(bfloat16{o}) : to_float(float16{o});
      ok = ok && got == want;
    }
    INFO(dtype_name(k.dtype) << ": " << k.a << " + " << k.b << " expected " << want << ", got "
                             << (k.dtype == DType::bf16 ? to_float(bfloat16{out[0]})
                                                        : to_float(float16{out[0]})));
    CHECK(all_ranks_true(ok));
  }
}

TEST_CASE("a Communicator over a sub-communicator reduces within its group", "[comm][basics]") {
  MPI_Comm half = MPI_COMM_NULL;
  const int color = world_rank() % 2;
  MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &half);
  {
    Communicator c(half);
    int expect_size = 0;
    for (int r = 0; r < world_size(); ++r) expect_size += r % 2 == color;
    CHECK(c.size() == expect_size);
    CHECK(c.rank() == world_rank() / 2);
    // The sum over the group of world ranks: the ranks of one parity.
    std::int64_t mine = world_rank();
    std::int64_t sum = -1;
    bool ok = no_throw([&] { c.allreduce(&mine, &sum, 1, DType::i64, ReduceOp::sum); });
    std::int64_t want = 0;
    for (int r = color; r < world_size(); r += 2) want += r;
    ok = ok && sum == want;
    CHECK(all_ranks_true(ok));
    check_blocking(c, Spec{.coll = Coll::reduce_scatter,
                           .dtype = DType::bf16,
                           .op = ReduceOp::avg,
                           .count = 33,
                           .form = Form::in_place_own_block,
                           .fill = Fill::exact});
    check_blocking(
        c, Spec{.coll = Coll::allgather, .dtype = DType::f16, .count = 9, .form = Form::in_place});
  }
  MPI_Comm_free(&half);
}
