// Argument agreement (comm/argument_agreement.hpp): the exchange of the
// ranks' signatures and the error every rank throws when they differ.
#include "comm/argument_agreement.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/check.hpp"
#include "common/watchdog.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

namespace {

const char* op_kind_name(std::int32_t k) {
  switch (static_cast<OpKind>(k)) {
    case OpKind::allreduce:
      return "allreduce";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::allgather:
      return "allgather";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::barrier:
      return "barrier";
  }
  return "unknown operation";
}

std::string describe(const Signature& s) {
  std::string d = op_kind_name(s.kind);
  if (static_cast<OpKind>(s.kind) == OpKind::barrier) return d;
  d += "(count=" + std::to_string(s.count) + ", dtype=" + dtype_name(static_cast<DType>(s.dtype));
  if (s.op >= 0) d += std::string(", op=") + reduce_op_name(static_cast<ReduceOp>(s.op));
  if (s.root >= 0) d += ", root=" + std::to_string(s.root);
  return d + ")";
}

}  // namespace

void agree_on_arguments(Backend& b, Signature sig, const std::exception_ptr& local) {
  sig.seq = ++b.agreed_calls;
  std::vector<Signature> all(static_cast<std::size_t>(b.size()));
  const auto exchange_failed = [&] {
    return std::string(op_kind_name(sig.kind)) + ": exchanging arguments";
  };
  detail::WatchScope watch("argument exchange (SHARDOPT_DESYNC_CHECK)", 0, DType::f32, b.size());
  if (watch.armed()) {
    MPI_Request req;
    SHARDOPT_CHECK_MPI(MPI_Iallgather(&sig, sizeof sig, MPI_BYTE, all.data(), sizeof sig, MPI_BYTE,
                                      b.mpi_comm(), &req),
                       exchange_failed());
    detail::watch_poll(
        [&] {
          int done = 0;
          SHARDOPT_CHECK_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE), exchange_failed());
          return done != 0;
        },
        b.watch.get());
  } else {
    SHARDOPT_CHECK_MPI(
        MPI_Allgather(&sig, sizeof sig, MPI_BYTE, all.data(), sizeof sig, MPI_BYTE, b.mpi_comm()),
        exchange_failed());
  }
  std::string failed;
  ErrorCode first_code = ErrorCode::invalid_argument;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].error == 0) continue;
    if (failed.empty()) first_code = static_cast<ErrorCode>(all[r].error);
    failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (local) std::rethrow_exception(local);
  const std::string op = op_kind_name(sig.kind);
  if (!failed.empty()) {
    detail::throw_error(first_code,
                        op + ": rank(s) " + failed + " rejected their arguments (" +
                            error_code_name(first_code) + "); no rank ran the operation",
                        "read the error printed by rank(s) " + failed + ", and fix the call there",
                        __FILE__, __LINE__);
  }
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (std::memcmp(&all[0], &all[r], sizeof(Signature)) == 0) continue;
    // Each distinct call with the ranks that made it, in rank order.
    std::vector<std::pair<Signature, std::vector<int>>> calls;
    for (std::size_t q = 0; q < all.size(); ++q) {
      auto it = std::find_if(calls.begin(), calls.end(), [&](const auto& c) {
        return std::memcmp(&c.first, &all[q], sizeof(Signature)) == 0;
      });
      if (it == calls.end())
        calls.push_back({all[q], {static_cast<int>(q)}});
      else
        it->second.push_back(static_cast<int>(q));
    }
    bool other_op = false;
    std::string list;
    for (const auto& [s, ranks] : calls) {
      other_op = other_op || s.kind != calls[0].first.kind || s.seq != calls[0].first.seq;
      list += list.empty() ? "" : " but ";
      list += "collective #" + std::to_string(s.seq) + " " + describe(s) + " on " +
              detail::ranks_list(ranks);
    }
    detail::throw_error(
        other_op ? ErrorCode::desync : ErrorCode::invalid_argument,
        op + ": ranks disagree: " + list + "; no rank ran the operation",
        other_op ? "every rank must call the same collectives in the same order: look for a "
                   "branch that only some ranks take (a rank-dependent condition, an early "
                   "return, an exception caught on one rank) before this call"
                 : "every rank must pass the same count, dtype, op and root",
        __FILE__, __LINE__);
  }
}

Signature signature(OpKind kind, std::size_t count, DType dtype, int op, int root) {
  Signature s;
  s.kind = static_cast<std::int32_t>(kind);
  s.count = static_cast<std::int64_t>(count);
  s.dtype = static_cast<std::int32_t>(dtype);
  s.op = op;
  s.root = root;
  return s;
}

}  // namespace shardopt::detail
