// ZeRO stage 3 (parameters sharded, gathered a unit at a time): the same
// parameters, bitwise, as stage 2 with the same units, at every rank count,
// in fp32 and bf16, with every optimizer, with clipping; a checkpoint saved
// at stage 3 loads at stage 2 and back.
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

using namespace shardopt;
using namespace shardopt::test;

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

struct Run {
  std::vector<std::vector<std::byte>> params, grads;
  std::unique_ptr<ZeroRedundancyOptimizer> opt;
};

Run make(Communicator& c, DType t, int stage, const OptimizerConfig& o, bool stream = false) {
  Run r;
  std::vector<Param> ps;
  for (std::size_t i = 0; i < kNumel.size(); ++i) {
    r.params.emplace_back(kNumel[i] * dtype_size(t));
    r.grads.emplace_back(kNumel[i] * dtype_size(t));
    for (std::size_t k = 0; k < kNumel[i]; ++k)
      store(t, r.params[i].data(), k, std::sin(0.37f * float(i) + 0.011f * float(k)));
    std::string name = "p";
    name += std::to_string(i);
    ps.push_back({.name = name,
                  .data = r.params[i].data(),
                  .numel = kNumel[i],
                  .dtype = t,
                  .grad = stream ? nullptr : r.grads[i].data(),
                  .unit = kUnit[i]});
  }
  r.opt = std::make_unique<ZeroRedundancyOptimizer>(
      c, ps, o, ZeroOptions{.stage = stage, .bucket_mb = 0.002, .stream_grads = stream});
  return r;
}

// The gradients, from the parameters as the step sees them.
void backward(Run& r, DType t, int rank, int step) {
  // Stage 3: unit 0 gathered, each later one prefetched (igather) while the
  // one before it is used.
  const bool three = r.opt->stage() == 3;
  if (three) r.opt->gather(0);
  for (std::size_t u = 0; u < r.opt->num_units(); ++u) {
    if (three && u + 1 < r.opt->num_units()) r.opt->igather(u + 1);
    for (std::size_t i = 0; i < kNumel.size(); ++i) {
      if (kUnit[i] != int(u)) continue;
      const auto* p = static_cast<const std::byte*>(r.opt->data(i));
      for (std::size_t k = 0; k < kNumel[i]; ++k)
        store(t, r.grads[i].data(), k,
              0.1f * std::cos(3.0f * value(t, p, k) + float(rank) + 0.1f * float(step)));
    }
    if (three) r.opt->release(u);
  }
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
  for (DType t : {DType::f32, DType::bf16}) {
    for (const OptimizerConfig& o : every) {
      INFO(dtype_name(t) << ", optimizer " << o.index());
      Run two = make(c, t, 2, o), three = make(c, t, 3, o);
      REQUIRE(three.opt->num_units() == 5);
      for (int s = 0; s < 4; ++s) {
        backward(two, t, c.rank(), s);
        backward(three, t, c.rank(), s);
        CHECK(two.opt->clip_grad_norm(0.5) == three.opt->clip_grad_norm(0.5));
        two.opt->step();
        three.opt->step();
      }
      bool same = true;
      for (std::size_t u = 0; u < three.opt->num_units(); ++u) {
        three.opt->gather(u);
        for (std::size_t i = 0; i < kNumel.size(); ++i)
          if (kUnit[i] == int(u) && kNumel[i] > 0)
            same = same && std::memcmp(three.opt->data(i), two.params[i].data(),
                                       kNumel[i] * dtype_size(t)) == 0;
        three.opt->release(u);
        CHECK(three.opt->data(three.opt->num_params() - 1) == nullptr);
      }
      CHECK(all_ranks_true(same));
    }
  }
}

TEST_CASE("a checkpoint saved at stage 3 loads at stage 2 and back", "[zero][stage3][ckpt]") {
  Communicator& c = world();
  const zero::TempDir dir;
  const std::string path = dir.file("s3.safetensors");
  const OptimizerConfig adam = Adam{.lr = 1e-2};
  for (DType t : {DType::f32, DType::bf16}) {
    Run three = make(c, t, 3, adam);
    for (int s = 0; s < 2; ++s) {
      backward(three, t, c.rank(), s);
      three.opt->step();
    }
    three.opt->save(path);
    // Stage 2 from the file, then both take two more steps.
    Run two = make(c, t, 2, adam);
    two.opt->load(path);
    bool same = true;
    for (int s = 2; s < 4; ++s) {
      backward(two, t, c.rank(), s);
      backward(three, t, c.rank(), s);
      two.opt->step();
      three.opt->step();
    }
    // And back: stage 3 from stage 2's file.
    two.opt->save(path);
    Run back = make(c, t, 3, adam);
    back.opt->load(path);
    for (std::size_t u = 0; u < three.opt->num_units(); ++u) {
      three.opt->gather(u);
      back.opt->gather(u);
      for (std::size_t i = 0; i < kNumel.size(); ++i)
        if (kUnit[i] == int(u) && kNumel[i] > 0)
          same =
              same &&
              std::memcmp(three.opt->data(i), two.params[i].data(), kNumel[i] * dtype_size(t)) ==
                  0 &&
              std::memcmp(back.opt->data(i), two.params[i].data(), kNumel[i] * dtype_size(t)) == 0;
      three.opt->release(u);
      back.opt->release(u);
    }
    CHECK(all_ranks_true(same));
    CHECK(all_ranks_true(back.opt->gather_state("exp_avg", 1) ==
                         two.opt->gather_state("exp_avg", 1)));
  }
}

TEST_CASE("stage 3 with streamed gradients gives stage 2's parameters bitwise", "[zero][stage3]") {
  Communicator& c = world();
  const OptimizerConfig adam = Adam{.lr = 1e-2};
  for (DType t : {DType::f32, DType::bf16}) {
    Run two = make(c, t, 2, adam), three = make(c, t, 3, adam, true);
    for (int s = 0; s < 3; ++s) {
      backward(two, t, c.rank(), s);
      backward(three, t, c.rank(), s);  // into the Run's own buffers, passed below
      for (std::size_t i = kNumel.size(); i-- > 0;) three.opt->grad_ready(i, three.grads[i].data());
      two.opt->step();
      three.opt->step();
    }
    bool same = true;
    for (std::size_t u = 0; u < three.opt->num_units(); ++u) {
      three.opt->gather(u);
      for (std::size_t i = 0; i < kNumel.size(); ++i)
        if (kUnit[i] == int(u) && kNumel[i] > 0)
          same = same && std::memcmp(three.opt->data(i), two.params[i].data(),
                                     kNumel[i] * dtype_size(t)) == 0;
      three.opt->release(u);
    }
    CHECK(all_ranks_true(same));
  }
}

TEST_CASE("stage 3's misuse is an error on every rank", "[zero][stage3][errors]") {
  Communicator& c = world();
  Run three = make(c, DType::f32, 3, Adam{});
  // Different units at the same point: every rank names each rank's unit.
  if (c.size() > 1) {
    const std::size_t mine = c.rank() == 0 ? 0 : 1;
    CHECK(all_ranks_true(throws_error([&] { three.opt->gather(mine); }, ErrorCode::invalid_state,
                                      "rank 1: unit 1 ('p2'")));
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
  // Stages 0-2 have no units to gather.
  Run two = make(c, DType::f32, 2, Adam{});
  CHECK(all_ranks_true(
      throws_error([&] { two.opt->gather(0); }, ErrorCode::invalid_state, "stage 3's")));
  CHECK(all_ranks_true(
      throws_error([&] { three.opt->check_sync(); }, ErrorCode::unsupported, "stage 3")));
  // And the optimizer still steps.
  backward(three, DType::f32, c.rank(), 0);
  three.opt->step();
  CHECK(three.opt->steps() == 1);
}

TEST_CASE("stage 3's memory report counts the parameter shard and the gathered units",
          "[zero][stage3]") {
  Communicator& c = world();
  Run three = make(c, DType::bf16, 3, Adam{});
  Run two = make(c, DType::bf16, 2, Adam{});
  const MemoryReport m3 = three.opt->memory_report(), m2 = two.opt->memory_report();
  // The shard: this rank's pieces of every bucket, as many elements as the
  // master weights' fp32 shard.
  CHECK(m3.param_shard == m3.master_params / 2);
  CHECK(m3.gathered_units == 0);
  CHECK(m2.param_shard == 0);
  CHECK(m3.master_params == m2.master_params);
  CHECK(m3.optimizer_state == m2.optimizer_state);
  three.opt->gather(2);
  const MemoryReport g = three.opt->memory_report();
  CHECK(g.gathered_units >= (2048 + 300) * 2);  // unit 2: 'p3' and 'p4', in bf16
  CHECK(g.allocated() == m3.allocated() + g.gathered_units);
  three.opt->release(2);
  CHECK(three.opt->memory_report().gathered_units == 0);
}
