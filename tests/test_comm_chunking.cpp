// Operations split into chunks (CommOptions::max_chunk_elements) give the
// same results as whole ones: every operation and in-place form, with chunks
// smaller than the count, and with counts that fit a chunk while
// count * ranks does not (reduce_scatter and allgather then run as one
// reduce or broadcast per rank and chunk).
#include <catch2/catch.hpp>
#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "test_comm_data.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

struct ChunkPlan {
  std::size_t chunk;
  std::vector<std::size_t> counts;
};

// Reductions exercised per type: fewer than in the unchunked tests, since
// the chunking does not depend on the op (avg is kept: it divides after the
// last chunk).
std::vector<ReduceOp> chunk_ops(DType t) {
  if (is_floating(t)) return {ReduceOp::sum, ReduceOp::avg, ReduceOp::min};
  return {ReduceOp::sum, ReduceOp::max};
}

void check_all_operations(Communicator& c, const std::vector<std::size_t>& counts,
                          const std::vector<DType>& dtypes) {
  for (DType t : dtypes) {
    for (std::size_t count : counts) {
      for (Coll coll : {Coll::allreduce, Coll::reduce_scatter}) {
        for (ReduceOp op : chunk_ops(t))
          for (Form form : forms_for(coll))
            check_blocking(c, Spec{.coll = coll,
                                   .dtype = t,
                                   .op = op,
                                   .count = count,
                                   .form = form,
                                   .fill = Fill::exact,
                                   .salt = 1});
      }
      for (Form form : forms_for(Coll::allgather))
        check_blocking(
            c, Spec{.coll = Coll::allgather, .dtype = t, .count = count, .form = form, .salt = 1});
      for (int root = 0; root < c.size(); ++root)
        check_blocking(c, Spec{.coll = Coll::broadcast,
                               .dtype = t,
                               .count = count,
                               .form = Form::in_place,
                               .root = root,
                               .salt = 1});
    }
  }
}

}  // namespace

TEST_CASE("chunked operations match the reference", "[comm][chunk]") {
  const std::vector<DType> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  // counts: below, at and past the chunk, so that count * ranks is past it
  // on 2 ranks or more even when count is not.
  const ChunkPlan plans[] = {
      {1, {1, 2, 5}},
      {7, {3, 6, 7, 8, 23}},
      {64, {17, 33, 64, 65, 300}},
  };
  for (const ChunkPlan& plan : plans) {
    Communicator c(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = plan.chunk});
    CHECK(c.max_chunk_elements() == plan.chunk);
    // A chunk of one element: one MPI call per element, so keep it to the
    // types whose combine paths differ (MPI's own op, shardopt's 16-bit op).
    if (plan.chunk == 1) {
      check_all_operations(c, plan.counts, {DType::f32, DType::bf16, DType::i64});
    } else {
      check_all_operations(c, plan.counts, all);
    }
  }
}

TEST_CASE("a forced chunk of INT_MAX behaves as the default", "[comm][chunk]") {
  Communicator forced(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = INT_MAX});
  CHECK(forced.max_chunk_elements() == static_cast<std::size_t>(INT_MAX));
  const std::vector<DType> some = {DType::f64, DType::f16, DType::i32};
  for (Communicator* c : {&world(), &forced}) {
    INFO("chunk " << c->max_chunk_elements());
    check_all_operations(*c, {0, 1000}, some);
  }
}

TEST_CASE("chunked operations on random data of many chunks", "[comm][chunk]") {
  // Random reals, so any difference in which elements end up where shows;
  // counts of many chunks with a last partial one.
  Communicator small(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = 100});
  Communicator medium(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = 10000});
  for (auto [c, count] :
       {std::pair{&world(), std::size_t{65537}}, std::pair{&small, std::size_t{1001}},
        std::pair{&medium, std::size_t{65537}}}) {
    for (DType t : {DType::f32, DType::bf16}) {
      for (Coll coll : {Coll::allreduce, Coll::reduce_scatter})
        for (Form form : forms_for(coll))
          check_blocking(*c, Spec{.coll = coll,
                                  .dtype = t,
                                  .op = ReduceOp::avg,
                                  .count = count,
                                  .form = form,
                                  .salt = 2});
      for (Form form : forms_for(Coll::allgather))
        check_blocking(
            *c, Spec{.coll = Coll::allgather, .dtype = t, .count = count, .form = form, .salt = 2});
      check_blocking(*c, Spec{.coll = Coll::broadcast,
                              .dtype = t,
                              .count = count,
                              .form = Form::in_place,
                              .root = c->size() / 2,
                              .salt = 2});
    }
  }
}
