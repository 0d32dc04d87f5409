// shardopt internal: what a Communicator learns of its ranks at
// construction, in one MPI_Comm_split_type and one allgather: which ranks
// share a node, and whether every rank has the same value of each SHARDOPT_*
// variable that must be the same everywhere (EnvVarInfo::same_on_every_rank).
#pragma once

#include <mpi.h>

#include "shardopt/communicator.hpp"

namespace shardopt::detail {

// Collective over `comm`, an intracommunicator (its error handler is the
// caller's; the Communicator runs this before it duplicates `comm`, since
// an armed watchdog adds collectives to the duplication). Returns this
// rank's NodeLayout. Throws ConfigError on every rank alike when some
// rank's SHARDOPT_* variables are bad (that rank: its own error; the
// others: one naming it, its host and its error) or when ranks have
// different values of a variable that must agree (naming the variable, its
// value on rank 0 and on the first rank that differs, and both hosts). A
// failure costs one or two broadcasts of 4 KiB more.
NodeLayout survey_ranks(MPI_Comm comm);

}  // namespace shardopt::detail
