// The typed std::span overloads: the count and DType come from the spans.
#include <catch2/catch.hpp>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "test_comm_data.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

// Element i of rank r's data of set `key`, exact data.
template <class T>
T value(std::uint64_t key, int r, std::size_t i) {
  return input_value<T>(key, r, i, Fill::exact);
}

template <class T>
std::vector<T> data_of(std::uint64_t key, int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(key, r, i);
  return v;
}

// "" or the first element of `got` that is not op over ranks of block
// `block` of every rank's data.
template <class T>
std::string check_reduction(const std::vector<T>& got, std::uint64_t key, ReduceOp op,
                            std::size_t block, int n) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::size_t idx = block * got.size() + i;
    const std::string e =
        check_reduced<T>(got[i], n, op, Fill::exact, [&](int r) { return value<T>(key, r, idx); });
    if (!e.empty()) return cat("[", i, "]: ", e);
  }
  return {};
}

}  // namespace

TEST_CASE("typed allreduce, in place and out of place", "[comm][span]") {
  Communicator& c = world();
  const int n = c.size();
  const std::uint64_t key = data_key(100);
  std::vector<float> inout = data_of<float>(key, c.rank(), 37);
  const std::vector<bfloat16> send = data_of<bfloat16>(key, c.rank(), 37);
  std::vector<bfloat16> recv(37);
  bool ran = no_throw([&] {
    c.allreduce(std::span<float>(inout), ReduceOp::avg);
    c.allreduce(std::span<const bfloat16>(send), std::span<bfloat16>(recv), ReduceOp::sum);
  });
  const std::string e1 = check_reduction(inout, key, ReduceOp::avg, 0, n);
  const std::string e2 = check_reduction(recv, key, ReduceOp::sum, 0, n);
  INFO(e1);
  INFO(e2);
  CHECK(all_ranks_true(ran && e1.empty() && e2.empty()));
}

TEST_CASE("typed reduce_scatter takes the block from the smaller span", "[comm][span]") {
  Communicator& c = world();
  const int n = c.size();
  const std::uint64_t key = data_key(101);
  const std::size_t count = 11;
  const std::vector<std::int64_t> send =
      data_of<std::int64_t>(key, c.rank(), count * static_cast<std::size_t>(n));
  std::vector<std::int64_t> recv(count);
  const bool ran = no_throw([&] {
    c.reduce_scatter(std::span<const std::int64_t>(send), std::span<std::int64_t>(recv),
                     ReduceOp::min);
  });
  const std::string e =
      check_reduction(recv, key, ReduceOp::min, static_cast<std::size_t>(c.rank()), n);
  INFO(e);
  CHECK(all_ranks_true(ran && e.empty()));
}

TEST_CASE("typed allgather and broadcast", "[comm][span]") {
  Communicator& c = world();
  const int n = c.size();
  const std::uint64_t key = data_key(102);
  const std::size_t count = 13;
  const std::vector<float16> send = data_of<float16>(key, c.rank(), count);
  std::vector<float16> recv(count * static_cast<std::size_t>(n));
  bool ok =
      no_throw([&] { c.allgather(std::span<const float16>(send), std::span<float16>(recv)); });
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i)
      ok =
          ok && same_bits(recv[static_cast<std::size_t>(r) * count + i], value<float16>(key, r, i));
  CHECK(all_ranks_true(ok));

  for (int root = 0; root < n; ++root) {
    std::vector<double> buf(29, -1.0);
    if (c.rank() == root) buf = data_of<double>(key, root, 29);
    bool good = no_throw([&] { c.broadcast(std::span<double>(buf), root); });
    for (std::size_t i = 0; i < buf.size(); ++i)
      good = good && buf[i] == value<double>(key, root, i);
    INFO("root " << root);
    CHECK(all_ranks_true(good));
  }
}
