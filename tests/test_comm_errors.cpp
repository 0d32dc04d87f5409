// Bad input: each error is raised on every rank (no rank left waiting in a
// collective), with the right type and code, a message that names the
// problem, a hint, and the rank in MPI_COMM_WORLD. After each error the
// communicator still works.
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/config.hpp"
#include "shardopt/error.hpp"
#include "test_comm_data.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

constexpr auto kBadDType = static_cast<DType>(42);
constexpr auto kBadOp = static_cast<ReduceOp>(9);

// Asserts that `f` throws ExpectedError(code) mentioning `needle` on every
// rank, and that `comm` still works afterwards.
template <class ExpectedError, class F>
void check_error(Communicator& comm, F&& f, ErrorCode code, std::string_view needle) {
  INFO("expected " << error_code_name(code) << " mentioning \"" << needle << "\"");
  CHECK(all_ranks_true(throws_error<ExpectedError>(f, code, needle)));
  CHECK(still_works(comm));
}

}  // namespace

TEST_CASE("a null buffer with a non-zero count is an error on every rank", "[comm][errors]") {
  Communicator& c = world();
  const std::size_t n = static_cast<std::size_t>(c.size());
  std::vector<float> a(4 * n), b(4 * n);
  const ErrorCode bad = ErrorCode::invalid_argument;
  check_error<InvalidArgument>(
      c, [&] { c.allreduce(nullptr, b.data(), 4, DType::f32, ReduceOp::sum); }, bad,
      "send buffer is null but count is 4");
  check_error<InvalidArgument>(
      c, [&] { c.allreduce(a.data(), nullptr, 4, DType::f32, ReduceOp::sum); }, bad,
      "recv buffer is null");
  check_error<InvalidArgument>(
      c, [&] { c.reduce_scatter(nullptr, b.data(), 4, DType::f32, ReduceOp::sum); }, bad,
      "send buffer is null");
  check_error<InvalidArgument>(
      c, [&] { c.reduce_scatter(a.data(), nullptr, 4, DType::f32, ReduceOp::sum); }, bad,
      "recv buffer is null");
  check_error<InvalidArgument>(
      c, [&] { c.allgather(nullptr, b.data(), 4, DType::f32); }, bad, "send buffer is null");
  check_error<InvalidArgument>(
      c, [&] { c.allgather(a.data(), nullptr, 4, DType::f32); }, bad, "recv buffer is null");
  check_error<InvalidArgument>(
      c, [&] { c.broadcast(nullptr, 4, DType::f32, 0); }, bad, "buffer is null");
  check_error<InvalidArgument>(
      c, [&] { Request r = c.iallreduce(nullptr, b.data(), 4, DType::f32, ReduceOp::sum); }, bad,
      "send buffer is null");
  check_error<InvalidArgument>(
      c, [&] { Request r = c.ibroadcast(nullptr, 1, DType::i64, 0); }, bad, "buffer is null");
}

TEST_CASE("an unknown DType or ReduceOp is an error on every rank", "[comm][errors]") {
  Communicator& c = world();
  const std::size_t n = static_cast<std::size_t>(c.size());
  std::vector<double> a(4 * n), b(4 * n);
  const ErrorCode bad = ErrorCode::invalid_argument;
  check_error<InvalidArgument>(
      c, [&] { c.allreduce(a.data(), b.data(), 4, kBadDType, ReduceOp::sum); }, bad,
      "unknown DType value 42");
  check_error<InvalidArgument>(
      c, [&] { c.reduce_scatter(a.data(), b.data(), 4, kBadDType, ReduceOp::max); }, bad,
      "unknown DType value 42");
  check_error<InvalidArgument>(
      c, [&] { c.allgather(a.data(), b.data(), 4, kBadDType); }, bad, "unknown DType value 42");
  check_error<InvalidArgument>(
      c, [&] { c.broadcast(a.data(), 4, kBadDType, 0); }, bad, "unknown DType value 42");
  check_error<InvalidArgument>(
      c, [&] { Request r = c.iallgather(a.data(), b.data(), 4, kBadDType); }, bad,
      "unknown DType value 42");
  check_error<InvalidArgument>(
      c, [&] { c.allreduce(a.data(), b.data(), 4, DType::f64, kBadOp); }, bad,
      "unknown ReduceOp value 9");
  check_error<InvalidArgument>(
      c, [&] { c.reduce_scatter(a.data(), b.data(), 4, DType::f64, kBadOp); }, bad,
      "unknown ReduceOp value 9");
  check_error<InvalidArgument>(
      c, [&] { Request r = c.ireduce_scatter(a.data(), b.data(), 4, DType::f64, kBadOp); }, bad,
      "unknown ReduceOp value 9");
}

TEST_CASE("avg of an integer type is unsupported on every rank", "[comm][errors]") {
  Communicator& c = world();
  const std::size_t n = static_cast<std::size_t>(c.size());
  std::vector<std::int64_t> a(4 * n), b(4 * n);
  for (DType t : {DType::i32, DType::i64}) {
    INFO(dtype_name(t));
    const std::string needle = cat("ReduceOp::avg of ", dtype_name(t));
    check_error<UnsupportedError>(
        c, [&] { c.allreduce(a.data(), b.data(), 4, t, ReduceOp::avg); }, ErrorCode::unsupported,
        needle);
    check_error<UnsupportedError>(
        c, [&] { c.allreduce(a.data(), a.data(), 4, t, ReduceOp::avg); }, ErrorCode::unsupported,
        needle);
    check_error<UnsupportedError>(
        c, [&] { c.reduce_scatter(a.data(), b.data(), 4, t, ReduceOp::avg); },
        ErrorCode::unsupported, needle);
    check_error<UnsupportedError>(
        c, [&] { Request r = c.iallreduce(a.data(), b.data(), 4, t, ReduceOp::avg); },
        ErrorCode::unsupported, needle);
  }
}

TEST_CASE("overlapping buffers that are not an in-place form are an error on every rank",
          "[comm][errors]") {
  Communicator& c = world();
  const std::size_t n = static_cast<std::size_t>(c.size());
  std::vector<float> buf(8 * n + 8);
  float* p = buf.data();
  const ErrorCode bad = ErrorCode::invalid_argument;
  // One element apart: never equal to send (or recv) + rank*count with count 4.
  check_error<InvalidArgument>(
      c, [&] { c.allreduce(p, p + 1, 4, DType::f32, ReduceOp::sum); }, bad, "overlap");
  check_error<InvalidArgument>(
      c, [&] { c.allreduce(p + 3, p, 4, DType::f32, ReduceOp::max); }, bad, "overlap");
  check_error<InvalidArgument>(
      c, [&] { c.reduce_scatter(p, p + 1, 4, DType::f32, ReduceOp::sum); }, bad,
      "recv overlaps send");
  check_error<InvalidArgument>(
      c, [&] { c.allgather(p + 1, p, 4, DType::f32); }, bad, "send overlaps recv");
  check_error<InvalidArgument>(
      c, [&] { c.allgather(p + 4 * n, p + 2, 4, DType::f32); }, bad, "send overlaps recv");
  check_error<InvalidArgument>(
      c, [&] { Request r = c.iallgather(p + 1, p, 4, DType::f32); }, bad, "send overlaps recv");
}

TEST_CASE("a count whose size in bytes overflows is an error on every rank", "[comm][errors]") {
  Communicator& c = world();
  std::vector<double> a(8), b(8);
  const std::size_t huge = SIZE_MAX / 4;  // times 8 bytes does not fit in size_t
  const ErrorCode bad = ErrorCode::invalid_argument;
  check_error<InvalidArgument>(
      c, [&] { c.allreduce(a.data(), b.data(), huge, DType::f64, ReduceOp::sum); }, bad,
      "overflows");
  check_error<InvalidArgument>(
      c, [&] { c.reduce_scatter(a.data(), b.data(), huge, DType::f64, ReduceOp::sum); }, bad,
      "overflows");
  check_error<InvalidArgument>(
      c, [&] { c.allgather(a.data(), b.data(), huge, DType::f64); }, bad, "overflows");
  check_error<InvalidArgument>(
      c, [&] { c.broadcast(a.data(), huge, DType::f64, 0); }, bad, "overflows");
}

TEST_CASE("a broadcast root out of range is an error on every rank", "[comm][errors]") {
  Communicator& c = world();
  std::vector<std::int32_t> buf(5);
  const ErrorCode bad = ErrorCode::invalid_argument;
  for (int root : {-1, c.size(), c.size() + 7, INT_MAX}) {
    const std::string needle = cat("root ", root, " is not a rank");
    check_error<InvalidArgument>(
        c, [&] { c.broadcast(buf.data(), buf.size(), DType::i32, root); }, bad, needle);
    check_error<InvalidArgument>(
        c, [&] { Request r = c.ibroadcast(buf.data(), buf.size(), DType::i32, root); }, bad,
        needle);
  }
}

TEST_CASE("typed spans of mismatched sizes are an error on every rank", "[comm][errors][span]") {
  Communicator& c = world();
  const std::size_t n = static_cast<std::size_t>(c.size());
  std::vector<float> big(4 * n + 1), small(4);
  const ErrorCode bad = ErrorCode::invalid_argument;
  check_error<InvalidArgument>(
      c,
      [&] {
        c.allreduce(std::span<const float>(big.data(), 5), std::span<float>(small), ReduceOp::sum);
      },
      bad, "span sizes do not match");
  check_error<InvalidArgument>(
      c,
      [&] {
        c.reduce_scatter(std::span<const float>(big), std::span<float>(small), ReduceOp::sum);
      },
      bad, "span sizes do not match");
  check_error<InvalidArgument>(
      c, [&] { c.allgather(std::span<const float>(small), std::span<float>(big)); }, bad,
      "span sizes do not match");
}

TEST_CASE("operations after free() are an invalid state on every rank", "[comm][errors]") {
  Communicator c(MPI_COMM_WORLD);
  CHECK(all_ranks_true(no_throw([&] { c.free(); })));
  CHECK(c.is_freed());
  CHECK(all_ranks_true(no_throw([&] { c.free(); })));  // twice is harmless
  std::vector<double> a(4 * static_cast<std::size_t>(world_size())), b(a.size());
  const ErrorCode state = ErrorCode::invalid_state;
  const char* needle = "after Communicator::free()";
  Communicator& w = world();
  check_error<StateError>(
      w, [&] { c.allreduce(a.data(), b.data(), 4, DType::f64, ReduceOp::sum); }, state, needle);
  check_error<StateError>(
      w, [&] { c.reduce_scatter(a.data(), b.data(), 4, DType::f64, ReduceOp::sum); }, state,
      needle);
  check_error<StateError>(
      w, [&] { c.allgather(a.data(), b.data(), 4, DType::f64); }, state, needle);
  check_error<StateError>(
      w, [&] { c.broadcast(a.data(), 4, DType::f64, 0); }, state, needle);
  check_error<StateError>(
      w, [&] { c.barrier(); }, state, needle);
  check_error<StateError>(
      w, [&] { Request r = c.ibarrier(); }, state, needle);
  check_error<StateError>(
      w, [&] { Request r = c.iallreduce(a.data(), b.data(), 4, DType::f64, ReduceOp::sum); }, state,
      needle);
  check_error<StateError>(
      w, [&] { (void)c.rank(); }, state, needle);
  check_error<StateError>(
      w, [&] { (void)c.size(); }, state, needle);
  check_error<StateError>(
      w, [&] { (void)c.mpi_comm(); }, state, needle);
}

TEST_CASE("a moved-from Communicator is an invalid state; the moved-to one works",
          "[comm][errors]") {
  Communicator a(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = 5});
  Communicator b(std::move(a));
  CHECK(a.is_freed());
  CHECK_FALSE(b.is_freed());
  CHECK(b.max_chunk_elements() == 5);
  std::vector<float> x(4 * static_cast<std::size_t>(world_size())), y(x.size());
  const ErrorCode state = ErrorCode::invalid_state;
  check_error<StateError>(
      b, [&] { a.allreduce(x.data(), y.data(), 4, DType::f32, ReduceOp::sum); }, state,
      "moved-from");
  check_error<StateError>(
      b, [&] { Request r = a.ibarrier(); }, state, "moved-from");
  check_error<StateError>(
      b, [&] { (void)a.rank(); }, state, "moved-from");
  check_error<StateError>(
      b, [&] { a.free(); }, state, "moved-from");

  // Move assignment: the target's own communicator is released (collective),
  // the source's taken over.
  Communicator d(MPI_COMM_WORLD);
  d = std::move(b);
  CHECK(b.is_freed());
  CHECK(d.max_chunk_elements() == 5);
  check_error<StateError>(
      d, [&] { b.barrier(); }, state, "moved-from");
  check_blocking(d, Spec{.coll = Coll::reduce_scatter,
                         .dtype = DType::bf16,
                         .op = ReduceOp::sum,
                         .count = 9,
                         .form = Form::in_place,
                         .fill = Fill::exact,
                         .salt = 9});
}

TEST_CASE("a Communicator from MPI_COMM_NULL is an invalid argument on every rank",
          "[comm][errors]") {
  check_error<InvalidArgument>(
      world(), [] { Communicator c(MPI_COMM_NULL); }, ErrorCode::invalid_argument, "MPI_COMM_NULL");
}

TEST_CASE("a Communicator from an intercommunicator is an invalid argument on every rank",
          "[comm][errors]") {
  if (world_size() < 2) {
    // An intercommunicator needs two non-empty groups. At one rank, the
    // other side of the check: an intracommunicator is accepted.
    CHECK(no_throw([] { Communicator c(MPI_COMM_SELF); }));
    return;
  }
  const int color = world_rank() % 2;
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm inter = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &local);
  MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, color == 0 ? 1 : 0, 77, &inter);
  check_error<InvalidArgument>(
      world(), [&] { Communicator c(inter); }, ErrorCode::invalid_argument, "intercommunicator");
  MPI_Comm_free(&inter);
  MPI_Comm_free(&local);
}

TEST_CASE("max_chunk_elements past INT_MAX is a configuration error on every rank",
          "[comm][errors]") {
  const std::size_t past = static_cast<std::size_t>(INT_MAX) + 1;
  check_error<ConfigError>(
      world(), [&] { Communicator c(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = past}); },
      ErrorCode::invalid_config, "max_chunk_elements = 2147483648");
  check_error<ConfigError>(
      world(), [&] { Communicator c(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = SIZE_MAX}); },
      ErrorCode::invalid_config, "max_chunk_elements");
}

TEST_CASE("an error on a sub-communicator reports the rank in MPI_COMM_WORLD", "[comm][errors]") {
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() % 2, world_rank(), &half);
  {
    Communicator c(half);
    std::vector<float> x(4);
    // throws_error checks Error::rank() == the MPI_COMM_WORLD rank.
    check_error<InvalidArgument>(
        c, [&] { c.broadcast(x.data(), 4, DType::f32, c.size()); }, ErrorCode::invalid_argument,
        "is not a rank");
  }
  MPI_Comm_free(&half);
}

TEST_CASE("an error message names the problem, its fix, the rank and the code", "[comm][errors]") {
  bool ok = false;
  std::string what = "no exception";
  try {
    world().allreduce(nullptr, nullptr, 3, DType::bf16, ReduceOp::sum);
  } catch (const Error& e) {
    what = e.what();
    ok = e.status() == SHARDOPT_ERR_INVALID_ARGUMENT &&
         what.find(cat("rank ", world_rank())) != std::string::npos &&
         what.find("SHARDOPT_ERR_INVALID_ARGUMENT") != std::string::npos &&
         what.find(e.message()) != std::string::npos && what.find(e.hint()) != std::string::npos &&
         e.file() != nullptr && e.line() > 0;
  }
  INFO(what);
  CHECK(all_ranks_true(ok));
  CHECK(still_works(world()));
}

// The shared-memory single copy: rank 1's own block of an in-place
// allgather (read only by the other ranks, through process_vm_readv) made
// unreadable. Every rank gets the same error, naming the rank that could
// not read and the rank it read, instead of one rank throwing while the
// others wait; the communicator is then unusable (its steps may no longer
// match), on every rank, and a new one works.
TEST_CASE("a buffer another rank cannot read in a single copy is an error on every rank",
          "[comm][errors][shm]") {
  const std::size_t kib = settings().shm_single_copy_kb;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t n = 65536;  // 256 KiB blocks of f32, whole pages
  Communicator probe(MPI_COMM_WORLD);
  if (std::string(probe.backend_name()) != "shm" || kib > n * 4 / 1024) {
    WARN("skipped: not the shm backend, or SHARDOPT_SHM_SINGLE_COPY_KB above 256 (backend "
         << probe.backend_name() << ")");
    CHECK(still_works(probe));
    return;
  }
  const int ranks = world_size(), me = world_rank();
  const std::size_t bytes = n * 4 * static_cast<std::size_t>(ranks);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  auto* buf = static_cast<float*>(mem);
  for (std::size_t i = 0; i < n * ranks; ++i) buf[i] = static_cast<float>(i % 1000);
  float* own = buf + static_cast<std::size_t>(me) * n;
  REQUIRE(reinterpret_cast<std::uintptr_t>(own) % page == 0);
  if (me == 1) REQUIRE(mprotect(own, n * 4, PROT_NONE) == 0);
  CHECK(all_ranks_true(
      throws_error<CommError>([&] { probe.allgather(own, buf, n, DType::f32); }, ErrorCode::mpi,
                              "could not read local rank 1's buffer (process_vm_readv)")));
  if (me == 1) REQUIRE(mprotect(own, n * 4, PROT_READ | PROT_WRITE) == 0);
  CHECK(all_ranks_true(throws_error<CommError>([&] { probe.allgather(own, buf, n, DType::f32); },
                                               ErrorCode::mpi, "failed earlier")));
  probe.free();
  munmap(mem, bytes);
  CHECK(still_works(world()));
}
