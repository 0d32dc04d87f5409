// shardopt internal: agreement across ranks. The public part
// (include/shardopt/agree.hpp: agree_or_throw, all_ranks, any_rank,
// max/min_over_ranks, same_on_all_ranks) and the tools below, on which every
// cross-rank check of the library is built (the ZeRO layout, checkpoints).
// Every function here is collective over the communicator passed and
// returns the same result on every rank, so that a check failing on one rank
// fails on all of them, with the same message, instead of leaving the others
// waiting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/agree.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt::detail {

// The size of the record each rank contributes to allgather_strings.
inline constexpr std::size_t kAgreeRecordBytes = 4096;

// A 64-bit hash of s (FNV-1a), as a signed value for the i64 collectives.
// Local.
std::int64_t fingerprint(const std::string& s);

// Whether every rank passed the same values (vectors of equal length).
bool all_equal(Communicator& comm, const std::vector<std::int64_t>& values);
// The first index whose value differs between ranks, or -1.
std::int64_t first_unequal(Communicator& comm, const std::vector<std::int64_t>& values);

// desc holds "key=value" lines. Names the first key whose value differs
// between ranks: "<noun> key is A on rank(s) 0, 2 but B on rank(s) 1".
std::string first_difference(Communicator& comm, const std::string& desc, const char* noun);

// The first non-empty string over ranks, in rank order ("" if none).
std::string gather_first_nonempty(Communicator& comm, const std::string& s);

// Every rank's string (each cut to kAgreeRecordBytes - 1 bytes), in rank
// order.
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& s);

// Throws an error that every rank of comm raises with the same message
// (built from the collectives above): its reporter (Error::reporter) is
// comm's rank 0. Local.
[[noreturn]] void throw_agreed(Communicator& comm, ErrorCode code, std::string message,
                               std::string hint, const char* file, int line);

}  // namespace shardopt::detail
