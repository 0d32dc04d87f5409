// shardopt: agreement across ranks for the ZeRO engine (internal). Every
// function here is collective over the communicator passed and returns the
// same result on every rank, so that a check failing on one rank fails on
// all of them, with the same message, instead of leaving the others waiting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

// If any rank's local_error is non-empty, every rank throws an Error with
// the first such rank's code, listing each distinct message with the ranks
// that raised it ("on rank 1: ..."), and `hint`.
void agree_or_throw(Communicator& comm, const std::string& local_error, ErrorCode code,
                    const char* hint);

// A 64-bit hash of s (FNV-1a), as a signed value for the i64 collectives.
std::int64_t fingerprint(const std::string& s);

// Whether every rank passed the same values (vectors of equal length).
bool all_equal(Communicator& comm, const std::vector<std::int64_t>& values);
std::int64_t min_over_ranks(Communicator& comm, std::int64_t value);
// The first index whose value differs between ranks, or -1.
std::int64_t first_unequal(Communicator& comm, const std::vector<std::int64_t>& values);

// desc holds "key=value" lines. Names the first key whose value differs
// between ranks: "<noun> key is A on rank(s) 0, 2 but B on rank(s) 1".
std::string first_difference(Communicator& comm, const std::string& desc, const char* noun);

// The first non-empty string over ranks, in rank order ("" if none).
std::string gather_first_nonempty(Communicator& comm, const std::string& s);

// Every rank's string (each truncated to a few KiB), in rank order.
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& s);

}  // namespace shardopt::detail
