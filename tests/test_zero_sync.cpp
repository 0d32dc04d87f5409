// check_sync(): after real steps at every stage and precision every rank's
// parameters are the same bytes; one element changed on one rank is found
// on every rank (the parameter, the element, each rank's value) whatever
// the rank; the automatic check (ZeroOptions::check_sync_every) throws
// DesyncError on every rank at the first checked step after the copies
// diverge, and not before; bad and disagreeing values of the option. And
// the communication StepInfo reports: bytes, spans, bus bandwidths.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/zero.hpp"
#include "zero_helpers.hpp"

using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::zero;

namespace {

// Random gradients that differ per rank (written on the host, then
// uploaded in a device run).
void random_grads(Model& m, std::int64_t batch) {
  const Layout& l = m.layout();
  for (std::size_t i = 0; i < l.size(); ++i) {
    fill_grad(m.grad_host(i), m.dtype(), l.sizes[i], GradKind::random, 77, batch, world_rank(), i,
              false);
    Model::upload(m.grad_data(i), m.grad_host(i), l.sizes[i] * dtype_size(m.dtype()));
  }
}

// One step on them.
void random_step(ZeroRedundancyOptimizer& opt, Model& m, std::int64_t batch) {
  random_grads(m, batch);
  opt.step();
}

// The same SyncReport on every rank.
bool same_everywhere(const SyncReport& r) {
  const std::string text = std::to_string(r.in_sync) + "|" + r.param + "|" +
                           std::to_string(r.index) + "|" + std::to_string(r.element) + "|" +
                           r.message;
  std::uint64_t h = 0;
  for (char c : text) h = h * 131 + static_cast<unsigned char>(c);
  std::int64_t lo = static_cast<std::int64_t>(h), hi = lo;
  world().allreduce(&lo, &lo, 1, DType::i64, ReduceOp::min);
  world().allreduce(&hi, &hi, 1, DType::i64, ReduceOp::max);
  return lo == hi;
}

const Layout& sync_layout() {
  static const Layout l = make_layout({1, 7, 1000, 13, 0, 257});
  return l;
}

}  // namespace

TEST_CASE("check_sync: in sync after steps, at every stage and precision", "[zero][sync]") {
  for (int stage : {0, 1, 2}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      INFO("stage " << stage << ", " << dtype_name(t));
      Model m(sync_layout(), t, false, false, 5);
      ZeroRedundancyOptimizer opt(world(), m.params(), AdamW{.lr = 0.01},
                                  ZeroOptions{.stage = stage, .bucket_mb = 0.001});
      for (int s = 0; s < 3; ++s) random_step(opt, m, s);
      const SyncReport r = opt.check_sync();
      CHECK(all_ranks_true(r.in_sync && r.param.empty() && r.message.empty()));
    }
  }
}

TEST_CASE("check_sync: one changed element on one rank is named on every rank", "[zero][sync]") {
  if (world_size() < 2) {
    // One rank is always in sync with itself; nothing to perturb against.
    Model m(sync_layout(), DType::f32, false, false, 5);
    ZeroRedundancyOptimizer opt(world(), m.params(), Adam{.lr = 0.01});
    *static_cast<float*>(m.param_data(2)) += 1.0f;
    m.push();
    CHECK(opt.check_sync().in_sync);
    return;
  }
  for (DType t : {DType::f32, DType::bf16}) {
    for (int odd = 0; odd < world_size(); ++odd) {
      INFO(dtype_name(t) << ", changed on rank " << odd);
      Model m(sync_layout(), t, false, false, 5);
      ZeroRedundancyOptimizer opt(world(), m.params(), AdamW{.lr = 0.01},
                                  ZeroOptions{.stage = 2, .bucket_mb = 0.001});
      random_step(opt, m, 0);
      m.pull();
      // Element 421 of parameter 2, and (later in the list) parameter 5.
      const float before = m.param(2, 421), before5 = m.param(5, 3);
      const float after = before + 0.5f;
      if (world_rank() == odd) {
        store(t, m.param_data(2), 421, after);
        store(t, m.param_data(5), 3, before5 + 1.0f);
        m.push();
      }
      const SyncReport r = opt.check_sync();
      CHECK(all_ranks_true(!r.in_sync));
      CHECK(all_ranks_true(same_everywhere(r)));
      CHECK(r.param == sync_layout().names[2]);
      CHECK(r.index == 2);
      CHECK(r.element == 421);
      // Each rank's value at the element, grouped.
      std::vector<int> others;
      for (int q = 0; q < world_size(); ++q)
        if (q != odd) others.push_back(q);
      std::string rest = others.size() == 1 ? "rank " : "ranks ";
      for (std::size_t k = 0; k < others.size(); ++k)
        rest += (k ? ", " : "") + std::to_string(others[k]);
      char b[32], a[32];
      std::snprintf(b, sizeof b, "%.9g", before);
      std::snprintf(a, sizeof a, "%.9g", round_to(t, after));
      const std::string values =
          odd == 0 ? std::string(a) + " on rank 0, " + b + " on " + rest
                   : std::string(b) + " on " + rest + ", " + a + " on rank " + std::to_string(odd);
      CHECK_THAT(r.message, Catch::Contains("parameter '" + sync_layout().names[2] + "'"));
      CHECK_THAT(r.message, Catch::EndsWith("first element that differs is [421]: " + values));
      // Put back: in sync again, and the optimizer still steps.
      if (world_rank() == odd) {
        store(t, m.param_data(2), 421, before);
        store(t, m.param_data(5), 3, before5);
        m.push();
      }
      CHECK(all_ranks_true(opt.check_sync().in_sync));
      CHECK(all_ranks_true(no_throw([&] { random_step(opt, m, 1); })));
    }
  }
}

TEST_CASE("check_sync_every: DesyncError on every rank at the next checked step", "[zero][sync]") {
  // Stage 0: every rank updates every parameter, so a copy that differs
  // stays different. (At stages 1 and 2 the next step's allgather writes
  // the owner's values over every copy.) With a loss scaler too: on a
  // device its verdict is then counted before the check.
  for (bool scaler : {false, true}) {
    INFO((scaler ? "loss scaler" : "no scaler"));
    Model m(sync_layout(), DType::f32, false, false, 5);
    ZeroOptions zo{.stage = 0, .check_sync_every = 3};
    if (scaler) zo.loss_scaler = LossScaler{};
    ZeroRedundancyOptimizer opt(world(), m.params(), Adam{.lr = 0.01}, zo);
    // Checked after steps 3 and 6: in sync, no error.
    CHECK(all_ranks_true(no_throw([&] {
      for (int s = 0; s < 6; ++s) random_step(opt, m, s);
    })));
    // One element of parameter 1 changed on the last rank: steps 7 and 8
    // are not checked, step 9 is.
    if (world_rank() == world_size() - 1) {
      m.pull();
      *static_cast<float*>(m.param_data(1)) += 0.25f;
      m.push();
    }
    CHECK(all_ranks_true(no_throw([&] {
      random_step(opt, m, 6);
      random_step(opt, m, 7);
    })));
    if (world_size() > 1) {
      CHECK(all_ranks_true(throws_error<DesyncError>(
          [&] { random_step(opt, m, 8); }, ErrorCode::desync,
          "after step 9, the parameters differ between ranks: parameter '" +
              sync_layout().names[1] + "'")));
      CHECK(opt.steps() == 9);  // the step itself was applied
    } else {
      CHECK(no_throw([&] { random_step(opt, m, 8); }));
    }
  }
}

TEST_CASE("check_sync_every: a bad value is an error", "[zero][sync]") {
  Model m(sync_layout(), DType::f32, false, false, 5);
  CHECK(all_ranks_true(throws_error<InvalidArgument>(
      [&] {
        ZeroRedundancyOptimizer opt(world(), m.params(), Adam{.lr = 0.01},
                                    ZeroOptions{.check_sync_every = -2});
      },
      ErrorCode::invalid_argument, "check_sync_every is -2")));
  // A value on one rank only: a layout mismatch, not a hang.
  if (world_size() > 1) {
    const int every = world_rank() == 0 ? 5 : -1;
    CHECK(all_ranks_true(throws_error<Error>(
        [&] {
          ZeroRedundancyOptimizer opt(world(), m.params(), Adam{.lr = 0.01},
                                      ZeroOptions{.check_sync_every = every});
        },
        ErrorCode::layout_mismatch, "check_sync_every")));
  }
}

TEST_CASE("StepInfo: bytes moved, spans and bus bandwidths of each step", "[zero][stats]") {
  // One bucket (bucket_mb large): its padded length is the total rounded
  // up to a multiple of 16 N elements, which each collective moves whole.
  const Layout& l = sync_layout();
  const std::size_t n = static_cast<std::size_t>(world_size());
  const std::size_t padded = (l.total() + 16 * n - 1) / (16 * n) * (16 * n);
  for (int stage : {0, 1, 2}) {
    for (DType t : {DType::f32, DType::bf16}) {
      INFO("stage " << stage << ", " << dtype_name(t));
      Model m(l, t, false, false, 5);
      ZeroRedundancyOptimizer opt(world(), m.params(), AdamW{.lr = 0.01},
                                  ZeroOptions{.stage = stage, .bucket_mb = 64});
      for (int s = 0; s < 2; ++s) {
        random_grads(m, s);
        const StepInfo info = opt.step();
        const std::size_t es = dtype_size(t);
        // Stage 2 reduces into the fp32 shard from 16-bit gradients in their
        // own type; stages 0 and 1 reduce-scatter and allgather them.
        const std::uint64_t reduce = padded * es * (stage < 2 ? 2 : 1);
        const std::uint64_t gather = stage > 0 ? padded * es : 0;
        CHECK(info.reduce_bytes == reduce);
        CHECK(info.gather_bytes == gather);
        CHECK(info.reduce_span_seconds > 0.0);
        CHECK(info.exposed_comm_seconds >= 0.0);
        CHECK(info.exposed_comm_seconds <=
              info.reduce_seconds + info.gather_seconds + info.update_seconds);
        const double share = double(n - 1) / double(n);
        CHECK(info.reduce_busbw_gbps ==
              Approx(double(reduce) * share / info.reduce_span_seconds / 1e9));
        if (stage > 0 && info.gather_seconds > 0)
          CHECK(info.gather_busbw_gbps ==
                Approx(double(gather) * share / info.gather_seconds / 1e9));
        if (n == 1) CHECK(info.reduce_busbw_gbps == 0.0);
      }
    }
  }
}
