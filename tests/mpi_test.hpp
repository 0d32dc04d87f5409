// shardopt test harness: what every MPI test program shares. The runner
// (main.cpp) initializes MPI, creates world(), keeps each rank's output in
// its own log file and agrees on the result across ranks.
//
// The rules of an MPI test:
//
//  1. Every rank runs the same collectives, in the same order. A test case
//     may branch on the rank count (the same on every rank), never on a
//     result that can differ between ranks unless it went through
//     all_ranks_true() first.
//  2. Never REQUIRE (or anything else that leaves a test case early) between
//     two collectives: the rank that leaves makes the others wait forever
//     (the watchdog then ends the job). Use CHECK, or collect a local `ok`
//     flag and, after the collectives, CHECK(all_ranks_true(ok)), so every
//     rank reports the same verdict.
//  3. Random data is a function of (test_seed(), a case key, the rank, the
//     index): every rank can regenerate every other rank's input and compute
//     the expected result of a collective on its own.
//  4. An error the library raises for a bad argument must be raised on every
//     rank: assert it with CHECK(all_ranks_true(throws_error<...>(...))).
#pragma once

#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <exception>
#include <random>
#include <string>
#include <string_view>

#include "shardopt/agree.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/config.hpp"
#include "shardopt/error.hpp"

namespace shardopt::test {

// This process's rank and the size of MPI_COMM_WORLD.
int world_rank() noexcept;
int world_size() noexcept;

// The seed of all random test data (SHARDOPT_TEST_SEED), the same on every rank.
std::uint64_t test_seed() noexcept;

// A shardopt::Communicator over MPI_COMM_WORLD with default options, created
// by the runner after MPI_Init and destroyed before MPI_Finalize. Tests that
// free or move a communicator create their own.
Communicator& world();

// A second Communicator over MPI_COMM_WORLD, the runner's own, for the
// verdicts of the tests: their agreement never adds operations to world()
// or to the communicators a test makes.
Communicator& verdicts();

// Collective over MPI_COMM_WORLD: true on every rank iff `local` is true on
// every rank (shardopt::all_ranks, tested in test_comm_agree.cpp).
inline bool all_ranks_true(bool local) { return all_ranks(verdicts(), local); }

// The backend a communicator of these ranks uses for host buffers: shared
// memory on one node ("shm"), shared memory and MPI across nodes ("hier"),
// unless SHARDOPT_HOST_COMM asks for MPI or there is one rank.
inline std::string expected_host_backend(const Communicator& c) {
  const HostComm hc = settings().host_comm;
  const bool shared =
      hc == HostComm::shm || hc == HostComm::hier || (hc == HostComm::automatic && c.size() > 1);
  return !shared ? "mpi-host" : c.nodes().nodes > 1 ? "hier" : "shm";
}

// The splitmix64 finalizer: a good 64-bit mix, cheap enough to derive every
// element of the test data from its coordinates.
inline constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A key for one piece of test data, from the seed and up to three coordinates.
inline std::uint64_t data_key(std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0) noexcept {
  return mix64(mix64(mix64(test_seed() ^ mix64(a)) ^ b) ^ c);
}

// A random engine for `rank`'s data of stream `stream`; any rank can build
// any rank's engine.
inline std::mt19937_64 rank_rng(int rank, std::uint64_t stream = 0) {
  return std::mt19937_64(data_key(0x5eed, static_cast<std::uint64_t>(rank) + 1, stream));
}

// Runs `f`, which must throw an ExpectedError (a shardopt::Error subclass)
// with code `code`, whose message contains `needle`, whose hint is not empty
// and whose rank() is this process's rank in MPI_COMM_WORLD. Local. Returns
// whether it did; a mismatch is described in the next assertion's report.
template <class ExpectedError = Error, class F>
bool throws_error(F&& f, ErrorCode code, std::string_view needle) {
  try {
    f();
  } catch (const ExpectedError& e) {
    bool ok = true;
    if (e.code() != code) {
      UNSCOPED_INFO("rank " << world_rank() << ": error code " << error_code_name(e.code())
                            << ", expected " << error_code_name(code));
      ok = false;
    }
    if (e.message().find(needle) == std::string::npos) {
      UNSCOPED_INFO("rank " << world_rank() << ": message \"" << e.message()
                            << "\" does not contain \"" << needle << "\"");
      ok = false;
    }
    if (e.hint().empty()) {
      UNSCOPED_INFO("rank " << world_rank() << ": no hint in \"" << e.what() << "\"");
      ok = false;
    }
    if (e.rank() != world_rank()) {
      UNSCOPED_INFO("rank " << world_rank() << ": Error::rank() is " << e.rank());
      ok = false;
    }
    return ok;
  } catch (const std::exception& e) {
    UNSCOPED_INFO("rank " << world_rank() << ": threw the wrong exception type: " << e.what());
    return false;
  } catch (...) {
    UNSCOPED_INFO("rank " << world_rank() << ": threw something that is not a std::exception");
    return false;
  }
  UNSCOPED_INFO("rank " << world_rank() << ": no exception, expected " << error_code_name(code));
  return false;
}

// Runs `f`, which must not throw. Local. Returns whether it did not; the
// exception is described in the next assertion's report.
template <class F>
bool no_throw(F&& f) {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    UNSCOPED_INFO("rank " << world_rank() << ": unexpected exception: " << e.what());
  } catch (...) {
    UNSCOPED_INFO("rank " << world_rank() << ": unexpected exception that is not a std::exception");
  }
  return false;
}

// Whether `c` still runs a correct allreduce (after an error, an agreed
// one or a failure): the sum of 1..size over its ranks.
inline bool sums_correctly(Communicator& c) {
  double x = c.rank() + 1.0, s = 0;
  c.allreduce(&x, &s, 1, DType::f64, ReduceOp::sum);
  return s == c.size() * (c.size() + 1) / 2.0;
}

}  // namespace shardopt::test
