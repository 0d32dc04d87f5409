// Communicator::nodes(): which ranks share a node, against MPI's own answer
// (MPI_Comm_split_type) on any machines, and exactly on one machine (every
// rank with the same host name): one node of every rank. The multinode
// suite runs this at 2 nodes x 2 ranks. And NodeLayout::summary()'s text.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

// Collective over comm: every rank's host name, in rank order.
std::vector<std::string> host_names(MPI_Comm comm) {
  constexpr int kLen = 256;
  char mine[kLen] = {};
  gethostname(mine, kLen - 1);
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<char> all(static_cast<std::size_t>(size) * kLen);
  MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm);
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.emplace_back(all.data() + std::size_t(r) * kLen);
  return out;
}

// Collective over comm: whether c.nodes() says what MPI says of comm, the
// communicator c was made on. The ranks MPI puts on this rank's node must
// be those of this rank's node index, in rank order; nodes are numbered in
// the order of their lowest rank.
bool matches_mpi(const Communicator& c, MPI_Comm comm) {
  const NodeLayout& n = c.nodes();
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm shared = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
  int local_size = 0, local_rank = 0;
  MPI_Comm_size(shared, &local_size);
  MPI_Comm_rank(shared, &local_rank);
  std::vector<int> mates(static_cast<std::size_t>(local_size));
  MPI_Allgather(&rank, 1, MPI_INT, mates.data(), 1, MPI_INT, shared);
  MPI_Comm_free(&shared);

  bool ok = n.local_rank == local_rank && n.local_ranks == local_size;
  ok = ok && n.node_of_rank.size() == std::size_t(size) && n.node >= 0 && n.node < n.nodes &&
       n.ranks_per_node.size() == std::size_t(n.nodes);
  if (!ok) return false;
  std::vector<int> same_node;
  for (int r = 0; r < size; ++r)
    if (n.node_of_rank[std::size_t(r)] == n.node) same_node.push_back(r);
  ok = ok && same_node == mates && n.node_of_rank[std::size_t(rank)] == n.node;
  ok = ok && n.ranks_per_node[std::size_t(n.node)] == local_size;
  ok = ok && std::accumulate(n.ranks_per_node.begin(), n.ranks_per_node.end(), 0) == size;
  // Node k's lowest rank comes after node k-1's.
  int next = 0;
  for (int r = 0; r < size; ++r) {
    const int k = n.node_of_rank[std::size_t(r)];
    if (k > next) ok = false;
    if (k == next) ++next;
  }
  ok = ok && next == n.nodes;
  const bool uniform = std::all_of(n.ranks_per_node.begin(), n.ranks_per_node.end(),
                                   [&](int k) { return k == n.ranks_per_node[0]; });
  return ok && n.uniform == uniform;
}

// On one machine (every rank with one host name): 1 node of every rank.
bool one_node_of_all(const Communicator& c, const std::vector<std::string>& hosts) {
  const NodeLayout& n = c.nodes();
  const int size = c.size();
  const bool one_machine =
      std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts[0]; });
  if (!one_machine) return true;  // several machines: matches_mpi says it all
  return n.nodes == 1 && n.node == 0 && n.local_rank == c.rank() && n.local_ranks == size &&
         n.ranks_per_node == std::vector<int>{size} &&
         n.node_of_rank == std::vector<int>(std::size_t(size), 0) && n.uniform &&
         n.summary() == std::to_string(size) +
                            (size == 1
                                 ? " rank on 1 node"
                                 : " ranks on 1 node (" + std::to_string(size) + " per node)");
}

}  // namespace

TEST_CASE("nodes(): which ranks share a node, as MPI says", "[comm][nodes]") {
  Communicator& c = world();
  const std::vector<std::string> hosts = host_names(MPI_COMM_WORLD);
  CHECK(all_ranks_true(matches_mpi(c, MPI_COMM_WORLD)));
  CHECK(all_ranks_true(one_node_of_all(c, hosts)));
  // Every rank holds the same layout but its own node and local rank.
  const NodeLayout& n = c.nodes();
  std::vector<int> mine = n.ranks_per_node;
  mine.insert(mine.end(), n.node_of_rank.begin(), n.node_of_rank.end());
  mine.push_back(n.nodes);
  const std::string text(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(int));
  CHECK(same_on_all_ranks(verdicts(), text));
}

TEST_CASE("nodes() of a communicator of some ranks counts those ranks", "[comm][nodes]") {
  // Even and odd ranks apart: each half's layout is of its own ranks.
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() % 2, world_rank(), &half);
  std::vector<std::string> hosts = host_names(half);
  {
    Communicator c(half);
    CHECK(all_ranks_true(matches_mpi(c, half)));
    CHECK(all_ranks_true(one_node_of_all(c, hosts)));
    // A moved Communicator keeps its layout; the moved-from one has none.
    Communicator moved(std::move(c));
    CHECK(all_ranks_true(moved.nodes().local_ranks >= 1 &&
                         moved.nodes().node_of_rank.size() == std::size_t(moved.size())));
    CHECK(all_ranks_true(throws_error<StateError>([&] { (void)c.nodes(); },
                                                  ErrorCode::invalid_state, "moved-from")));
  }
  MPI_Comm_free(&half);
}

TEST_CASE("NodeLayout::summary() names the ranks and nodes", "[comm][nodes]") {
  NodeLayout n;
  n.ranks_per_node = {1};
  CHECK(n.summary() == "1 rank on 1 node");
  n.nodes = 2;
  n.ranks_per_node = {2, 2};
  CHECK(n.summary() == "4 ranks on 2 nodes (2 per node)");
  n.uniform = false;
  n.ranks_per_node = {3, 2};
  CHECK(n.summary() == "5 ranks on 2 nodes (per node: 3, 2)");
  n.nodes = 20;
  n.ranks_per_node = std::vector<int>(20, 4);
  n.ranks_per_node[19] = 1;
  CHECK(n.summary() ==
        "77 ranks on 20 nodes (per node: 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, ... "
        "(20 in all), from 1 to 4)");
}
