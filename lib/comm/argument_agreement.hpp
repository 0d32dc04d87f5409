// shardopt internal: argument agreement (CommOptions::check_arguments,
// SHARDOPT_CHECK_ARGS, SHARDOPT_DESYNC_CHECK). With it on, every operation
// first exchanges what each rank passed and whether its local checks
// failed. A bad argument on one rank then becomes an error on every rank
// instead of a hang in the collective, and ranks that pass different
// counts, types, ops or roots (or call different operations) are told so
// before any data moves. The Communicator's front end (communicator.cpp)
// calls it before each operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>

#include "comm/backend.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail {

enum class OpKind : std::int32_t { allreduce = 1, reduce_scatter, allgather, broadcast, barrier };

// What one rank passed; exchanged as raw bytes, so every field is fixed-size.
struct Signature {
  std::int32_t kind = 0;
  std::int32_t error = 0;  // the ErrorCode of the rank's local checks, 0 if they passed
  std::int64_t count = 0;
  std::int32_t dtype = -1;
  std::int32_t op = -1;
  std::int32_t root = -1;
  std::int32_t pad = 0;
  std::int64_t seq = 0;  // this operation's number on the communicator
};

// The signature of an operation (op, root: -1 where it has none).
Signature signature(OpKind kind, std::size_t count, DType dtype, int op = -1, int root = -1);

// Collective over b's ranks: numbers the operation, exchanges every rank's
// signature (sig.error: the code of this rank's local checks, 0 if they
// passed; local: their exception), and throws on every rank if any rank's
// checks failed (this rank its own exception) or the signatures differ.
void agree_on_arguments(Backend& b, Signature sig, const std::exception_ptr& local);

}  // namespace shardopt::detail
