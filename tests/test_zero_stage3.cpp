// ZeRO stage 3 (parameters sharded, gathered a unit at a time): the same
// parameters, bitwise, as stage 2 with the same units, at every rank count,
// in fp32 and bf16, with every optimizer, with clipping, with prefetch and
// units kept for backward or whole; a checkpoint saved at stage 3 loads at
// stage 2 and back; prefetch follows the recorded order; misuse is an error
// on every rank; a released unit is inaccessible (host) or poisoned
// (device) under SHARDOPT_CHECK_ARGS. Also run on the simulated device
// (test_zero_device).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ckpt_helpers.hpp"
#include "mpi_test.hpp"
#include "shardopt/half.hpp"
#include "shardopt/zero.hpp"
#include "zero_reference.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

namespace {

const std::vector<std::size_t> kNumel = {37, 1000, 5, 2048, 300, 77, 0, 129};
const std::vector<int> kUnit = {0, 0, 1, 2, 2, 3, 4, 4};

float value(DType t, const std::byte* p, std::size_t k) {
  if (t == DType::f32) {
    float x;
    std::memcpy(&x, p + 4 * k, 4);
    return x;
  }
  bfloat16 h;
  std::memcpy(&h, p + 2 * k, 2);
  return to_float(h);
}
void store(DType t, std::byte* p, std::size_t k, float x) {
  if (t == DType::f32) {
    std::memcpy(p + 4 * k, &x, 4);
  } else {
    const bfloat16 h = bf16_from_float(x);
    std::memcpy(p + 2 * k, &h, 2);
  }
}

// The parameters (host or device memory: Model) and the optimizer.
struct Job {
  std::unique_ptr<Model> model;
  std::unique_ptr<ZeroRedundancyOptimizer> opt;
  bool stream = false;
  DType t = DType::f32;
  // Parameter i as the optimizer has it (data(i)), in host memory.
  std::vector<std::byte> values(std::size_t i) const {
    std::vector<std::byte> h(kNumel[i] * dtype_size(t));
    Model::download(h.data(), opt->data(i), h.size());
    return h;
  }
};

// Stage 3's own options, from the defaults.
struct Three {
  std::size_t persist = 0;  // ZeroOptions::persist_below_bytes
  bool prefetch = true;
  bool reshard = true;  // reshard_after_forward
  std::size_t limit = 0;
};
// The variants the bitwise tests rotate through: every unit gathered, with
// prefetch; some whole (p2, p5-p7), the rest kept for backward; prefetch off
// in a pool of two units (the largest is 9.4 KB in fp32); the defaults,
// under which every unit of this small model stays whole.
const Three kVariants[] = {{},
                           {.persist = 1024, .reshard = false},
                           {.prefetch = false, .limit = 20000},
                           {.persist = 65536}};

Job make(Communicator& c, DType t, int stage, const OptimizerConfig& o, bool stream = false,
         Three v = {}) {
  Job r;
  r.t = t;
  r.stream = stream;
  r.model = std::make_unique<Model>(make_layout(kNumel), t, true, false, 41);
  std::vector<Param> ps = r.model->params();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    ps[i].unit = kUnit[i];
    if (stream) ps[i].grad = nullptr;  // passed to grad_ready instead
  }
  r.opt = std::make_unique<ZeroRedundancyOptimizer>(c, ps, o,
                                                    ZeroOptions{.stage = stage,
                                                                .bucket_mb = 0.002,
                                                                .stream_grads = stream,
                                                                .gather_limit_bytes = v.limit,
                                                                .prefetch = v.prefetch,
                                                                .reshard_after_forward = v.reshard,
                                                                .persist_below_bytes = v.persist});
  return r;
}

// The forward pass reads every unit in `order` (default: ascending), the
// backward pass in reverse computes the gradients from the parameters as
// the step sees them. At stage 3 each unit is gathered before use and
// released after; with `manual`, each next one is prefetched by the code
// (igather) while the one before it is used.
void pass(Job& r, DType t, int rank, int step, bool manual = true,
          std::vector<std::size_t> order = {}) {
  const bool three = r.opt->stage() == 3;
  if (order.empty())
    for (std::size_t u = 0; u < r.opt->num_units(); ++u) order.push_back(u);
  const std::size_t n = order.size();
  float sum = 0;
  for (int backward = 0; backward < 2; ++backward) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t u = order[backward ? n - 1 - k : k];
      const std::size_t next = k + 1 < n ? order[backward ? n - 2 - k : k + 1] : SIZE_MAX;
      if (three && k == 0) r.opt->gather(u);
      if (three && manual && next != SIZE_MAX) r.opt->igather(next);
      for (std::size_t i = 0; i < kNumel.size(); ++i) {
        if (kUnit[i] != int(u)) continue;
        REQUIRE((r.opt->data(i) != nullptr || kNumel[i] == 0));
        const std::vector<std::byte> p = r.values(i);
        auto* g = static_cast<std::byte*>(r.model->grad_host(i));
        for (std::size_t e = 0; e < kNumel[i]; ++e)
          if (backward)
            store(t, g, e,
                  0.1f * std::cos(3.0f * value(t, p.data(), e) + float(rank) + 0.1f * float(step)));
          else
            sum += value(t, p.data(), e);
        if (backward) {
          Model::upload(r.model->grad_data(i), g, kNumel[i] * dtype_size(t));
          if (r.stream) r.opt->grad_ready(i, r.model->grad_data(i));
        }
      }
      if (three) r.opt->release(u);
      if (three && !manual && next != SIZE_MAX) r.opt->gather(next);
    }
  }
  CHECK(std::isfinite(sum));
}

// Whether stage 3's parameters, gathered unit by unit, are `other`'s bytes.
bool same_params(Job& three, Job& other) {
  bool same = true;
  const bool gathers = other.opt->stage() == 3;
  for (std::size_t u = 0; u < three.opt->num_units(); ++u) {
    three.opt->gather(u);
    if (gathers) other.opt->gather(u);
    for (std::size_t i = 0; i < kNumel.size(); ++i)
      if (kUnit[i] == int(u)) same = same && three.values(i) == other.values(i);
    three.opt->release(u);
    if (gathers) other.opt->release(u);
  }
  return same;
}

}  // namespace

TEST_CASE("stage 3 gives stage 2's parameters bitwise, with the same units", "[zero][stage3]") {
  Communicator& c = world();
  std::vector<OptimizerConfig> every;
  Optimizers::each([&]<class O>() {
    O o;
    o.lr = 1e-2;
    every.push_back(o);
  });
  every.push_back(SGD{.lr = 0.05, .momentum = 0.9});
  int run = 0;
  for (DType t : {DType::f32, DType::bf16}) {
    for (const OptimizerConfig& o : every) {
      const Three v = kVariants[run++ % 4];
      INFO(dtype_name(t) << ", optimizer " << o.index() << ", persist_below_bytes " << v.persist
                         << ", prefetch " << v.prefetch << ", reshard_after_forward " << v.reshard
                         << ", gather_limit_bytes " << v.limit);
      Job two = make(c, t, 2, o), three = make(c, t, 3, o, false, v);
      REQUIRE(three.opt->num_units() == 5);
      for (int s = 0; s < 4; ++s) {
        pass(two, t, c.rank(), s);
        pass(three, t, c.rank(), s, run % 2 == 0);
        CHECK(two.opt->clip_grad_norm(0.5) == three.opt->clip_grad_norm(0.5));
        two.opt->step();
        three.opt->step();
      }
      CHECK(all_ranks_true(same_params(three, two)));
      CHECK(three.opt->data(three.opt->num_params() - 1) == nullptr);
    }
  }
}

TEST_CASE("a checkpoint saved at stage 3 loads at stage 2 and back", "[zero][stage3][ckpt]") {
  Communicator& c = world();
  const zero::TempDir dir;
  const std::string path = dir.file("s3.safetensors");
  const OptimizerConfig adam = Adam{.lr = 1e-2};
  for (DType t : {DType::f32, DType::bf16}) {
    Job three = make(c, t, 3, adam, false, kVariants[1]);
    for (int s = 0; s < 2; ++s) {
      pass(three, t, c.rank(), s);
      three.opt->step();
    }
    three.opt->save(path);
    // Stage 2 from the file, then both take two more steps.
    Job two = make(c, t, 2, adam);
    two.opt->load(path);
    for (int s = 2; s < 4; ++s) {
      pass(two, t, c.rank(), s);
      pass(three, t, c.rank(), s);
      two.opt->step();
      three.opt->step();
    }
    CHECK(all_ranks_true(same_params(three, two)));
    // And back: stage 3 (every unit gathered) from stage 2's file.
    two.opt->save(path);
    Job back = make(c, t, 3, adam);
    back.opt->load(path);
    CHECK(all_ranks_true(same_params(back, two)));
    CHECK(all_ranks_true(back.opt->gather_state("exp_avg", 1) ==
                         two.opt->gather_state("exp_avg", 1)));
  }
}

TEST_CASE("stage 3 with streamed gradients gives stage 2's parameters bitwise", "[zero][stage3]") {
  Communicator& c = world();
  const OptimizerConfig adam = Adam{.lr = 1e-2};
  for (DType t : {DType::f32, DType::bf16}) {
    Job two = make(c, t, 2, adam), three = make(c, t, 3, adam, true, kVariants[1]);
    for (int s = 0; s < 3; ++s) {
      pass(two, t, c.rank(), s);
      pass(three, t, c.rank(), s);  // each gradient passed to grad_ready
      two.opt->step();
      three.opt->step();
    }
    CHECK(all_ranks_true(same_params(three, two)));
  }
}

TEST_CASE("stage 3 prefetches in the recorded order, and records a changed one", "[zero][stage3]") {
  Communicator& c = world();
  // Ten gathers a step, each made by the code as the unit before is
  // released: steps 0-1 forward 0-4 and backward 4-0, steps 2-4 forward
  // 0, 1, 3, 2, 4 and backward in reverse. Step 0 records; from step 1 on,
  // prefetch gathers what the recorded order needs next as far as the pool
  // (the whole model here) has room, from the end of the step before.
  // Releasing: every gather is ahead (the backward pass's first is the unit
  // just released, kept because it is gathered next). Keeping units for
  // backward: the same. Without prefetch: none. Step 2 follows the old
  // order for two gathers, then finds what was prefetched or kept; step 3
  // follows the new order.
  struct Case {
    Three v;
    std::int64_t ahead[5];
  };
  const std::vector<std::size_t> changed = {0, 1, 3, 2, 4};
  for (const Case& k : {Case{{}, {0, 10, 6, 10, 10}}, Case{{.reshard = false}, {0, 10, 7, 10, 10}},
                        Case{{.prefetch = false}, {0, 0, 0, 0, 0}}}) {
    INFO("prefetch " << k.v.prefetch << ", reshard_after_forward " << k.v.reshard);
    Job three = make(c, DType::f32, 3, Adam{}, false, k.v);
    Job two = make(c, DType::f32, 2, Adam{});
    for (int s = 0; s < 5; ++s) {
      INFO("step " << s);
      pass(two, DType::f32, c.rank(), s);
      pass(three, DType::f32, c.rank(), s, false, s >= 2 ? changed : std::vector<std::size_t>{});
      two.opt->step();
      const StepInfo info = three.opt->step();
      CHECK(info.gathers == 10);
      CHECK(info.gathers_ahead == k.ahead[s]);
    }
    CHECK(all_ranks_true(same_params(three, two)));
  }
}

TEST_CASE("stage 3 keeps small units whole on every rank", "[zero][stage3]") {
  Communicator& c = world();
  // Below 1024 bytes in fp32: units 1 (5 elements), 3 (77) and 4 (129).
  Job three = make(c, DType::f32, 3, Adam{.lr = 1e-2}, false, {.persist = 1024});
  Job all = make(c, DType::f32, 3, Adam{.lr = 1e-2});
  std::size_t whole = 0;
  for (std::size_t i : {2, 5, 6, 7}) whole += kNumel[i] * 4;
  CHECK(three.opt->memory_report().persistent_params >= whole);
  CHECK(all.opt->memory_report().persistent_params == 0);
  // Gathering a whole unit moves nothing: it is held at once.
  for (int s = 0; s < 2; ++s) {
    pass(three, DType::f32, c.rank(), s);
    pass(all, DType::f32, c.rank(), s);
    three.opt->step();
    all.opt->step();
  }
  bool same = true;
  for (std::size_t u = 0; u < 5; ++u) {
    three.opt->gather(u);
    all.opt->gather(u);
    for (std::size_t i = 0; i < kNumel.size(); ++i)
      if (kUnit[i] == int(u)) same = same && three.values(i) == all.values(i);
    three.opt->release(u);
    all.opt->release(u);
    CHECK(three.opt->data(2) == nullptr);  // whole, yet not readable outside gather/release
  }
  CHECK(all_ranks_true(same));
}

TEST_CASE("check_sync at stage 3 compares the units as gathered and the whole ones",
          "[zero][stage3]") {
  Communicator& c = world();
  // Units 1, 3 and 4 whole; check_sync_every on every step.
  Job three = make(c, DType::f32, 3, Adam{.lr = 1e-2}, false, {.persist = 1024});
  for (int s = 0; s < 2; ++s) {
    pass(three, DType::f32, c.rank(), s);
    three.opt->step();
  }
  const SyncReport same = three.opt->check_sync();
  CHECK(same.in_sync);
  if (c.size() < 2) return;
  // Rank 1 changes element 40 of its whole copy of parameter 5 (unit 3):
  // found, and named, on every rank.
  three.opt->gather(3);
  if (c.rank() == 1) {
    const float x = 7.0f;
    auto* at = static_cast<std::byte*>(const_cast<void*>(three.opt->data(5))) + 40 * 4;
    if (Model::on_device)
      Model::upload(at, &x, 4);
    else
      std::memcpy(at, &x, 4);
  }
  three.opt->release(3);
  const SyncReport r = three.opt->check_sync();
  CHECK(!r.in_sync);
  CHECK(r.param == "layer5.bias");
  CHECK(r.element == 40);
  CHECK(r.message.find("7 on rank 1") != std::string::npos);
}

TEST_CASE("stage 3's misuse is an error on every rank", "[zero][stage3][errors]") {
  Communicator& c = world();
  Job three = make(c, DType::f32, 3, Adam{});
  // Different units at the same point: every rank names each rank's unit.
  if (c.size() > 1) {
    const std::size_t mine = c.rank() == 0 ? 0 : 1;
    CHECK(all_ranks_true(throws_error([&] { three.opt->gather(mine); }, ErrorCode::invalid_state,
                                      "rank 1: unit 1 ('layer2.weight')")));
  }
  CHECK(all_ranks_true(
      throws_error([&] { three.opt->gather(99); }, ErrorCode::invalid_argument, "5 units")));
  // Gathered twice; step() while gathered; release without a gather.
  three.opt->gather(2);
  CHECK(all_ranks_true(
      throws_error([&] { three.opt->gather(2); }, ErrorCode::invalid_state, "gathered already")));
  CHECK(all_ranks_true(
      throws_error([&] { three.opt->step(); }, ErrorCode::invalid_state, "still gathered")));
  three.opt->release(2);
  CHECK(all_ranks_true(
      throws_error([&] { three.opt->release(2); }, ErrorCode::invalid_state, "not gathered")));
  if (c.size() > 1) {
    three.opt->gather(1);
    const std::size_t mine = c.rank() == 0 ? 1 : 0;
    CHECK(all_ranks_true(throws_error([&] { three.opt->release(mine); }, ErrorCode::invalid_state,
                                      "rank 1: unit 0 ('layer0.weight'...)")));
    three.opt->release(1);
  }
  // Stages 0-2 have no units to gather.
  Job two = make(c, DType::f32, 2, Adam{});
  CHECK(all_ranks_true(
      throws_error([&] { two.opt->gather(0); }, ErrorCode::invalid_state, "stage 3's")));
  three.opt->gather(0);
  CHECK(all_ranks_true(
      throws_error([&] { three.opt->check_sync(); }, ErrorCode::invalid_state, "still gathered")));
  CHECK(all_ranks_true(throws_error([&] { three.opt->load("no-such-checkpoint.safetensors"); },
                                    ErrorCode::invalid_state, "load() with 1 unit(s) still")));
  three.opt->release(0);
  // And the optimizer still steps.
  pass(three, DType::f32, c.rank(), 0);
  three.opt->step();
  CHECK(three.opt->steps() == 1);
}

TEST_CASE("stage 3's gathers past the limit are an error on every rank", "[zero][stage3][errors]") {
  Communicator& c = world();
  // Unit 2 (2348 fp32 elements, 9.4 KB) does not fit a pool of 8000 bytes.
  CHECK(all_ranks_true(throws_error([&] { make(c, DType::f32, 3, Adam{}, false, {.limit = 8000}); },
                                    ErrorCode::invalid_config, "unit 2 ('layer3.bias'...)")));
  // 12000 bytes hold unit 2, not unit 2 and unit 0 (1037 elements) too.
  Job three = make(c, DType::f32, 3, Adam{}, false, {.prefetch = false, .limit = 12000});
  three.opt->gather(2);
  CHECK(all_ranks_true(throws_error([&] { three.opt->gather(0); }, ErrorCode::invalid_state,
                                    "gathers past the limit")));
  three.opt->release(2);
  three.opt->gather(0);  // and fits once unit 2 is released
  three.opt->release(0);
  pass(three, DType::f32, c.rank(), 0, false);
  three.opt->step();
  CHECK(three.opt->steps() == 1);
}

TEST_CASE("stage 3 gathers a unit in a buffer of its own when the pool's room is in pieces",
          "[zero][stage3]") {
  Communicator& c = world();
  // Charged in 256 bytes (fp32): unit 0 4352, unit 1 256, unit 3 512, unit
  // 2 9472 or 9728 with its buckets' padding. In a pool of 11000 bytes,
  // units 0, 1 and 3 take the front; with unit 0 released, 10232 bytes are
  // free but in two pieces (4352 and 5880), too short for unit 2. Under
  // SHARDOPT_CHECK_ARGS each unit takes whole pages: no such pieces.
  if (c.checks_arguments()) return;
  Job three = make(c, DType::f32, 3, Adam{}, false, {.prefetch = false, .limit = 11000});
  Job plain = make(c, DType::f32, 3, Adam{});
  const std::size_t pool = three.opt->memory_report().gather_pool;
  for (std::size_t u : {0, 1, 3}) three.opt->gather(u);
  three.opt->release(0);
  three.opt->gather(2);
  const MemoryReport held = three.opt->memory_report();
  CHECK(held.gather_pool >= pool + 2348 * 4);
  // Its values are those of a gather into the pool.
  plain.opt->gather(2);
  CHECK(three.values(3) == plain.values(3));
  CHECK(three.values(4) == plain.values(4));
  plain.opt->release(2);
  // It counts against the limit: unit 0 no longer fits.
  CHECK(all_ranks_true(throws_error([&] { three.opt->gather(0); }, ErrorCode::invalid_state,
                                    "gathers past the limit")));
  for (std::size_t u : {1, 2, 3}) three.opt->release(u);
  CHECK(three.opt->memory_report().gather_pool == pool);
  // With the pool empty, unit 2 fits in it.
  three.opt->gather(2);
  CHECK(three.opt->memory_report().gather_pool == pool);
  three.opt->release(2);
  pass(three, DType::f32, c.rank(), 0, false);
  three.opt->step();
  CHECK(three.opt->steps() == 1);
}

TEST_CASE("stage 3's memory report counts the parameter shard, the pool and the whole units",
          "[zero][stage3]") {
  Communicator& c = world();
  Job three = make(c, DType::bf16, 3, Adam{}, false, {.persist = 1024, .limit = 65536});
  Job two = make(c, DType::bf16, 2, Adam{});
  const MemoryReport m3 = three.opt->memory_report(), m2 = two.opt->memory_report();
  // The shard: this rank's pieces of every bucket, as many elements as the
  // master weights' fp32 shard.
  CHECK(m3.param_shard == m3.master_params / 2);
  // SHARDOPT_CHECK_ARGS gives each unit whole pages, and a page more each.
  if (c.checks_arguments())
    CHECK(m3.gather_pool > 65536);
  else
    CHECK(m3.gather_pool == 65536);
  CHECK(m3.user_params == 0);
  // Units 1, 3 and 4 are whole (below 1024 bytes in bf16).
  std::size_t whole = 0;
  for (std::size_t i : {2, 5, 6, 7}) whole += kNumel[i] * 2;
  CHECK(m3.persistent_params >= whole);
  CHECK(m2.param_shard == 0);
  CHECK(m2.gather_pool + m2.persistent_params == 0);
  CHECK(m3.master_params == m2.master_params);
  CHECK(m3.optimizer_state == m2.optimizer_state);
  // A gather takes its room in the pool: nothing more is allocated.
  three.opt->gather(2);
  CHECK(three.opt->memory_report().allocated() == m3.allocated());
  three.opt->release(2);
}

#if !SHARDOPT_TEST_DEVICE
TEST_CASE("stage 3 under SHARDOPT_CHECK_ARGS: a released unit read ends the process, naming it",
          "[zero][stage3][errors]") {
  Communicator checked(world().mpi_comm(), CommOptions{.check_arguments = true});
  Job three = make(checked, DType::f32, 3, Adam{});
  three.opt->gather(2);
  const auto* p3 = static_cast<const float*>(three.opt->data(3));
  const float before = p3[100];  // readable while gathered
  three.opt->release(2);
  // A child process reads it after the release, its output into a pipe.
  int out[2];
  REQUIRE(pipe(out) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(out[0]);
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    const volatile float read = p3[100];
    _exit(read == before ? 0 : 1);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
  close(out[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO(text);
  CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(text.find("shardopt: unit 2 ('layer3.bias'...) read or written after its release()") !=
        std::string::npos);
  // Gathered again, the unit is readable, with the same values.
  three.opt->gather(2);
  CHECK(static_cast<const float*>(three.opt->data(3))[100] == before);
  three.opt->release(2);
}
#else
TEST_CASE("stage 3 under SHARDOPT_CHECK_ARGS: a released device unit is poisoned",
          "[zero][stage3][errors]") {
  Communicator checked(world().mpi_comm(), CommOptions{.check_arguments = true});
  Job three = make(checked, DType::f32, 3, Adam{});
  three.opt->gather(2);
  const void* p3 = three.opt->data(3);
  const std::vector<std::byte> before = three.values(3);
  three.opt->release(2);
  // Every bit set: a NaN in any floating type.
  std::vector<std::uint32_t> after(kNumel[3]);
  Model::download(after.data(), p3, after.size() * 4);
  CHECK(std::all_of(after.begin(), after.end(), [](std::uint32_t w) { return w == ~0u; }));
  three.opt->gather(2);
  CHECK(three.values(3) == before);
  three.opt->release(2);
}
#endif
