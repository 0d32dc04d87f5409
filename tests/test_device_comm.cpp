// The Communicator on device buffers on the simulated device, with the
// transport SHARDOPT_DEVICE_COMM names (its own stream-ordered collectives,
// NCCL's shape, or the staged backend): every collective, dtype, op and in-place form, over counts
// that span many pipeline chunks, checked against float64 references (the same checks as the host
// tests, on the results copied back) with the memory around each buffer untouched; blocking and
// stream-ordered non-blocking; and the errors of bad device arguments on every rank.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.hpp"
#include "device/device_runtime.hpp"
#include "device_test.hpp"
#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/config.hpp"
#include "shardopt/error.hpp"
#include "shardopt/half.hpp"
#include "simdevice/sim_device.hpp"
#include "test_comm_data.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

detail::DeviceRuntime& rt() { return sim::runtime(); }

// A Trial's buffers copied to device memory, enqueued on `stream`; the
// trial then passes the device copies to the library.
class OnDevice {
 public:
  OnDevice(Trial& t, void* stream) : stream_(stream) {
    for (const auto& [host, bytes] : t.regions()) {
      auto* dev = static_cast<std::byte*>(rt().allocate(bytes, "a test buffer"));
      rt().copy(dev, host, bytes, stream);
      regions_.push_back({host, dev, bytes});
    }
    t.map_buffers([this](const void* p) -> void* {
      const auto* b = static_cast<const std::byte*>(p);
      for (const Region& r : regions_)
        if (b >= r.host && b < r.host + r.bytes) return r.dev + (b - r.host);
      return const_cast<void*>(p);
    });
  }
  ~OnDevice() {
    for (const Region& r : regions_) rt().release(r.dev);
  }
  // The device copies back into the trial's buffers (after the stream's
  // work so far; a copy to pageable memory is complete on return).
  void download() {
    for (const Region& r : regions_) rt().copy(r.host, r.dev, r.bytes, stream_);
  }

 private:
  struct Region {
    std::byte* host;
    std::byte* dev;
    std::size_t bytes;
  };
  void* stream_;
  std::vector<Region> regions_;
};

std::string run_on_device(Communicator& comm, const Spec& s, bool blocking) {
  auto trial = make_trial(s, comm.rank(), comm.size());
  OnDevice dev(*trial, comm.stream());
  std::string error;
  if (!no_throw([&] {
        if (blocking) {
          trial->run(comm);
        } else {
          Request r = trial->start(comm);
          r.wait();  // the stream waits; the copy back below is ordered after it
        }
      }))
    return cat("rank ", comm.rank(), ": the operation threw");
  dev.download();
  return trial->verify();
}

std::vector<Spec> all_specs(std::size_t count, std::uint64_t salt) {
  std::vector<Spec> specs;
  for (Coll c : {Coll::allreduce, Coll::reduce_scatter, Coll::allgather, Coll::broadcast}) {
    for (DType t : kAllDTypes) {
      const std::vector<ReduceOp> ops = c == Coll::allreduce || c == Coll::reduce_scatter
                                            ? ops_for(t)
                                            : std::vector<ReduceOp>{ReduceOp::sum};
      for (ReduceOp op : ops)
        for (Form f : forms_for(c))
          for (Fill fill : {Fill::exact, Fill::random})
            specs.push_back(Spec{.coll = c,
                                 .dtype = t,
                                 .op = op,
                                 .count = count,
                                 .form = f,
                                 .fill = fill,
                                 .root = world_size() - 1,
                                 .salt = salt});
    }
  }
  return specs;
}

}  // namespace

TEST_CASE("device buffers: the transport is the one asked for, the same on every rank",
          "[device][comm]") {
  // SHARDOPT_DEVICE_COMM of this run. auto: the device's own collectives
  // where every rank has a device of its own (NCCL on a GPU, the simulated
  // device's), else staged (MPI here is not known to take device buffers
  // unless SHARDOPT_CUDA_AWARE_MPI=yes, which only the mpi runs set); a
  // forced nccl on ranks that share a device fails on every rank.
  const char* env = std::getenv("SHARDOPT_DEVICE_COMM");
  const std::string asked = env != nullptr ? env : "auto";
  const bool shared = ranks_share_a_device();
  const std::string native = rt().collectives_name();
  const std::string fallback = settings().cuda_aware_mpi == CudaAwareMpi::yes ? "mpi" : "staged";
  auto expected = [&](const std::string& a) {
    return a == "staged" || a == "mpi" ? a : shared ? fallback : native;
  };
  if (asked == "nccl" && shared) {
    CHECK(all_ranks_true(throws_error<UnsupportedError>([&] { Communicator c(MPI_COMM_WORLD); },
                                                        ErrorCode::unsupported,
                                                        "and NCCL takes one device per rank")));
  } else {
    Communicator comm(MPI_COMM_WORLD);
    INFO("SHARDOPT_DEVICE_COMM=" << asked << ", in use: " << comm.device_backend_name());
    CHECK(all_ranks_true(comm.device_backend_name() == expected(asked)));
    CHECK(all_ranks_true(std::string(comm.backend_name()) == expected_host_backend(comm)));
  }
  // CommOptions::device_comm overrides the variable; each transport gives
  // the exact sum of random integers (the order of the additions, which
  // the transports may choose differently, cannot change it). MPI on the
  // device buffers where this run says MPI takes them
  // (SHARDOPT_CUDA_AWARE_MPI=yes: the simulated device's memory is then
  // reached through its host view, as a CUDA-aware MPI reaches a GPU's).
  std::vector<std::pair<DeviceComm, std::string>> choices = {
      {DeviceComm::nccl, "nccl"}, {DeviceComm::staged, "staged"}, {DeviceComm::automatic, "auto"}};
  if (settings().cuda_aware_mpi == CudaAwareMpi::yes) choices.push_back({DeviceComm::mpi, "mpi"});
  for (const auto& choice : choices) {
    const DeviceComm dc = choice.first;  // named, not bound: lambdas capture it
    const std::string& name_asked = choice.second;
    // NCCL and MPI on device buffers never side by side: where the test
    // runner's communicators use one, the other is refused.
    const auto other = dc == DeviceComm::nccl  ? detail::DeviceTransport::mpi
                       : dc == DeviceComm::mpi ? detail::DeviceTransport::nccl
                                               : std::optional<detail::DeviceTransport>{};
    if (other && detail::live_device_transports(*other) > 0) {
      CHECK(all_ranks_true(throws_error<UnsupportedError>(
          [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = dc}); }, ErrorCode::unsupported,
          "must not run collectives on one device side by side")));
      continue;
    }
    if (dc == DeviceComm::nccl && shared) {
      CHECK(all_ranks_true(throws_error<UnsupportedError>(
          [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = dc}); }, ErrorCode::unsupported,
          "and NCCL takes one device per rank")));
      continue;
    }
    // auto keeps to MPI on device buffers while a communicator uses it.
    const bool mpi_live = detail::live_device_transports(detail::DeviceTransport::mpi) > 0;
    Communicator c(MPI_COMM_WORLD, {.device_comm = dc});
    const std::string name = c.device_backend_name();
    CHECK(all_ranks_true(name == (dc == DeviceComm::automatic && mpi_live ? std::string("mpi")
                                                                          : expected(name_asked))));
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const std::size_t n = 5003;
      std::vector<float> host(n);
      std::vector<double> want(n, 0.0);
      for (int q = 0; q < world_size(); ++q) {
        std::mt19937_64 rng = rank_rng(q, 7);
        std::uniform_int_distribution<int> u(-1000, 1000);
        for (std::size_t k = 0; k < n; ++k) {
          const int v = u(rng) * world_size();
          want[k] += op == ReduceOp::avg ? v / world_size() : v;
          if (q == world_rank()) host[k] = float(v);
        }
      }
      auto* dev = static_cast<float*>(rt().allocate(n * 4, "a test buffer"));
      rt().copy(dev, host.data(), n * 4, c.stream());
      c.allreduce(dev, dev, n, DType::f32, op);
      rt().copy(host.data(), dev, n * 4, c.stream());
      rt().release(dev);
      INFO(name << (op == ReduceOp::avg ? ", avg" : ", sum"));
      CHECK(all_ranks_true(std::vector<double>(host.begin(), host.end()) == want));
    }
  }
}

TEST_CASE("device buffers: every collective, in every form", "[device][comm]") {
  INFO(rt().name() << ", delay seed " << sim::delay_seed());
  Communicator comm(MPI_COMM_WORLD);
  // Counts around the pipeline's chunk (SHARDOPT_STAGED_CHUNK_KB=4 in this
  // test's environment: 1024 f32 elements, fewer per block for
  // reduce-scatter and allgather) and past the slot ring.
  for (std::size_t count : {std::size_t(1), std::size_t(333), std::size_t(4099)}) {
    for (const Spec& s : all_specs(count, 1)) {
      for (bool blocking : {true, false}) {
        const std::string error = run_on_device(comm, s, blocking);
        INFO(describe(s) << (blocking ? ", blocking" : ", non-blocking") << ", " << comm.size()
                         << " ranks");
        INFO(error);
        CHECK(all_ranks_true(error.empty()));
      }
    }
  }
}

TEST_CASE("device buffers: a count of 0 and the results equal the host path's", "[device][comm]") {
  Communicator comm(MPI_COMM_WORLD);
  // A count of 0 moves nothing and touches nothing.
  for (const Spec& s : all_specs(0, 2)) {
    const std::string error = run_on_device(comm, s, true);
    INFO(describe(s) << ": " << error);
    CHECK(all_ranks_true(error.empty()));
  }
  // Bitwise the host path's result for exact data: the same sums, staged.
  const std::size_t n = 2500;
  std::vector<float> in(n * std::size_t(comm.size())), host(n), dev_out(n);
  for (std::size_t i = 0; i < in.size(); ++i)
    in[i] = input_value<float>(77, comm.rank(), i, Fill::exact);
  comm.reduce_scatter(in.data(), host.data(), n, DType::f32, ReduceOp::sum);
  auto* d_in = static_cast<float*>(rt().allocate(in.size() * 4, "input"));
  auto* d_out = static_cast<float*>(rt().allocate(n * 4, "output"));
  rt().copy(d_in, in.data(), in.size() * 4, nullptr);
  comm.reduce_scatter(d_in, d_out, n, DType::f32, ReduceOp::sum);
  rt().copy(dev_out.data(), d_out, n * 4, nullptr);
  CHECK(all_ranks_true(std::memcmp(host.data(), dev_out.data(), n * 4) == 0));
  rt().release(d_in);
  rt().release(d_out);
}

TEST_CASE("device buffers: avg is the host transports' avg, bitwise: a sum, then a division",
          "[device][comm]") {
  // Integers: every sum is exact whatever order a transport adds in, so
  // only the division can tell: the host divides the sum once, and so must
  // every device transport. NCCL's own avg multiplies each rank's input by
  // 1/n first and rounds each product (the simulated device's collectives
  // do the same): at 3 ranks most elements then differ in the last bit.
  Communicator comm(MPI_COMM_WORLD);
  const std::size_t n = 3001, total = n * std::size_t(comm.size());
  for (DType t : {DType::f32, DType::f64, DType::bf16}) {
    const std::size_t es = dtype_size(t);
    std::vector<std::byte> in(total * es);
    std::mt19937_64 rng = rank_rng(comm.rank(), 91);
    // bf16 holds the integers up to 256 exactly: 4 ranks of up to 8.
    const int range = t == DType::bf16 ? 8 : 1000;
    std::uniform_int_distribution<int> u(-range, range);
    for (std::size_t k = 0; k < total; ++k) {
      const float v = float(u(rng));
      if (t == DType::f32) std::memcpy(&in[k * es], &v, es);
      if (t == DType::f64) {
        const double d = v;
        std::memcpy(&in[k * es], &d, es);
      }
      if (t == DType::bf16) {
        const bfloat16 b = bf16_from_float(v);
        std::memcpy(&in[k * es], &b, es);
      }
    }
    std::vector<std::byte> host_all(total * es), host_block(n * es);
    comm.allreduce(in.data(), host_all.data(), total, t, ReduceOp::avg);
    comm.reduce_scatter(in.data(), host_block.data(), n, t, ReduceOp::avg);

    auto* d_in = static_cast<std::byte*>(rt().allocate(total * es, "input"));
    auto* d_out = static_cast<std::byte*>(rt().allocate(total * es, "output"));
    std::vector<std::byte> back(total * es);
    auto load = [&] { rt().copy(d_in, in.data(), total * es, comm.stream()); };
    auto same = [&](const void* dev, const std::vector<std::byte>& want) {
      rt().copy(back.data(), dev, want.size(), comm.stream());
      return std::memcmp(back.data(), want.data(), want.size()) == 0;
    };
    INFO("dtype " << dtype_name(t) << ", " << comm.device_backend_name());
    load();
    comm.allreduce(d_in, d_out, total, t, ReduceOp::avg);
    CHECK(all_ranks_true(same(d_out, host_all)));
    comm.allreduce(d_in, d_in, total, t, ReduceOp::avg);  // in place
    CHECK(all_ranks_true(same(d_in, host_all)));
    load();
    comm.reduce_scatter(d_in, d_out, n, t, ReduceOp::avg);
    CHECK(all_ranks_true(same(d_out, host_block)));
    comm.reduce_scatter(d_in, d_in, n, t, ReduceOp::avg);  // in place: the block at the start
    CHECK(all_ranks_true(same(d_in, host_block)));
    rt().release(d_in);
    rt().release(d_out);
  }
}

TEST_CASE("device buffers: the device's own communicator is made at the first operation on them",
          "[device][comm]") {
  // An NCCL communicator costs an ncclCommInitRank (a collective setup of
  // its own) and device memory: a Communicator makes one only when device
  // buffers first go through the device's own collectives, and at most
  // one; a freed Communicator leaves it to the next one over the same ranks
  // and device.
  const int before = detail::device_collectives_made();
  bool native = false;
  const std::size_t n = 700;
  auto use = [&](Communicator& comm) {
    auto* dev = static_cast<float*>(rt().allocate(n * 4, "a test buffer"));
    rt().zero(dev, n * 4, comm.stream());
    for (int k = 0; k < 3; ++k) comm.allreduce(dev, dev, n, DType::f32, ReduceOp::sum);
    rt().release(dev);
  };
  {
    Communicator comm(MPI_COMM_WORLD);
    native = comm.device_backend_name() == std::string(rt().collectives_name());
    CHECK(still_works(comm));  // host buffers make none
    CHECK(all_ranks_true(detail::device_collectives_made() == before));
    use(comm);
    INFO(comm.device_backend_name()
         << ": " << detail::device_collectives_made() - before << " made");
    // None where a spare of these ranks was left by an earlier test.
    CHECK(all_ranks_true(detail::device_collectives_made() - before <= (native ? 1 : 0)));
  }
  const int after_first = detail::device_collectives_made();
  for (int k = 0; k < 3; ++k) {
    Communicator again(MPI_COMM_WORLD);
    use(again);
  }
  INFO(detail::device_collectives_made() - after_first << " made by the next three");
  CHECK(all_ranks_true(detail::device_collectives_made() == after_first));
}

TEST_CASE("device buffers: the staged transport's progress thread works on the buffers' device",
          "[device][comm]") {
  // A thread starts on device 0. The progress thread waits on events of
  // the device the communicator's first operation ran on: on device 1 it
  // must make that device its own first (on a GPU it would otherwise make
  // a context on device 0; the simulated device refuses a thread that never
  // chose its device using another device's events).
  if (rt().device_count() < 2) {
    SUCCEED("one device (SHARDOPT_SIM_DEVICES=2 runs this test)");
    return;
  }
  const int home = rt().current_device(), away = (home + 1) % rt().device_count();
  sim::set_device(away);
  bool ok = false;
  {
    Communicator comm(MPI_COMM_WORLD, {.device_comm = DeviceComm::staged});
    const std::size_t n = 5000;
    std::vector<float> host(n, 1.0f);
    auto* dev = static_cast<float*>(rt().allocate(n * 4, "a test buffer"));
    ok = no_throw([&] {
      rt().copy(dev, host.data(), n * 4, nullptr);
      comm.allreduce(dev, dev, n, DType::f32, ReduceOp::sum);
      rt().copy(host.data(), dev, n * 4, nullptr);
    });
    ok = ok && host == std::vector<float>(n, float(comm.size()));
    rt().release(dev);
  }
  sim::set_device(home);
  CHECK(all_ranks_true(ok));
}

TEST_CASE("device buffers: non-blocking operations in flight together, on a stream of its own",
          "[device][comm]") {
  void* stream = rt().create_stream();
  Communicator comm(MPI_COMM_WORLD, CommOptions{.stream = stream});
  CHECK(comm.stream() == stream);
  std::vector<std::unique_ptr<Trial>> trials;
  std::vector<std::unique_ptr<OnDevice>> devs;
  std::vector<Request> requests;
  std::uint64_t salt = 10;
  for (Coll c : {Coll::allreduce, Coll::reduce_scatter, Coll::allgather, Coll::broadcast}) {
    for (DType t : {DType::f32, DType::bf16, DType::i64}) {
      const Spec s{.coll = c,
                   .dtype = t,
                   .op = is_floating(t) ? ReduceOp::avg : ReduceOp::sum,
                   .count = 1500,
                   .form = forms_for(c).back(),
                   .fill = Fill::exact,
                   .root = 0,
                   .salt = ++salt};
      trials.push_back(make_trial(s, comm.rank(), comm.size()));
      // The inputs are copied in on the stream, not yet there when the
      // operation is started: it must wait for them.
      devs.push_back(std::make_unique<OnDevice>(*trials.back(), stream));
      requests.push_back(trials.back()->start(comm));
    }
  }
  // Completed in reverse order; the stream then waits for all of them.
  for (std::size_t k = requests.size(); k-- > 0;) requests[k].wait();
  for (auto& d : devs) d->download();
  std::string error;
  for (const auto& t : trials) {
    const std::string e = t->verify();
    if (!e.empty() && error.empty()) error = describe(t->spec()) + ": " + e;
  }
  INFO(error);
  CHECK(all_ranks_true(error.empty()));
  devs.clear();
  comm.free();
  rt().destroy_stream(stream);
}

TEST_CASE("device buffers: bad arguments fail on every rank and leave the communicator usable",
          "[device][comm]") {
  Communicator comm(MPI_COMM_WORLD);
  const std::size_t n = 64;
  std::vector<float> host(n * std::size_t(comm.size()), 1.0f);
  auto* dev = static_cast<float*>(rt().allocate(host.size() * 4, "a test buffer"));
  rt().copy(dev, host.data(), host.size() * 4, nullptr);

  SECTION("one buffer on the host, one on the device") {
    CHECK(all_ranks_true(throws_error<DeviceError>(
        [&] { comm.allreduce(host.data(), dev, n, DType::f32, ReduceOp::sum); },
        ErrorCode::wrong_device,
        "one buffer is in host memory and another in CUDA device memory (device " +
            std::to_string(rt().current_device()) + ")")));
  }
  SECTION("a stream of another device than the buffers'") {
    if (rt().device_count() < 2) {
      SUCCEED("one simulated device (SHARDOPT_SIM_DEVICES=2 runs this section)");
    } else {
      const int home = rt().current_device(), away = (home + 1) % rt().device_count();
      sim::set_device(away);
      void* other = rt().create_stream();
      sim::set_device(home);
      comm.set_stream(other);
      CHECK(all_ranks_true(throws_error<DeviceError>(
          [&] { comm.allgather(dev + std::size_t(comm.rank()) * n, dev, n, DType::f32); },
          ErrorCode::wrong_device,
          "the buffers are on device " + std::to_string(home) +
              " but the stream (CommOptions::stream) belongs to device " + std::to_string(away))));
      comm.set_stream(nullptr);
      rt().destroy_stream(other);
    }
  }
  SECTION("buffers on two devices") {
    if (rt().device_count() < 2) {
      SUCCEED("one simulated device");
    } else {
      const int home = rt().current_device(), away = (home + 1) % rt().device_count();
      sim::set_device(away);
      auto* other = static_cast<float*>(rt().allocate(n * 4, "a test buffer"));
      sim::set_device(home);
      CHECK(all_ranks_true(throws_error<DeviceError>(
          [&] { comm.allreduce(dev, other, n, DType::f32, ReduceOp::sum); },
          ErrorCode::wrong_device,
          "the buffers are on devices " + std::to_string(home) + " and " + std::to_string(away))));
      rt().release(other);
    }
  }
  SECTION("buffers and stream of another device than the communicator's") {
    if (rt().device_count() < 2) {
      SUCCEED("one device");
    } else {
      // The device's own collectives (NCCL) are bound to the device that was
      // current when the communicator was made: buffers of another device
      // fail on every rank. The staged and MPI transports take any device.
      const int home = rt().current_device(), away = (home + 1) % rt().device_count();
      sim::set_device(away);
      void* other_stream = rt().create_stream();
      auto* other = static_cast<float*>(rt().allocate(n * 4, "a test buffer"));
      rt().zero(other, n * 4, other_stream);
      comm.set_stream(other_stream);
      const bool native = comm.device_backend_name() == std::string("nccl (simulated)");
      if (native) {
        CHECK(all_ranks_true(throws_error<DeviceError>(
            [&] { comm.allreduce(other, other, n, DType::f32, ReduceOp::sum); },
            ErrorCode::wrong_device,
            "the buffers are on device " + std::to_string(away) +
                ", but this communicator's collectives work on device " + std::to_string(home) +
                " (the current device when it was created)")));
      } else {
        CHECK(all_ranks_true(
            no_throw([&] { comm.allreduce(other, other, n, DType::f32, ReduceOp::sum); })));
      }
      rt().synchronize(other_stream);
      comm.set_stream(nullptr);
      rt().release(other);
      rt().destroy_stream(other_stream);
      sim::set_device(home);
    }
  }
  // Usable afterwards, on device buffers.
  comm.allreduce(dev, dev, n, DType::f32, ReduceOp::sum);
  std::vector<float> back(n);
  rt().copy(back.data(), dev, n * 4, nullptr);
  bool ok = true;
  for (float v : back) ok = ok && v == static_cast<float>(comm.size());
  CHECK(all_ranks_true(ok));
  rt().release(dev);
}

TEST_CASE("device buffers need MPI_THREAD_MULTIPLE", "[.thread-level]") {
  // Run with SHARDOPT_TEST_MPI_THREADS unset (MPI_THREAD_FUNNELED).
  int level = 0;
  MPI_Query_thread(&level);
  REQUIRE(level < MPI_THREAD_MULTIPLE);
  Communicator comm(MPI_COMM_WORLD);
  auto* dev = static_cast<float*>(rt().allocate(64, "a test buffer"));
  CHECK(all_ranks_true(throws_error<UnsupportedError>(
      [&] { comm.allreduce(dev, dev, 16, DType::f32, ReduceOp::sum); }, ErrorCode::unsupported,
      "which needs MPI_THREAD_MULTIPLE")));
  // Host buffers still work.
  CHECK(still_works(comm));
  rt().release(dev);
}
