// Argument agreement (CommOptions::check_arguments, SHARDOPT_CHECK_ARGS=1):
// a bad argument on ONE rank, or ranks that disagree, fail on every rank
// instead of hanging. Without agreement these cases would hang, so each is
// only run with it on.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

Communicator checked_comm() {
  CommOptions o;
  o.check_arguments = true;
  return Communicator(MPI_COMM_WORLD, o);
}

// The last rank is the odd one out.
bool is_odd_rank(const Communicator& c) { return c.rank() == c.size() - 1; }

}  // namespace

TEST_CASE("agreement is off by default and on when asked", "[comm][agreement]") {
  CHECK_FALSE(world().checks_arguments());
  Communicator c = checked_comm();
  CHECK(c.checks_arguments());
  CHECK(sums_correctly(c));
}

TEST_CASE("a null buffer on one rank is an error on every rank", "[comm][agreement]") {
  Communicator c = checked_comm();
  const bool odd = is_odd_rank(c);
  const std::size_t n = static_cast<std::size_t>(c.size());
  std::vector<float> a(8 * n, 1.0f), b(8 * n);
  // The odd rank names its own problem; the others name the odd rank.
  const std::string culprit = std::to_string(c.size() - 1);
  const std::string needle = odd ? "send buffer is null" : "rank(s) " + culprit + " rejected";
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] { c.allreduce(odd ? nullptr : a.data(), b.data(), 8, DType::f32, ReduceOp::sum); },
      ErrorCode::invalid_argument, needle)));
  CHECK(sums_correctly(c));
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] { c.reduce_scatter(odd ? nullptr : a.data(), b.data(), 8, DType::f32, ReduceOp::sum); },
      ErrorCode::invalid_argument, needle)));
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] { c.allgather(odd ? nullptr : a.data(), b.data(), 8, DType::f32); },
      ErrorCode::invalid_argument, needle)));
  Request r;
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] { r = c.iallreduce(odd ? nullptr : a.data(), b.data(), 8, DType::f32, ReduceOp::sum); },
      ErrorCode::invalid_argument, needle)));
  CHECK_FALSE(r.pending());
  CHECK(sums_correctly(c));
}

TEST_CASE("a bad op on one rank carries its code to every rank", "[comm][agreement]") {
  Communicator c = checked_comm();
  const bool odd = is_odd_rank(c);
  std::vector<std::int32_t> a(4, 1), b(4);
  // avg of i32 is unsupported: the code travels to the ranks that passed sum.
  const std::string needle = odd ? "avg of i32" : "SHARDOPT_ERR_UNSUPPORTED";
  CHECK(all_ranks_true(throws_error<UnsupportedError>(
      [&] { c.allreduce(a.data(), b.data(), 4, DType::i32, odd ? ReduceOp::avg : ReduceOp::sum); },
      ErrorCode::unsupported, needle)));
  CHECK(sums_correctly(c));
}

TEST_CASE("ranks that pass different counts, types, ops or roots are told so",
          "[comm][agreement]") {
  Communicator c = checked_comm();
  if (c.size() < 2) {
    // One rank cannot disagree with itself: the same calls simply succeed.
    std::vector<float> a(10, 1.0f), b(10);
    c.allreduce(a.data(), b.data(), 10, DType::f32, ReduceOp::sum);
    CHECK(b[9] == 1.0f);
    return;
  }
  const bool odd = is_odd_rank(c);
  const std::string other = " on rank " + std::to_string(c.size() - 1);
  std::vector<double> a(64 * static_cast<std::size_t>(c.size()), 1.0), b(a.size());
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] { c.allreduce(a.data(), b.data(), odd ? 12 : 10, DType::f64, ReduceOp::sum); },
      ErrorCode::invalid_argument, "allreduce(count=12, dtype=f64, op=sum)" + other)));
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] { c.allreduce(a.data(), b.data(), 8, odd ? DType::i64 : DType::f64, ReduceOp::max); },
      ErrorCode::invalid_argument, "allreduce(count=8, dtype=f64, op=max) on rank")));
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] {
        c.reduce_scatter(a.data(), b.data(), 8, DType::f64, odd ? ReduceOp::min : ReduceOp::sum);
      },
      ErrorCode::invalid_argument, "op=min")));
  CHECK(all_ranks_true(
      throws_error<InvalidArgument>([&] { c.broadcast(a.data(), 8, DType::f64, odd ? 1 : 0); },
                                    ErrorCode::invalid_argument, "root=1")));
  CHECK(sums_correctly(c));
}

TEST_CASE("ranks that call different operations get a desync error", "[comm][agreement]") {
  Communicator c = checked_comm();
  if (c.size() < 2) {
    // One rank cannot disagree with itself: the same calls, checked, run.
    std::vector<float> a(8, 1.0f), b(8, 0.0f);
    CHECK(no_throw([&] {
      c.allgather(a.data(), b.data(), 8, DType::f32);
      c.barrier();
      c.barrier();
    }));
    CHECK(b == a);
    return;
  }
  const bool odd = is_odd_rank(c);
  const int last = c.size() - 1;
  std::vector<float> a(8 * static_cast<std::size_t>(c.size()), 1.0f), b(a.size());
  // Two agreed calls, then the odd rank skips an allgather the others make:
  // the third collective of the communicator is an allgather on the others
  // and a barrier on the odd rank, each named with the ranks that called it.
  c.allgather(a.data(), b.data(), 8, DType::f32);
  c.barrier();
  std::string others = last == 1 ? "rank 0" : "ranks 0";
  for (int r = 1; r < last; ++r) others += ", " + std::to_string(r);
  CHECK(all_ranks_true(throws_error<DesyncError>(
      [&] {
        if (!odd) c.allgather(a.data(), b.data(), 8, DType::f32);
        c.barrier();
      },
      ErrorCode::desync,
      "ranks disagree: collective #3 allgather(count=8, dtype=f32) on " + others +
          " but collective #3 barrier on rank " + std::to_string(last) +
          "; no rank ran the operation")));
  CHECK(sums_correctly(c));
}
