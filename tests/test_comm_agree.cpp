// Agreement across ranks (include/shardopt/agree.hpp): every rank gets the
// same verdict, computed here on each rank from what every rank passed (each
// rank knows what the others pass), and a failure on some ranks is the same
// error on every rank. The test harness's own verdicts (all_ranks_true) are
// built on all_ranks, so its results are checked rank by rank with CHECK.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/agree.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

// What agree_or_throw threw on this rank, if anything.
struct Thrown {
  ErrorCode code{};
  std::string message, hint;
  int rank = -2;
  bool is_io = false, is_checkpoint = false;
};

std::optional<Thrown> agree(Communicator& c, const std::string& error, ErrorCode code,
                            const std::string& hint) {
  try {
    agree_or_throw(c, error, code, hint);
  } catch (const Error& e) {
    return Thrown{e.code(),
                  e.message(),
                  e.hint(),
                  e.rank(),
                  dynamic_cast<const IoError*>(&e) != nullptr,
                  dynamic_cast<const CheckpointError*>(&e) != nullptr};
  }
  return std::nullopt;
}

// "rank 2" or "ranks 2, 3, 4": ranks first..last.
std::string ranks_text(int first, int last) {
  std::string s = first == last ? "rank " : "ranks ";
  for (int r = first; r <= last; ++r) s += (r > first ? ", " : "") + std::to_string(r);
  return s;
}

}  // namespace

TEST_CASE("agree_or_throw returns on every rank when no rank failed", "[comm][agree]") {
  Communicator& c = world();
  const std::optional<Thrown> t = agree(c, "", ErrorCode::io, "unused");
  CHECK_FALSE(t.has_value());
}

TEST_CASE("agree_or_throw: one rank's error is thrown on every rank", "[comm][agree]") {
  Communicator& c = world();
  const int last = c.size() - 1;
  const bool failing = c.rank() == last;
  const std::optional<Thrown> t =
      agree(c, failing ? "cannot open 'a.bin': No such file or directory" : "", ErrorCode::io,
            failing ? "check the path" : "another hint");
  CHECK(t.has_value());
  if (t) {
    CHECK(t->code == ErrorCode::io);
    CHECK(t->is_io);
    CHECK(t->message ==
          "on rank " + std::to_string(last) + ": cannot open 'a.bin': No such file or directory");
    CHECK(t->hint == "check the path");  // the failing rank's
    CHECK(t->rank == world_rank());
  }
  CHECK(sums_correctly(c));
}

TEST_CASE("agree_or_throw: the lowest failing rank's code and hint, every distinct message",
          "[comm][agree]") {
  Communicator& c = world();
  const int n = c.size(), r = c.rank();
  // Rank 0 passes; rank 1 fails with a checkpoint error; ranks 2.. fail
  // with one I/O error.
  const std::string error = r == 0 ? "" : r == 1 ? "bad chunk" : "disk full";
  const ErrorCode code = r == 1 ? ErrorCode::checkpoint : ErrorCode::io;
  const std::string hint = r == 0 ? "hint 0" : r == 1 ? "hint 1" : "hint 2";
  const std::optional<Thrown> t = agree(c, error, code, hint);
  if (n == 1) {
    CHECK_FALSE(t.has_value());
  } else {
    std::string want = "on rank 1: bad chunk";
    if (n > 2) want += "; on " + ranks_text(2, n - 1) + ": disk full";
    CHECK(t.has_value());
    if (t) {
      CHECK(t->code == ErrorCode::checkpoint);
      CHECK(t->is_checkpoint);
      CHECK(t->message == want);
      CHECK(t->hint == "hint 1");
    }
  }
  CHECK(sums_correctly(c));
}

TEST_CASE("agree_or_throw groups the ranks that raised the same message", "[comm][agree]") {
  Communicator& c = world();
  const int n = c.size(), r = c.rank();
  // Rank 0 and the last rank raise one message, the ranks between another.
  const bool outer = r == 0 || r == n - 1;
  const std::optional<Thrown> t =
      agree(c, outer ? "outer" : "inner", ErrorCode::invalid_argument, "pass valid arguments");
  std::string want =
      n == 1 ? "on rank 0: outer" : "on ranks 0, " + std::to_string(n - 1) + ": outer";
  if (n > 2) want += "; on " + ranks_text(1, n - 2) + ": inner";
  CHECK(t.has_value());
  if (t) {
    CHECK(t->code == ErrorCode::invalid_argument);
    CHECK(t->message == want);
    CHECK(t->hint == "pass valid arguments");
  }
  CHECK(sums_correctly(c));
}

TEST_CASE("all_ranks and any_rank: a logical and, a logical or", "[comm][agree]") {
  Communicator& c = world();
  const int n = c.size(), r = c.rank();
  CHECK(all_ranks(c, true));
  CHECK_FALSE(all_ranks(c, false));
  CHECK(any_rank(c, true));
  CHECK_FALSE(any_rank(c, false));
  for (int k = 0; k < n; ++k) {
    INFO("rank " << k << " is the odd one");
    CHECK(all_ranks(c, r != k) == false);
    CHECK(all_ranks(c, r == k) == (n == 1));
    CHECK(any_rank(c, r == k) == true);
    CHECK(any_rank(c, r != k) == (n > 1));
  }
}

TEST_CASE("max_over_ranks and min_over_ranks", "[comm][agree]") {
  Communicator& c = world();
  const int n = c.size(), r = c.rank();
  // Values that are not monotonic in the rank; each rank computes all of them.
  const auto dvalue = [](int k) { return (k % 2 == 0 ? 1.0 : -1.0) * (0.25 + k); };
  const auto ivalue = [](int k) {
    return (std::int64_t{1} << 40) * (k % 2 == 0 ? 1 : -1) + std::int64_t{7} * k;
  };
  double dmax = dvalue(0), dmin = dvalue(0);
  std::int64_t imax = ivalue(0), imin = ivalue(0);
  for (int k = 1; k < n; ++k) {
    dmax = std::max(dmax, dvalue(k));
    dmin = std::min(dmin, dvalue(k));
    imax = std::max(imax, ivalue(k));
    imin = std::min(imin, ivalue(k));
  }
  CHECK(max_over_ranks(c, dvalue(r)) == dmax);
  CHECK(min_over_ranks(c, dvalue(r)) == dmin);
  CHECK(max_over_ranks(c, ivalue(r)) == imax);
  CHECK(min_over_ranks(c, ivalue(r)) == imin);
}

TEST_CASE("same_on_all_ranks: values and strings", "[comm][agree]") {
  Communicator& c = world();
  const int n = c.size(), r = c.rank();
  const bool odd = r == n - 1;
  const std::uint64_t big = 0xfedcba9876543210ull;  // above INT64_MAX
  CHECK(same_on_all_ranks(c, big));
  CHECK(same_on_all_ranks(c, odd ? big + 1 : big) == (n == 1));
  CHECK(same_on_all_ranks(c, odd ? std::uint64_t{1} : big) == (n == 1));
  const std::string s = "lr=0.001\nbetas=0.9,0.999\n";
  CHECK(same_on_all_ranks(c, s));
  CHECK(same_on_all_ranks(c, std::string()));
  CHECK(same_on_all_ranks(c, odd ? s + " " : s) == (n == 1));                    // longer
  CHECK(same_on_all_ranks(c, odd ? s.substr(0, s.size() - 1) : s) == (n == 1));  // shorter
  std::string changed = s;
  changed[3] = '1';
  CHECK(same_on_all_ranks(c, odd ? changed : s) == (n == 1));  // same length
}
