// shardopt: a Communicator's survey of its ranks at construction
// (survey.hpp): the node layout, and the SHARDOPT_* variables that must be
// the same on every rank.
#include "comm/survey.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/agree.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "shardopt/config.hpp"

namespace shardopt {

namespace {

// "3, 2, 2" for at most `shown` values, then ", ... (N in all)".
std::string list_of(const std::vector<int>& values, std::size_t shown) {
  std::string s;
  for (std::size_t k = 0; k < values.size() && k < shown; ++k) {
    if (k > 0) s += ", ";
    s += std::to_string(values[k]);
  }
  if (values.size() > shown) s += ", ... (" + std::to_string(values.size()) + " in all)";
  return s;
}

}  // namespace

std::string NodeLayout::summary() const {
  int ranks = 0;
  for (int n : ranks_per_node) ranks += n;
  std::string s = std::to_string(ranks) + (ranks == 1 ? " rank on " : " ranks on ") +
                  std::to_string(nodes) + (nodes == 1 ? " node" : " nodes");
  if (ranks_per_node.empty() || (nodes == 1 && ranks == 1)) return s;
  if (uniform) return s + " (" + std::to_string(ranks_per_node[0]) + " per node)";
  const auto [lo, hi] = std::minmax_element(ranks_per_node.begin(), ranks_per_node.end());
  std::string per = list_of(ranks_per_node, 16);
  if (ranks_per_node.size() > 16)
    per += ", from " + std::to_string(*lo) + " to " + std::to_string(*hi);
  return s + " (per node: " + per + ")";
}

namespace detail {

namespace {

// What each rank contributes to the allgather.
struct Card {
  std::int32_t leader;  // the lowest rank of its node, in the communicator
  std::int32_t bad;     // 1 when its SHARDOPT_* variables did not parse
  std::int64_t print;   // fingerprint of the agreed variables' values
};
static_assert(sizeof(Card) == 16);

// Failures only: a rank's text for the others, in one broadcast of a
// fixed-size record (a longer text is cut).
constexpr std::size_t kRecordBytes = 4096;
// A value as a message shows it, at most this long.
constexpr std::size_t kShownValue = 64;
// Ranks a message lists, at most.
constexpr std::size_t kShownRanks = 8;

std::string broadcast_record(MPI_Comm comm, int root, int rank, const std::string& text) {
  std::vector<char> buf(kRecordBytes, '\0');
  if (rank == root) std::memcpy(buf.data(), text.data(), std::min(text.size(), kRecordBytes - 1));
  SHARDOPT_CHECK_MPI(MPI_Bcast(buf.data(), static_cast<int>(kRecordBytes), MPI_CHAR, root, comm),
                     "Communicator: sending a rank's SHARDOPT_* variables to the others");
  return std::string(buf.data(), strnlen(buf.data(), kRecordBytes));
}

const char* lookup_env(const char* name) { return std::getenv(name); }

// The agreed variables of this process, one "name\x1fraw\x1fdefault\x1fvalue"
// line each, after a first line with the host name.
std::string settings_record() {
  std::string out = host_name() + "\n";
  for (const AgreedSetting& a : agreed_settings(settings(), lookup_env))
    out += a.name + '\x1f' + a.raw.substr(0, kShownValue + 1) + '\x1f' + a.default_value + '\x1f' +
           a.value + '\n';
  return out;
}

struct Record {
  std::string host;
  std::map<std::string, AgreedSetting> vars;
};

Record parse_record(const std::string& text) {
  Record r;
  std::istringstream in(text);
  std::getline(in, r.host);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::size_t at = 0;
    for (std::size_t end; (end = line.find('\x1f', at)) != std::string::npos; at = end + 1)
      f.push_back(line.substr(at, end - at));
    f.push_back(line.substr(at));
    if (f.size() == 4) r.vars[f[0]] = {f[0], f[1], f[2], f[3]};
  }
  return r;
}

std::string shown(const AgreedSetting& a) {
  if (a.raw.empty()) return "unset (default " + a.default_value + ")";
  if (a.raw.size() > kShownValue) return "'" + a.raw.substr(0, kShownValue) + "...'";
  return "'" + a.raw + "'";
}

std::string joined(const std::vector<std::string>& names, const char* sep, const char* last) {
  std::string s;
  for (std::size_t k = 0; k < names.size(); ++k)
    s += (k == 0 ? "" : k + 1 == names.size() ? last : sep) + names[k];
  return s;
}

std::string ranks_shown(const std::vector<int>& ranks) {
  return std::string(ranks.size() == 1 ? "rank " : "ranks ") + list_of(ranks, kShownRanks);
}

// Every rank, alike: a rank's variables did not parse. The first such rank
// sends its message; each rank that failed throws its own error.
[[noreturn]] void throw_bad_settings(MPI_Comm comm, int rank, int size,
                                     const std::vector<Card>& all, std::exception_ptr local) {
  std::vector<int> bad;
  for (int r = 0; r < size; ++r)
    if (all[std::size_t(r)].bad != 0) bad.push_back(r);
  std::string mine;
  if (local) {
    try {
      std::rethrow_exception(local);
    } catch (const Error& e) {
      mine = host_name() + "\n" + e.message();
    }
  }
  const std::string text = broadcast_record(comm, bad[0], rank, mine);
  if (local) std::rethrow_exception(local);
  const std::size_t eol = text.find('\n');
  const std::string host = text.substr(0, eol);
  const std::string message = eol == std::string::npos ? "" : text.substr(eol + 1);
  throw_error(ErrorCode::invalid_config,
              "a SHARDOPT_* variable is not valid on " + ranks_shown(bad) + " of " +
                  std::to_string(size) + "; on rank " + std::to_string(bad[0]) + " (host " + host +
                  "): " + message,
              "fix the variable on the rank(s) named (their own error says how), and set "
              "SHARDOPT_* variables the same on every rank: export them before srun, or pass "
              "each to every rank with mpirun -x NAME (Open MPI forwards none to other nodes "
              "without -x)",
              __FILE__, __LINE__);
}

// Every rank, alike: ranks differ from rank 0 in an agreed variable.
[[noreturn]] void throw_different_settings(MPI_Comm comm, int rank, int size,
                                           const std::vector<Card>& all) {
  std::vector<int> differ;
  for (int r = 1; r < size; ++r)
    if (all[std::size_t(r)].print != all[0].print) differ.push_back(r);
  const int other = differ[0];
  const std::string mine = rank == 0 || rank == other ? settings_record() : "";
  const Record zero = parse_record(broadcast_record(comm, 0, rank, mine));
  const Record them = parse_record(broadcast_record(comm, other, rank, mine));
  std::vector<std::string> names, parts;
  for (const auto& [name, a] : zero.vars) {
    const auto it = them.vars.find(name);
    if (it != them.vars.end() && it->second.value == a.value) continue;
    names.push_back(name);
    parts.push_back(name + " is " + shown(a) + " on rank 0 (host " + zero.host + ") but " +
                    (it == them.vars.end() ? std::string("unknown") : shown(it->second)) +
                    " on rank " + std::to_string(other) + " (host " + them.host + ")");
  }
  if (names.empty()) names.push_back("SHARDOPT_*");  // a record was cut: named generally
  std::string pass;
  for (const std::string& n : names) pass += " -x " + n;
  const bool one = names.size() == 1;
  throw_error(ErrorCode::invalid_config,
              joined(names, ", ", " and ") +
                  (one ? " must be the same on every rank, and is not: "
                       : " must be the same on every rank, and are not: ") +
                  joined(parts, "; ", "; ") + " (" + std::to_string(differ.size()) + " of " +
                  std::to_string(size) + " ranks differ from rank 0: " + ranks_shown(differ) +
                  (one ? "); it changes" : "); they change") +
                  " the collectives the ranks run together, so ranks that differ would hang or "
                  "mismatch",
              "set " + joined(names, ", ", " and ") + " the same on every rank: export " +
                  (one ? "it" : "them") +
                  " before srun (which passes the environment on), or pass " +
                  (one ? "it" : "them") + " to every rank with mpirun" + pass +
                  " (Open MPI forwards no variable to other nodes without -x); docs/env.md "
                  "lists the variables that must agree",
              __FILE__, __LINE__);
}

// Releases what MPI_Comm_split_type and MPI_Comm_group made, also when a
// check throws.
struct Handles {
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Group local_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  ~Handles() {
    if (local_group != MPI_GROUP_NULL) MPI_Group_free(&local_group);
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
  }
};

}  // namespace

NodeLayout survey_ranks(MPI_Comm comm) {
  int rank = 0, size = 0;
  SHARDOPT_CHECK_MPI(MPI_Comm_rank(comm, &rank), "Communicator: querying the rank");
  SHARDOPT_CHECK_MPI(MPI_Comm_size(comm, &size), "Communicator: querying the size");
  Card mine{-1, 0, 0};
  std::exception_ptr local_error;
  try {
    std::string values;
    for (const AgreedSetting& a : agreed_settings(settings(), lookup_env))
      values += a.name + "=" + a.value + "\n";
    mine.print = fingerprint(values);
  } catch (const ConfigError&) {
    local_error = std::current_exception();
    mine.bad = 1;
  }
  // The ranks of this node, numbered in rank order (key = rank), so that
  // its local rank 0 is its lowest rank. The node's communicator is freed
  // at once: nothing uses it yet (a collective in two levels, within the
  // node and across nodes, would keep it), and each one holds one of MPI's
  // context ids.
  int local_rank = 0, local_ranks = 0;
  {
    Handles h;
    SHARDOPT_CHECK_MPI(
        MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &h.local),
        "Communicator: finding the ranks of this node (MPI_Comm_split_type)");
    SHARDOPT_CHECK_MPI(MPI_Comm_rank(h.local, &local_rank), "Communicator: the node's rank");
    SHARDOPT_CHECK_MPI(MPI_Comm_size(h.local, &local_ranks), "Communicator: the node's size");
    SHARDOPT_CHECK_MPI(MPI_Comm_group(h.local, &h.local_group), "Communicator: the node's group");
    SHARDOPT_CHECK_MPI(MPI_Comm_group(comm, &h.group), "Communicator: the group");
    const int first = 0;
    SHARDOPT_CHECK_MPI(MPI_Group_translate_ranks(h.local_group, 1, &first, h.group, &mine.leader),
                       "Communicator: the node's lowest rank");
  }
  std::vector<Card> all(static_cast<std::size_t>(size));
  SHARDOPT_CHECK_MPI(
      MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm),
      "Communicator: exchanging the ranks' nodes and SHARDOPT_* variables");
  // From here on every rank decides on the same data, and so alike.
  if (std::any_of(all.begin(), all.end(), [](const Card& c) { return c.bad != 0; }))
    throw_bad_settings(comm, rank, size, all, local_error);
  if (std::any_of(all.begin(), all.end(), [&](const Card& c) { return c.print != all[0].print; }))
    throw_different_settings(comm, rank, size, all);

  NodeLayout n;
  std::vector<int> node_of_leader(static_cast<std::size_t>(size), -1);
  for (int r = 0; r < size; ++r) {
    const int leader = all[std::size_t(r)].leader;
    // A node's lowest rank comes first, and is its own leader.
    if (leader < 0 || leader > r || (leader < r && node_of_leader[std::size_t(leader)] < 0))
      throw_error(ErrorCode::internal,
                  "Communicator: MPI_Comm_split_type gave rank " + std::to_string(r) +
                      " a node whose lowest rank is " + std::to_string(leader),
                  "please report this with the MPI library's name and version", __FILE__, __LINE__);
    if (leader == r) {
      node_of_leader[std::size_t(r)] = static_cast<int>(n.ranks_per_node.size());
      n.ranks_per_node.push_back(0);
    }
    const int node = node_of_leader[std::size_t(leader)];
    n.node_of_rank.push_back(node);
    ++n.ranks_per_node[std::size_t(node)];
  }
  n.nodes = static_cast<int>(n.ranks_per_node.size());
  n.node = n.node_of_rank[std::size_t(rank)];
  n.local_rank = local_rank;
  n.local_ranks = local_ranks;
  n.uniform = std::all_of(n.ranks_per_node.begin(), n.ranks_per_node.end(),
                          [&](int k) { return k == n.ranks_per_node[0]; });
  return n;
}

}  // namespace detail

}  // namespace shardopt
