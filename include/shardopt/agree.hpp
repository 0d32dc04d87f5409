// shardopt: agreement across ranks, for the checks of an MPI code.
//
// A check that fails on some ranks only (a file one rank cannot open, a
// value that differs between ranks' inputs) must not stop those ranks
// alone: the others would wait in their next collective until the job's
// time limit. The functions below let every rank reach the same verdict
// first, so that every rank takes the same path: go on together, or throw
// the same error together. shardopt's own cross-rank checks (the ZeRO
// layout, checkpoints) are built on them.
//
// Every function here is collective over `comm`: all of its ranks call it,
// in the same order relative to the communicator's other operations, and
// each returns the same result on every rank. Each costs one or two small
// allreduces (agree_or_throw also an allgather of the messages when a rank
// failed). Errors: what Communicator::allreduce throws (StateError for a
// freed communicator, MpiStateError after MPI_Finalize, CommError when MPI
// fails), on the ranks where it happens.
#pragma once

#include <cstdint>
#include <string>

#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"
#include "shardopt/export.h"

namespace shardopt {

// Returns if `local_error` is empty on every rank. Otherwise every rank,
// including those whose local_error is empty, throws the same Error (the
// subclass that matches the code: IoError for ErrorCode::io, ...):
//   code     the `code` passed by the lowest rank whose local_error is not
//            empty;
//   message  each distinct non-empty local_error with the ranks that passed
//            it, in rank order:
//            "on rank 1: cannot open 'a.bin': No such file or directory;
//             on ranks 2, 3: out of memory";
//   hint     the `hint` passed by that lowest failing rank.
// Each rank's code, hint and message travel together in one record of 4 KiB;
// a longer text is cut.
SHARDOPT_API void agree_or_throw(Communicator& comm, const std::string& local_error, ErrorCode code,
                                 const std::string& hint);

// True on every rank if `local` is true on every rank (a logical and).
SHARDOPT_API bool all_ranks(Communicator& comm, bool local);
// True on every rank if `local` is true on at least one rank (a logical or).
SHARDOPT_API bool any_rank(Communicator& comm, bool local);

// The largest and the smallest `value` over the ranks, on every rank (an
// int argument is ambiguous between the two overloads: cast it).
SHARDOPT_API double max_over_ranks(Communicator& comm, double value);
SHARDOPT_API double min_over_ranks(Communicator& comm, double value);
SHARDOPT_API std::int64_t max_over_ranks(Communicator& comm, std::int64_t value);
SHARDOPT_API std::int64_t min_over_ranks(Communicator& comm, std::int64_t value);

// True on every rank if every rank passed the same value.
SHARDOPT_API bool same_on_all_ranks(Communicator& comm, std::uint64_t value);
// True on every rank if every rank passed the same string, compared by
// length and a 64-bit hash (FNV-1a): two different strings compare equal
// only if their hashes collide.
SHARDOPT_API bool same_on_all_ranks(Communicator& comm, const std::string& s);

}  // namespace shardopt
