// shardopt: agreement across ranks (include/shardopt/agree.hpp and the
// library's own tools, lib/comm/agree.hpp).
#include "comm/agree.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/check.hpp"

namespace shardopt {

namespace detail {

namespace {

// Strings travel as fixed-size records of 32-bit words.
constexpr std::size_t kRecordBytes = kAgreeRecordBytes;
static_assert(kRecordBytes % 4 == 0);

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

std::vector<std::string> allgather_strings(Communicator& comm, const std::string& s) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  std::vector<std::int32_t> mine(kRecordBytes / 4, 0);
  std::memcpy(mine.data(), s.data(), std::min(s.size(), kRecordBytes - 1));
  std::vector<std::int32_t> all(n * mine.size());
  comm.allgather(mine.data(), all.data(), mine.size(), DType::i32);
  std::vector<std::string> out(n);
  for (std::size_t r = 0; r < n; ++r) {
    const char* c = reinterpret_cast<const char*>(all.data() + r * mine.size());
    out[r] = std::string(c, strnlen(c, kRecordBytes));
  }
  return out;
}

std::int64_t fingerprint(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(h);
}

bool all_equal(Communicator& comm, const std::vector<std::int64_t>& values) {
  return first_unequal(comm, values) < 0;
}

std::int64_t first_unequal(Communicator& comm, const std::vector<std::int64_t>& values) {
  std::vector<std::int64_t> lo(values), hi(values);
  comm.allreduce(lo.data(), lo.data(), lo.size(), DType::i64, ReduceOp::min);
  comm.allreduce(hi.data(), hi.data(), hi.size(), DType::i64, ReduceOp::max);
  for (std::size_t i = 0; i < values.size(); ++i)
    if (lo[i] != hi[i]) return static_cast<std::int64_t>(i);
  return -1;
}

std::string first_difference(Communicator& comm, const std::string& desc, const char* noun) {
  const std::vector<std::string> all = allgather_strings(comm, desc);
  std::vector<std::vector<std::string>> split;
  std::size_t longest = 0;
  for (const auto& a : all) {
    split.push_back(lines(a));
    longest = std::max(longest, split.back().size());
  }
  for (std::size_t k = 0; k < longest; ++k) {
    // Values of line k per rank, grouped.
    std::vector<std::pair<std::string, std::vector<int>>> values;
    std::string key;
    for (std::size_t r = 0; r < split.size(); ++r) {
      const std::string line = k < split[r].size() ? split[r][k] : "(missing)";
      const std::size_t eq = line.find('=');
      if (key.empty() && eq != std::string::npos) key = line.substr(0, eq);
      const std::string value = eq == std::string::npos ? line : line.substr(eq + 1);
      auto it = std::find_if(values.begin(), values.end(),
                             [&](const auto& v) { return v.first == value; });
      if (it == values.end())
        values.push_back({value, {static_cast<int>(r)}});
      else
        it->second.push_back(static_cast<int>(r));
    }
    if (values.size() < 2) continue;
    std::string s = std::string(noun) + " " + key + " is ";
    for (std::size_t v = 0; v < values.size(); ++v) {
      if (v > 0) s += " but ";
      s += "'" + values[v].first + "' on " + ranks_list(values[v].second);
    }
    return s;
  }
  return "the descriptions differ beyond what can be shown";
}

std::string gather_first_nonempty(Communicator& comm, const std::string& s) {
  for (const std::string& a : allgather_strings(comm, s))
    if (!a.empty()) return a;
  return {};
}

}  // namespace detail

void agree_or_throw(Communicator& comm, const std::string& local_error, ErrorCode code,
                    const std::string& hint) {
  std::int64_t failed = local_error.empty() ? 0 : 1;
  comm.allreduce(&failed, &failed, 1, DType::i64, ReduceOp::max);
  if (failed == 0) return;
  // "code:world rank:message": the lowest rank that found it reports it.
  const std::string record = local_error.empty()
                                 ? std::string()
                                 : std::to_string(static_cast<int>(code)) + ":" +
                                       std::to_string(detail::world_rank()) + ":" + local_error;
  const std::vector<std::string> all = detail::allgather_strings(comm, record);
  const std::vector<std::string> hints =
      detail::allgather_strings(comm, local_error.empty() ? std::string() : hint);
  std::vector<std::pair<std::string, std::vector<int>>> distinct;
  ErrorCode first_code = code;
  std::string first_hint = hint;
  int reporter = -1;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const std::size_t colon = all[r].find(':');
    const std::size_t colon2 = all[r].find(':', colon + 1);
    if (reporter < 0) {
      first_code = static_cast<ErrorCode>(std::stoi(all[r].substr(0, colon)));
      first_hint = hints[r];
      reporter = std::max(0, std::stoi(all[r].substr(colon + 1, colon2 - colon - 1)));
    }
    const std::string msg = all[r].substr(colon2 + 1);
    auto it = std::find_if(distinct.begin(), distinct.end(),
                           [&](const auto& d) { return d.first == msg; });
    if (it == distinct.end())
      distinct.push_back({msg, {static_cast<int>(r)}});
    else
      it->second.push_back(static_cast<int>(r));
  }
  std::string message;
  for (const auto& [msg, ranks] : distinct) {
    if (!message.empty()) message += "; ";
    message += "on " + detail::ranks_list(ranks) + ": " + msg;
  }
  detail::throw_error(first_code, message, first_hint, __FILE__, __LINE__, reporter);
}

void detail::throw_agreed(Communicator& comm, ErrorCode code, std::string message, std::string hint,
                          const char* file, int line) {
  // comm's rank 0 in MPI_COMM_WORLD.
  int world = MPI_UNDEFINED;
  MPI_Group group = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  const int zero = 0;
  if (MPI_Comm_group(comm.mpi_comm(), &group) == MPI_SUCCESS &&
      MPI_Comm_group(MPI_COMM_WORLD, &all) == MPI_SUCCESS)
    MPI_Group_translate_ranks(group, 1, &zero, all, &world);
  if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  if (all != MPI_GROUP_NULL) MPI_Group_free(&all);
  detail::throw_error(code, std::move(message), std::move(hint), file, line,
                      world == MPI_UNDEFINED ? 0 : world);
}

bool all_ranks(Communicator& comm, bool local) {
  return min_over_ranks(comm, std::int64_t{local ? 1 : 0}) == 1;
}

bool any_rank(Communicator& comm, bool local) {
  return max_over_ranks(comm, std::int64_t{local ? 1 : 0}) == 1;
}

double max_over_ranks(Communicator& comm, double value) {
  comm.allreduce(&value, &value, 1, DType::f64, ReduceOp::max);
  return value;
}

double min_over_ranks(Communicator& comm, double value) {
  comm.allreduce(&value, &value, 1, DType::f64, ReduceOp::min);
  return value;
}

std::int64_t max_over_ranks(Communicator& comm, std::int64_t value) {
  comm.allreduce(&value, &value, 1, DType::i64, ReduceOp::max);
  return value;
}

std::int64_t min_over_ranks(Communicator& comm, std::int64_t value) {
  comm.allreduce(&value, &value, 1, DType::i64, ReduceOp::min);
  return value;
}

bool same_on_all_ranks(Communicator& comm, std::uint64_t value) {
  return detail::all_equal(comm, {static_cast<std::int64_t>(value)});
}

bool same_on_all_ranks(Communicator& comm, const std::string& s) {
  return detail::all_equal(comm, {detail::fingerprint(s), static_cast<std::int64_t>(s.size())});
}

}  // namespace shardopt
