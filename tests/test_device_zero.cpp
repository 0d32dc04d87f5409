// The ZeRO optimizer on device buffers (the simulated device), beyond the
// suites test_zero_device reruns: checkpoints saved from device parameters
// loaded into host ones and back, at this rank count; and the errors of
// device arguments, on every rank, with the optimizer still usable where
// the cause can be fixed.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "build_config.hpp"
#include "ckpt_helpers.hpp"
#include "comm/backend.hpp"
#include "device/device.hpp"
#include "device/device_runtime.hpp"
#include "device_test.hpp"
#include "mpi_test.hpp"
#include "shardopt/config.hpp"
#include "shardopt/error.hpp"
#include "shardopt/zero.hpp"
#include "simdevice/sim_device.hpp"
#include "test_comm_data.hpp"

#if SHARDOPT_HAVE_MPIX_CUDA
#include <mpi-ext.h>
#endif

using namespace shardopt;
using namespace shardopt::test;

namespace {

detail::DeviceRuntime& rt() { return sim::runtime(); }

// Two parameters of sizes 37 and 300, f32 or bf16, on the host or the
// device, with exact gradients (small integers times powers of two).
struct Net {
  static constexpr std::size_t kSizes[2] = {37, 300};
  DType dtype;
  bool device;
  std::vector<std::vector<std::byte>> host_p, host_g;
  std::vector<void*> p, g;

  Net(DType t, bool on_device) : dtype(t), device(on_device) {
    const std::size_t es = dtype_size(t);
    for (std::size_t i = 0; i < 2; ++i) {
      host_p.emplace_back(kSizes[i] * es);
      host_g.emplace_back(kSizes[i] * es);
      for (std::size_t j = 0; j < kSizes[i]; ++j) set(host_p[i], j, 0.25f * float(j % 7) - 0.5f);
      if (device) {
        p.push_back(rt().allocate(kSizes[i] * es, "a parameter"));
        g.push_back(rt().allocate(kSizes[i] * es, "a gradient"));
        rt().copy(p[i], host_p[i].data(), host_p[i].size(), nullptr);
      } else {
        p.push_back(host_p[i].data());
        g.push_back(host_g[i].data());
      }
    }
  }
  ~Net() {
    if (device)
      for (std::size_t i = 0; i < 2; ++i) {
        rt().release(p[i]);
        rt().release(g[i]);
      }
  }
  void set(std::vector<std::byte>& b, std::size_t j, float v) const {
    if (dtype == DType::f32) {
      std::memcpy(b.data() + j * 4, &v, 4);
    } else {
      const std::uint16_t h = bf16_from_float(v).bits;
      std::memcpy(b.data() + j * 2, &h, 2);
    }
  }
  std::vector<Param> params() {
    return {Param{.name = "w", .data = p[0], .numel = kSizes[0], .dtype = dtype, .grad = g[0]},
            Param{.name = "b", .data = p[1], .numel = kSizes[1], .dtype = dtype, .grad = g[1]}};
  }
  void write_grads(int step) {
    for (std::size_t i = 0; i < 2; ++i) {
      for (std::size_t j = 0; j < kSizes[i]; ++j)
        set(host_g[i], j, float(int((j * 7 + step * 3 + world_rank()) % 9) - 4) * 0.125f);
      if (device) rt().copy(g[i], host_g[i].data(), host_g[i].size(), nullptr);
    }
  }
  std::vector<std::byte> param_bytes() {
    std::vector<std::byte> all;
    for (std::size_t i = 0; i < 2; ++i) {
      std::vector<std::byte> h(host_p[i].size());
      if (device)
        rt().copy(h.data(), p[i], h.size(), nullptr);
      else
        std::memcpy(h.data(), p[i], h.size());
      all.insert(all.end(), h.begin(), h.end());
    }
    return all;
  }
};

void train(ZeroRedundancyOptimizer& opt, Net& net, int first, int steps) {
  for (int s = first; s < first + steps; ++s) {
    opt.zero_grad();
    net.write_grads(s);
    opt.step();
  }
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("device ZeRO: a checkpoint saved on the device loads on the host and back",
          "[device][zero][ckpt]") {
  for (DType t : {DType::f32, DType::bf16}) {
    for (int stage : {1, 2}) {
      INFO(dtype_name(t) << ", stage " << stage << ", " << world_size() << " ranks");
      ZeroOptions zo{.stage = stage};
      // The same run on the host and on the device: 3 steps, a save, 2 more.
      Net host(t, false), dev(t, true);
      ZeroRedundancyOptimizer oh(world(), host.params(), Adam{.lr = 0.01}, zo);
      ZeroRedundancyOptimizer od(world(), dev.params(), Adam{.lr = 0.01}, zo);
      train(oh, host, 0, 3);
      train(od, dev, 0, 3);
      CHECK(all_ranks_true(host.param_bytes() == dev.param_bytes()));
      const zero::TempDir dir;  // removed, with what was written, at the end
      const std::string path = dir.file("ckpt.safetensors");
      od.save(path);
      // Loaded into fresh host parameters, 2 more steps: the host run's.
      Net host2(t, false);
      ZeroRedundancyOptimizer oh2(world(), host2.params(), Adam{.lr = 0.01}, zo);
      oh2.load(path);
      train(oh2, host2, 3, 2);
      train(oh, host, 3, 2);
      CHECK(all_ranks_true(host2.param_bytes() == host.param_bytes()));
      // And a host checkpoint into fresh device parameters.
      oh.save(path);
      Net dev2(t, true);
      ZeroRedundancyOptimizer od2(world(), dev2.params(), Adam{.lr = 0.01}, zo);
      od2.load(path);
      CHECK(all_ranks_true(dev2.param_bytes() == host.param_bytes()));
      for (const std::string& name : oh.state_names())
        CHECK(all_ranks_true(od2.gather_state(name, 1) == oh.gather_state(name, 1)));
      CHECK(all_ranks_true(od2.check_sync().in_sync));
      // An export from the device equals the host's, byte for byte.
      const std::string ex_dev = dir.file("export-dev.safetensors"),
                        ex_host = dir.file("export-host.safetensors");
      for (bool fp32 : {true, false}) {
        od2.export_params(ex_dev, {.fp32 = fp32});
        oh.export_params(ex_host, {.fp32 = fp32});
        CHECK(all_ranks_true(read_all(ex_dev) == read_all(ex_host) && !read_all(ex_dev).empty()));
      }
      if (world_rank() == 0) {
        std::remove(path.c_str());
        std::remove(ex_dev.c_str());
        std::remove(ex_host.c_str());
      }
    }
  }
}

TEST_CASE("device ZeRO: bad device arguments fail on every rank", "[device][zero][errors]") {
  Net dev(DType::f32, true), host(DType::f32, false);

  SECTION("a parameter on the host among device ones") {
    std::vector<Param> params = dev.params();
    params[1].data = host.p[1];
    CHECK(all_ranks_true(throws_error<DeviceError>(
        [&] { ZeroRedundancyOptimizer opt(world(), params, Adam{}, {}); }, ErrorCode::wrong_device,
        "parameter 1 ('b'): its data buffer is in host memory but parameter 0 ('w')'s data "
        "buffer is in CUDA device memory (device " +
            std::to_string(rt().current_device()) + ")")));
  }
  SECTION("device memory on some ranks, host memory on the others") {
    if (world_size() < 2) {
      SUCCEED("one rank");
    } else {
      Net& mine = world_rank() == 0 ? host : dev;
      CHECK(all_ranks_true(throws_error<DeviceError>(
          [&] { ZeroRedundancyOptimizer opt(world(), mine.params(), Adam{}, {}); },
          ErrorCode::wrong_device, "but in host memory on rank 0")));
    }
  }
  SECTION("a stream of another device") {
    if (rt().device_count() < 2) {
      SUCCEED("one simulated device");
    } else {
      const int home = rt().current_device(), away = (home + 1) % rt().device_count();
      sim::set_device(away);
      void* other = rt().create_stream();
      sim::set_device(home);
      ZeroOptions zo;
      zo.stream = other;
      CHECK(all_ranks_true(throws_error<DeviceError>(
          [&] { ZeroRedundancyOptimizer opt(world(), dev.params(), Adam{}, zo); },
          ErrorCode::wrong_device,
          "ZeroOptions::stream belongs to device " + std::to_string(away))));
      rt().destroy_stream(other);
    }
  }
  SECTION("a custom optimizer with device parameters") {
    CustomOptimizer c;
    c.name = "mine";
    c.update = [](const CustomStep&, double) {};
    CHECK(all_ranks_true(throws_error<UnsupportedError>(
        [&] { ZeroRedundancyOptimizer opt(world(), dev.params(), c, {}); }, ErrorCode::unsupported,
        "a CustomOptimizer's update is a host function, but the parameters are in CUDA device "
        "memory")));
  }
  SECTION("grad_ready_on: a stream for host parameters, a stream of another device") {
    ZeroRedundancyOptimizer on_host(world(), host.params(), SGD{.lr = 0.5}, {});
    void* s = rt().create_stream();
    CHECK(all_ranks_true(throws_error<InvalidArgument>([&] { on_host.grad_ready_on(s, 0); },
                                                       ErrorCode::invalid_argument,
                                                       "a stream was given but the optimizer's "
                                                       "parameters are in host memory")));
    rt().destroy_stream(s);
    if (rt().device_count() >= 2) {
      ZeroRedundancyOptimizer on_dev(world(), dev.params(), SGD{.lr = 0.5}, {});
      const int home = rt().current_device(), away = (home + 1) % rt().device_count();
      sim::set_device(away);
      void* other = rt().create_stream();
      sim::set_device(home);
      CHECK(all_ranks_true(throws_error<DeviceError>(
          [&] { on_dev.grad_ready_on(other, 1); }, ErrorCode::wrong_device,
          "the stream belongs to device " + std::to_string(away))));
      rt().destroy_stream(other);
      // Nothing was marked: a step reduces both gradients.
      dev.write_grads(0);
      CHECK(all_ranks_true(on_dev.step().applied));
    }
  }
  SECTION("a host gradient passed to a device optimizer, then the right one") {
    ZeroRedundancyOptimizer opt(world(), dev.params(), SGD{.lr = 0.5}, {.stage = 2});
    dev.write_grads(0);
    CHECK(all_ranks_true(throws_error<DeviceError>([&] { opt.grad_ready(0, host.g[0]); },
                                                   ErrorCode::wrong_device,
                                                   "the gradient is in host memory")));
    // Nothing was marked: the step goes on with the device gradients.
    const std::vector<std::byte> before = dev.param_bytes();
    opt.grad_ready(0, dev.g[0]);
    opt.grad_ready(1, dev.g[1]);
    CHECK(all_ranks_true(opt.step().applied));
    CHECK(all_ranks_true(dev.param_bytes() != before));
  }
}

TEST_CASE("device ZeRO: a device checkpoint resumes at another rank count, device or host",
          "[device][zero][ckpt]") {
  if (world_size() < 2) {
    SUCCEED("one rank: no smaller rank count to resume at");
    return;
  }
  for (DType t : {DType::f32, DType::bf16}) {
    for (int stage : {1, 2}) {
      INFO(dtype_name(t) << ", stage " << stage << ", saved at " << world_size() << " ranks");
      const ZeroOptions zo{.stage = stage};
      Net dev(t, true);
      ZeroRedundancyOptimizer od(world(), dev.params(), Adam{.lr = 0.01}, zo);
      train(od, dev, 0, 3);
      const zero::TempDir dir;
      const std::string path = dir.file("resize.safetensors");
      od.save(path);
      const std::vector<std::byte> saved = dev.param_bytes();
      std::vector<std::vector<float>> states;
      for (const std::string& name : od.state_names()) states.push_back(od.gather_state(name, 1));
      // The first size - 1 ranks resume it, on the device and on the host.
      MPI_Comm sub = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, world_rank() < world_size() - 1 ? 0 : MPI_UNDEFINED,
                     world_rank(), &sub);
      if (sub != MPI_COMM_NULL) {
        Communicator c(sub);
        Net d2(t, true), h2(t, false);
        ZeroRedundancyOptimizer o_d(c, d2.params(), Adam{.lr = 0.01}, zo);
        ZeroRedundancyOptimizer o_h(c, h2.params(), Adam{.lr = 0.01}, zo);
        o_d.load(path);
        o_h.load(path);
        CHECK(d2.param_bytes() == saved);
        CHECK(h2.param_bytes() == saved);
        const std::vector<std::string> names = o_d.state_names();
        for (std::size_t k = 0; k < names.size(); ++k) {
          INFO("state " << names[k]);
          CHECK(o_d.gather_state(names[k], 1) == states[k]);
        }
        train(o_d, d2, 3, 2);
        train(o_h, h2, 3, 2);
        CHECK(d2.param_bytes() == h2.param_bytes());
        CHECK(d2.param_bytes() != saved);
        c.free();
        MPI_Comm_free(&sub);
      } else {
        SUCCEED("the last rank does not resume");
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (world_rank() == 0) std::remove(path.c_str());
    }
  }
}

TEST_CASE("device ZeRO: memory_report says which bytes are on the device", "[device][zero]") {
  for (int stage : {0, 1, 2}) {
    Net dev(DType::bf16, true), host(DType::bf16, false);
    const ZeroOptions zo{.stage = stage};
    ZeroRedundancyOptimizer on_dev(world(), dev.params(), Adam{}, zo);
    ZeroRedundancyOptimizer on_host(world(), host.params(), Adam{}, zo);
    const MemoryReport d = on_dev.memory_report(), h = on_host.memory_report();
    INFO("stage " << stage << ": device " << d.device_bytes << " + " << d.host_bytes << ", host "
                  << h.device_bytes << " + " << h.host_bytes);
    // The same buffers in either memory (bf16: an fp32 master and Adam's
    // two moments at least), all of them on the device for device
    // parameters; host parameters at stage 2 on one node may add the fused
    // update's blocks and slices (counted in buckets), stages 0 and 1 not.
    CHECK(all_ranks_true(d.allocated() - d.buckets == h.allocated() - h.buckets &&
                         (stage == 2 ? d.buckets <= h.buckets : d.buckets == h.buckets) &&
                         d.allocated() > 0));
    CHECK(all_ranks_true(d.device_bytes == d.allocated() && d.host_bytes == 0));
    CHECK(all_ranks_true(h.host_bytes == h.allocated() && h.device_bytes == 0));
  }
}

TEST_CASE("device ZeRO: the optimizer makes at most one device communicator, at its first step",
          "[device][zero]") {
  // The engine's own communicator (its agreements, its control traffic)
  // moves host buffers only: it makes no NCCL communicator (an
  // ncclCommInitRank each). The user's communicator, which moves the
  // gradients and parameters, makes at most one (where its transport is
  // the device's own collectives; none where a freed communicator of the
  // same ranks left one), whatever the stage and the step count.
  for (int stage : {0, 1, 2}) {
    Net dev(DType::f32, true);
    const int before = detail::device_collectives_made();
    int made = 0;
    bool native = false;
    {
      Communicator comm(MPI_COMM_WORLD);
      native = comm.device_backend_name() == std::string(rt().collectives_name());
      ZeroRedundancyOptimizer opt(comm, dev.params(), Adam{.lr = 0.25}, {.stage = stage});
      train(opt, dev, 0, 3);
      rt().synchronize(nullptr);
      made = detail::device_collectives_made() - before;
    }
    INFO("stage " << stage << ", " << (native ? "native" : "staged or mpi") << ": " << made
                  << " made");
    CHECK(all_ranks_true(made <= (native ? 1 : 0)));
  }
}

TEST_CASE("device ZeRO: gradients written by several streams are each waited for",
          "[device][zero]") {
  // Each gradient of one bucket is written by a stream of its own, behind
  // a slow kernel (20 ms, then 5), and marked with grad_ready_on: the
  // reduction must wait for both (waiting on one only leaves the other's
  // old values in the bucket, DeepSpeed#8061). Compared with the same
  // steps on host buffers, bitwise.
  for (int stage : {0, 2}) {
    Net dev(DType::f32, true), host(DType::f32, false);
    void* engine = rt().create_stream();
    void* producers[2] = {rt().create_stream(), rt().create_stream()};
    void* zeroed = rt().create_event();
    rt().synchronize(nullptr);  // the parameters' upload, on the default stream
    const ZeroOptions zo{.stage = stage, .bucket_mb = 1.0, .stream = engine};
    ZeroRedundancyOptimizer on_dev(world(), dev.params(), Adam{.lr = 0.25}, zo);
    ZeroRedundancyOptimizer on_host(world(), host.params(), Adam{.lr = 0.25}, {.stage = stage});
    for (int step = 0; step < 3; ++step) {
      on_dev.zero_grad();
      on_host.zero_grad();
      host.write_grads(step);
      // The producers start after zero_grad's zeroing on the engine stream.
      rt().record(zeroed, engine);
      for (std::size_t i = 0; i < 2; ++i) {
        void* s = producers[i];
        rt().wait_event(s, zeroed);
        const int ms = i == 0 ? 20 : 5;
        rt().emulate(s, [ms](const detail::Translate&) {
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        });
        rt().copy(dev.g[i], host.g[i], host.host_g[i].size(), s);
        on_dev.grad_ready_on(s, i);
      }
      on_dev.step();
      on_host.step();
    }
    rt().synchronize(engine);
    INFO("stage " << stage);
    CHECK(all_ranks_true(dev.param_bytes() == host.param_bytes()));
    rt().destroy_event(zeroed);
    for (void* s : producers) rt().destroy_stream(s);
    rt().destroy_stream(engine);
  }
}

TEST_CASE("device ZeRO: step() enqueues its work and returns without waiting for the device",
          "[device][zero]") {
  // Before each step the engine's stream (the default one) is held by a
  // host flag that the test raises only once step() has returned: a step
  // that waited for the device would not return (a watchdog thread then
  // raises the flag after 20 s, and the test fails). Without a loss scaler
  // and with one, whose verdict stays on the device (StepInfo::pending),
  // step 2 overflowing on the last rank; afterwards the run equals the
  // host's bitwise, the skipped step and the scale included.
  for (bool scaler : {false, true}) {
    for (int stage : {0, 1, 2}) {
      INFO((scaler ? "loss scaler" : "no scaler") << ", stage " << stage);
      Net dev(DType::f32, true), host(DType::f32, false);
      ZeroOptions zo{.stage = stage, .bucket_mb = 0.0005};
      if (scaler) zo.loss_scaler = LossScaler{.init_scale = 1024.0, .growth_interval = 2};
      ZeroRedundancyOptimizer od(world(), dev.params(), AdamW{.lr = 0.25}, zo);
      ZeroRedundancyOptimizer oh(world(), host.params(), AdamW{.lr = 0.25}, zo);
      std::uint32_t* hold = rt().allocate_flags(1);
      bool waited = false, pending = true;
      for (int step = 0; step < 4; ++step) {
        const bool overflow = scaler && step == 1 && world_rank() == world_size() - 1;
        rt().wait_flag(nullptr, hold, std::uint32_t(step + 1));
        std::atomic<bool> returned{false};
        std::thread watchdog([&] {
          for (int k = 0; k < 2000 && !returned; ++k)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          if (!returned) waited = true;
          rt().set_flag(hold, std::uint32_t(step + 1));
        });
        for (ZeroRedundancyOptimizer* o : {&od, &oh}) o->zero_grad();
        for (Net* n : {&dev, &host}) {
          n->write_grads(step);
          if (!overflow) continue;
          n->set(n->host_g[0], 3, std::numeric_limits<float>::infinity());
          if (n->device) rt().copy(n->g[0], n->host_g[0].data(), n->host_g[0].size(), nullptr);
        }
        const StepInfo info = od.step();
        returned = true;
        watchdog.join();
        pending = pending && info.pending == scaler;
        oh.step();
      }
      rt().synchronize(nullptr);
      rt().release_flags(hold);
      CHECK(all_ranks_true(!waited && pending));
      CHECK(all_ranks_true(dev.param_bytes() == host.param_bytes()));
      CHECK(all_ranks_true(od.steps() == oh.steps() && od.skipped_steps() == oh.skipped_steps() &&
                           od.loss_scale() == oh.loss_scale()));
      CHECK(oh.skipped_steps() == (scaler ? 1 : 0));
    }
  }
}

TEST_CASE("device collectives that fail on the stream are reported by the next call",
          "[device][comm][errors][sim-only]") {
  // The device's own collectives fail asynchronously, as NCCL's do: the
  // call that enqueued one has returned. The next call on that
  // communicator throws CommError on every rank naming it, and the host
  // never hangs: the failed collective and those after it move nothing on
  // any rank. A communicator of its own, so the failure stays in it.
  // Where the device's own collectives cannot be had (ranks that share a
  // device; the test runner's communicators moving device buffers over
  // MPI, beside which NCCL must not run), forcing them fails on every rank
  // with the reason instead.
  const bool shared = ranks_share_a_device();
  if (shared || detail::live_device_transports(detail::DeviceTransport::mpi) > 0) {
    CHECK(all_ranks_true(throws_error<UnsupportedError>(
        [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl}); },
        ErrorCode::unsupported,
        shared ? "and NCCL takes one device per rank"
               : "must not run collectives on one device side by side")));
    return;
  }
  Communicator c(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl});
  const std::size_t n = 1000;
  auto* dev = static_cast<float*>(rt().allocate(n * 4, "a test buffer"));
  rt().zero(dev, n * 4, nullptr);
  sim::fail_collective_after(0);
  Request r = c.iallreduce(dev, dev, n, DType::f32, ReduceOp::sum);
  bool raised = false;
  try {
    r.wait();  // the stream waits; the failure may not have happened yet
    rt().synchronize(nullptr);
    c.allreduce(dev, dev, n, DType::f32, ReduceOp::sum);
  } catch (const CommError& e) {
    raised = std::string(e.message())
                 .find(
                     "an earlier collective on device buffers failed: "
                     "simulated failure of the device's allreduce") != std::string::npos;
    if (!raised) UNSCOPED_INFO("rank " << world_rank() << ": " << e.what());
  }
  sim::fail_collective_after(-1);
  CHECK(all_ranks_true(raised));
  // Host buffers on the same communicator still work.
  std::int64_t one = 1;
  c.allreduce(&one, &one, 1, DType::i64, ReduceOp::sum);
  CHECK(one == world_size());
  rt().release(dev);

  // In the optimizer: a step whose reduction fails on the device is
  // reported by the next call that uses the communicator, on every rank.
  Net net(DType::f32, true);
  Communicator oc(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl});
  ZeroRedundancyOptimizer opt(oc, net.params(), AdamW{.lr = 0.25},
                              {.stage = 2, .loss_scaler = LossScaler{}});
  net.write_grads(0);
  opt.step();
  sim::fail_collective_after(0);  // step 2's first reduce-scatter
  net.write_grads(1);
  // Enqueued: step 2 itself may return, or (where the failure has already
  // happened when its allgather is enqueued) throw naming it; either way
  // the failure is sticky and step 3 throws on every rank.
  const char* named =
      "an earlier collective on device buffers failed: simulated failure of the device's";
  bool step2_ok = true;
  try {
    opt.step();
  } catch (const CommError& e) {
    step2_ok = std::string(e.message()).find(named) != std::string::npos;
    if (!step2_ok) UNSCOPED_INFO("rank " << world_rank() << ": " << e.what());
  }
  CHECK(all_ranks_true(step2_ok));
  sim::fail_collective_after(-1);
  net.write_grads(2);
  CHECK(all_ranks_true(throws_error<CommError>([&] { opt.step(); }, ErrorCode::nccl, named)));
}

TEST_CASE("device buffers: no rank has a device", "[.no-device-anywhere]") {
  // Run with SHARDOPT_SIM_DEVICES=0 on every rank: no transport of device
  // buffers is made, and a forced nccl fails on every rank saying why.
  CHECK(all_ranks_true(detail::device_runtime() == nullptr));
  Communicator comm(MPI_COMM_WORLD);
  CHECK(all_ranks_true(std::string(comm.device_backend_name()) == "none"));
  CHECK(all_ranks_true(throws_error<UnsupportedError>(
      [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl}); },
      ErrorCode::unsupported, "cannot be used: no rank has a device")));
  CHECK(all_ranks_true(still_works(comm)));
  comm.free();
}

TEST_CASE("device buffers: ranks that share a device", "[.shared-device]") {
  // Run at 3 ranks or more (the devices are named, as GPUs are), rank 2
  // on device 1, the others on device 0: ranks 0 and 1 share theirs. auto
  // takes MPI on the device buffers where every rank's MPI takes them
  // (SHARDOPT_CUDA_AWARE_MPI=yes in one run), else the staged transport,
  // and works; a forced nccl, which takes one device per rank, fails on
  // every rank naming the two ranks and the device.
  sim::set_device(world_rank() == 2 ? 1 : 0);
  const bool aware = settings().cuda_aware_mpi == CudaAwareMpi::yes;
  Communicator comm(MPI_COMM_WORLD);
  CHECK(all_ranks_true(std::string(comm.device_backend_name()) == (aware ? "mpi" : "staged")));
  const std::size_t n = 300;
  auto* dev = static_cast<float*>(rt().allocate(n * 4, "a test buffer"));
  std::vector<float> host(n, 1.0f);
  rt().copy(dev, host.data(), n * 4, nullptr);
  comm.allreduce(dev, dev, n, DType::f32, ReduceOp::sum);
  rt().copy(host.data(), dev, n * 4, nullptr);
  CHECK(all_ranks_true(host == std::vector<float>(n, float(world_size()))));
  rt().release(dev);
  CHECK(all_ranks_true(throws_error<UnsupportedError>(
      [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl}); },
      ErrorCode::unsupported,
      "cannot be used: ranks 0 and 1 use the same device (simulated device 0), and NCCL takes "
      "one device per rank")));
  CHECK(all_ranks_true(still_works(comm)));
  comm.free();
  sim::set_device(0);
}

TEST_CASE("device buffers: MPI is given device buffers only where it says it takes them",
          "[.mpi-choice]") {
  // Run with SHARDOPT_CUDA_AWARE_MPI unset (ask) on every rank but rank 0,
  // which says yes. Asked, the MPI library answers for itself: shardopt's
  // answer is what Open MPI's MPIX_Query_cuda_support() says, asked here
  // directly (Debian's Open MPI: not CUDA-aware). auto never takes MPI then
  // (the simulated device's own collectives, or staged where they cannot be
  // used); a forced mpi fails on every rank saying which MPI is the cause.
  const bool yes_here = settings().cuda_aware_mpi == CudaAwareMpi::yes;
  CHECK(all_ranks_true(yes_here == (world_rank() == 0)));
  bool library = false;
#if SHARDOPT_HAVE_MPIX_CUDA
  library = MPIX_Query_cuda_support() == 1;
#endif
  CHECK(detail::mpi_library_cuda_aware() == library);
  CHECK(detail::mpi_takes_device_buffers() == (yes_here || library));
  if (library) {
    WARN("this MPI is CUDA-aware: the refusal of a forced mpi is not checked here");
    return;
  }
  Communicator comm(MPI_COMM_WORLD);
  CHECK(all_ranks_true(std::string(comm.device_backend_name()) == "nccl (simulated)"));
  {
    Communicator staged(MPI_COMM_WORLD, {.device_comm = DeviceComm::staged});
    CHECK(all_ranks_true(std::string(staged.device_backend_name()) == "staged"));
  }
  CHECK(all_ranks_true(throws_error<UnsupportedError>(
      [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = DeviceComm::mpi}); },
      ErrorCode::unsupported,
      world_rank() == 0 ? "cannot be used: some rank's MPI is not known to take device buffers"
                        : "cannot be used: this rank's MPI is not known to take device buffers "
                          "(it says it is not CUDA-aware, cannot say, or "
                          "SHARDOPT_CUDA_AWARE_MPI=no)")));
  CHECK(all_ranks_true(still_works(comm)));
}

TEST_CASE("device buffers: NCCL and MPI never move device buffers side by side", "[.mpi-aware]") {
  // Run with SHARDOPT_CUDA_AWARE_MPI=yes: MPI takes device buffers, and
  // SHARDOPT_DEVICE_COMM=staged: the test runner's communicators use
  // neither NCCL nor MPI on device buffers. NCCL
  // documents a deadlock when its collectives and a CUDA-aware MPI's run on
  // one device concurrently, so while a Communicator of either kind lives,
  // the other kind cannot be forced (on every rank, saying why) and auto
  // takes the live kind; once it is gone, the other can be made.
  REQUIRE(detail::mpi_takes_device_buffers());
  const std::string deadlock =
      "and NCCL and a CUDA-aware MPI must not run collectives on one device side by side";
  const std::size_t n = 1000;
  auto* dev = static_cast<float*>(rt().allocate(n * 4, "a test buffer"));
  auto sums = [&](Communicator& c) {
    std::vector<float> host(n, 2.0f);
    rt().copy(dev, host.data(), n * 4, nullptr);
    c.allreduce(dev, dev, n, DType::f32, ReduceOp::avg);
    rt().copy(host.data(), dev, n * 4, nullptr);
    return all_ranks_true(host == std::vector<float>(n, 2.0f));
  };
  {
    Communicator nccl(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl});
    CHECK(all_ranks_true(throws_error<UnsupportedError>(
        [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = DeviceComm::mpi}); },
        ErrorCode::unsupported,
        "cannot be used: another Communicator of this process moves device buffers over "
        "NCCL, " +
            deadlock)));
    Communicator automatic(MPI_COMM_WORLD, {.device_comm = DeviceComm::automatic});
    CHECK(all_ranks_true(std::string(automatic.device_backend_name()) == "nccl (simulated)"));
    CHECK(sums(nccl));
  }
  {
    Communicator mpi(MPI_COMM_WORLD, {.device_comm = DeviceComm::mpi});
    CHECK(all_ranks_true(std::string(mpi.device_backend_name()) == "mpi"));
    CHECK(all_ranks_true(throws_error<UnsupportedError>(
        [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl}); },
        ErrorCode::unsupported,
        "cannot be used: another Communicator of this process moves device buffers over a "
        "CUDA-aware MPI, " +
            deadlock)));
    Communicator automatic(MPI_COMM_WORLD, {.device_comm = DeviceComm::automatic});
    CHECK(all_ranks_true(std::string(automatic.device_backend_name()) == "mpi"));
    CHECK(sums(mpi));
    CHECK(sums(automatic));
    // Freed, a communicator no longer counts.
    automatic.free();
    mpi.free();
    Communicator nccl(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl});
    CHECK(sums(nccl));
  }
  rt().release(dev);
}

TEST_CASE("device ZeRO: a rank without a device among ranks with one", "[.no-device]") {
  // Run with SHARDOPT_SIM_DEVICES=0 on rank 0 only: its Communicator still
  // duplicates with the others, host collectives work, and an optimizer on
  // device buffers elsewhere fails on every rank.
  const bool has_device = detail::device_runtime() != nullptr;
  CHECK(all_ranks_true(has_device == (world_rank() != 0)));
  Communicator comm(MPI_COMM_WORLD);
  std::int64_t one = 1, sum = 0;
  comm.allreduce(&one, &sum, 1, DType::i64, ReduceOp::sum);
  CHECK(all_ranks_true(sum == world_size()));
  Net net(DType::f32, has_device);
  CHECK(all_ranks_true(throws_error<DeviceError>(
      [&] { ZeroRedundancyOptimizer opt(comm, net.params(), Adam{}, {}); }, ErrorCode::wrong_device,
      "but in host memory on rank 0")));
  // The ranks agree on the transport: staged, which a rank without a device
  // can take part in; the device's own collectives, forced, fail everywhere.
  CHECK(all_ranks_true(std::string(comm.device_backend_name()) == "staged"));
  CHECK(all_ranks_true(throws_error<UnsupportedError>(
      [&] { Communicator c(MPI_COMM_WORLD, {.device_comm = DeviceComm::nccl}); },
      ErrorCode::unsupported, world_rank() == 0 ? "this rank has no device" : "some rank has no")));
  CHECK(all_ranks_true(still_works(comm)));
  comm.free();
}
