// shardopt: plan_memory() (shardopt/zero.hpp): the engine's memory for a
// run described without running it, from the engine's own layout
// (lib/zero/shards.hpp) and buffer sizes (lib/zero/buffers.hpp), deciding
// as ZeroEngine's construction does (lib/zero/construction.cpp,
// lib/zero/reduction.cpp) what it would allocate.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/check.hpp"
#include "shardopt/config.hpp"
#include "shardopt/zero.hpp"
#include "zero/buffers.hpp"
#include "zero/gather_pool.hpp"
#include "zero/optimizer_config.hpp"
#include "zero/shards.hpp"

namespace shardopt {

namespace {

[[noreturn]] void bad(const std::string& what, const char* hint) {
  detail::throw_error(ErrorCode::invalid_argument, "plan_memory: " + what, hint, __FILE__,
                      __LINE__);
}

void check(const MemoryPlan& p) {
  const ZeroOptions& o = p.options;
  const char* fix = "fix the MemoryPlan field named";
  if (p.ranks < 1) bad("ranks is " + std::to_string(p.ranks) + "; a run has 1 rank or more", fix);
  if (p.rank < 0 || p.rank >= p.ranks)
    bad("rank is " + std::to_string(p.rank) + " of " + std::to_string(p.ranks) + " ranks",
        "pass a rank from 0 to ranks - 1");
  if (p.nodes < 1 || p.ranks % p.nodes != 0)
    bad("nodes is " + std::to_string(p.nodes) + " for " + std::to_string(p.ranks) + " ranks",
        "pass nodes >= 1 that divides ranks (the same number of ranks on every node)");
  if (o.stage < 0 || o.stage > 3)
    bad("options.stage is " + std::to_string(o.stage), "use stage 0, 1, 2 or 3");
  if (!p.units.empty() && p.units.size() != p.numel.size())
    bad("units has " + std::to_string(p.units.size()) + " entries for " +
            std::to_string(p.numel.size()) + " parameters",
        "give each parameter's unit (Param::unit), or none");
  for (std::size_t i = 1; i < p.units.size(); ++i)
    for (std::size_t j = 0; p.units[i] >= 0 && p.units[i] != p.units[i - 1] && j + 1 < i; ++j)
      if (p.units[j] == p.units[i])
        bad("units: unit " + std::to_string(p.units[i]) + " is split (parameters " +
                std::to_string(j) + " and " + std::to_string(i) + " apart)",
            "give the parameters of a unit consecutive places");
  if (!(o.bucket_mb >= 0.0) || !std::isfinite(o.bucket_mb))
    bad("options.bucket_mb is " + detail::format_number(o.bucket_mb),
        "use a size in MiB > 0, or 0 for SHARDOPT_BUCKET_MB");
  if (!(o.predivide_factor > 0.0) || !std::isfinite(o.predivide_factor))
    bad("options.predivide_factor is " + detail::format_number(o.predivide_factor),
        "use a finite factor > 0 (1: none)");
  if (p.dtype != DType::f32 && p.dtype != DType::bf16 && p.dtype != DType::f16)
    bad(std::string("dtype is ") + dtype_name(p.dtype), "use f32, bf16 or f16");
  if (p.groups.empty()) bad("no parameter group", "pass at least one OptimizerConfig");
  for (const OptimizerConfig& g : p.groups)
    if (g.index() != p.groups[0].index())
      bad("the groups use different kinds of optimizer", "use one kind in every group");
  if (o.stream_grads && o.stage < 2)
    bad("options.stream_grads needs stage 2 or 3", "set stage = 2 or leave stream_grads off");
  if (o.stream_grads && p.user_grads)
    bad("options.stream_grads with user_grads: streamed gradients have no buffer of the user's",
        "leave one of them off");
  const bool custom = p.groups[0].index() == detail::kCustomKind;
  if (o.param_remainders && (p.dtype != DType::bf16 || custom))
    bad("options.param_remainders needs bf16 parameters and a built-in optimizer",
        "leave param_remainders off");
  if (p.device && custom)
    bad("a CustomOptimizer's update runs on the host, not on a device",
        "use a built-in optimizer for device parameters");
  if (p.threads < 0) bad("threads is " + std::to_string(p.threads), "use 1 or more, or 0");
}

// The host transport the Communicator would pick (shm_backend.cpp): whether
// it is shardopt's shared memory on one node.
bool shm_transport(const MemoryPlan& p) {
  const HostComm c = settings().host_comm;
  if (c == HostComm::mpi || p.ranks < 2 || p.nodes > 1) {
    if (c == HostComm::shm && p.nodes > 1)
      bad("SHARDOPT_HOST_COMM=shm needs every rank on one node, but the plan has " +
              std::to_string(p.nodes) + " nodes",
          "use hier or auto (or one node)");
    return false;
  }
  return true;
}

DType reduce_type_of(const MemoryPlan& p) {
  return (p.options.reduce_in_fp32 || p.dtype == DType::f32) ? DType::f32 : p.dtype;
}

// The engine's layout for the plan (ZeroEngine::agree_on_layout, build_layout).
detail::ShardLayout layout_of(const MemoryPlan& p) {
  check(p);
  const double bucket_mb = p.options.bucket_mb > 0.0 ? p.options.bucket_mb : settings().bucket_mb;
  return detail::ShardLayout(
      p.numel, p.ranks, p.rank, p.options.stage,
      detail::ShardLayout::bucket_elements(bucket_mb, dtype_size(reduce_type_of(p)), p.ranks),
      detail::unit_starts(p.units, p.numel.size(), p.options.stage));
}

}  // namespace

LayoutPlan plan_layout(const MemoryPlan& p) {
  const detail::ShardLayout l = layout_of(p);
  LayoutPlan out;
  for (const detail::BucketRange& b : l.buckets) out.buckets.push_back(b.padded);
  out.shard = l.shard;
  out.storage = l.storage;
  if (p.options.stage == 3) {
    const detail::UnitSizes z =
        detail::unit_sizes(l, dtype_size(p.dtype), 0, p.options.persist_below_bytes, false);
    for (std::size_t u = 0; u < l.units.size(); ++u)
      out.units.push_back(
          {l.units[u].first_bucket, l.units[u].end_bucket, z.bytes[u], z.persistent[u]});
  }
  return out;
}

int plan_threads(const MemoryPlan& p) {
  if (p.threads < 0) bad("threads is " + std::to_string(p.threads), "use 1 or more, or 0");
  // The engine's own count: its fused update keeps a block for each of
  // omp_get_max_threads() threads (lib/zero/reduction.cpp).
  return p.threads > 0 ? p.threads : std::max(1, omp_get_max_threads());
}

MemoryReport plan_memory(const MemoryPlan& p) {
  using namespace detail;
  const ShardLayout l = layout_of(p);
  const ZeroOptions& o = p.options;
  // Stage 3 reduces the gradients as stage 2 does.
  const int stage = std::min(o.stage, 2);
  const DType reduce_type = reduce_type_of(p);
  const OptKind kind = p.groups[0].index();
  const bool lamb = kind == kind_of<Lamb>(), custom = kind == kCustomKind;
  bool any = false;  // a parameter with elements
  for (std::size_t n : p.numel) any = any || n > 0;
  const bool streamed = !p.user_grads && o.stream_grads;
  const bool owned = !p.user_grads && !o.stream_grads && any;
  // The fused stage-2 step (GradReducer::allocate): on the node's shared
  // owned gradients, or reading the user's from the other ranks.
  const bool plain = !o.stream_grads && reduce_type == p.dtype && o.predivide_factor == 1.0;
  const bool one_node =
      stage == 2 && settings().fused_update && !p.device && p.ranks > 1 && shm_transport(p);
  const bool fused = one_node && !lamb && !custom && plain && (p.user_grads || owned);
  // Streamed: the two bucket buffers in shared memory, and with an
  // element-wise optimizer the update's blocks (the held buckets).
  const bool shared_pool = one_node && streamed && any;
  const bool held = shared_pool && !lamb && !custom;
  // Which buckets move in place: the buffers of a bucket are contiguous when
  // the user's are one flat buffer, when the bucket holds one parameter
  // with elements, and (gradients) when the optimizer owns them.
  std::vector<BucketInPlace> in_place;
  for (const BucketRange& b : l.buckets) {
    std::size_t nonempty = 0;
    for (std::size_t q = b.first_param; q < b.end_param; ++q) nonempty += p.numel[q] > 0 ? 1 : 0;
    const bool flat = p.contiguous || nonempty <= 1;
    BucketInPlace in;
    in.grads = o.predivide_factor == 1.0 && reduce_type == p.dtype && !streamed &&
               (b.len == b.padded || !p.user_grads) && (flat || !p.user_grads);
    in.params = o.stage == 3 || (b.len == b.padded && flat);  // stage 3 gathers units instead
    in_place.push_back(in);
  }

  MemoryReport m;
  m.master_params = master_bytes(l, p.dtype, o.param_remainders);
  m.optimizer_state = state_bytes(l) * state_slots(p.groups).size() + (lamb ? state_bytes(l) : 0);
  m.grad_shard = grad_shard_bytes(l, stage);
  m.reduced_grads = reduced_bytes(l, p.ranks, stage, p.dtype, reduce_type);
  m.owned_grads = owned ? owned_grad_bytes(l, p.ranks, p.dtype) : 0;
  const int threads = plan_threads(p);
  // Two bucket buffers when some bucket needs one.
  const std::size_t pool =
      pool_bytes(l, p.ranks, stage, p.dtype, reduce_type, m.reduced_grads > 0, in_place);
  m.node_shared = (fused && owned ? m.owned_grads : 0) + (shared_pool ? 2 * pool : 0);
  m.buckets = 2 * pool + (custom ? custom_scratch_bytes(l) : 0) +
              (fused || held ? fused_block_bytes(l, threads) : 0) +
              (fused && p.user_grads ? fused_slice_bytes(threads, p.ranks, p.dtype) : 0);
  const std::size_t elem = dtype_size(p.dtype);
  for (std::size_t n : p.numel) {
    if (o.stage != 3) m.user_params += n * elem;  // stage 3 reads them at construction only
    if (p.user_grads) m.user_grads += n * elem;
  }
  if (o.stage == 3) {
    const UnitSizes z = unit_sizes(l, elem, o.gather_limit_bytes, o.persist_below_bytes,
                                   settings().check_args && !p.device);
    if (z.largest != SIZE_MAX && z.limit < z.bytes[z.largest])
      bad("options.gather_limit_bytes is " + std::to_string(o.gather_limit_bytes) + ", below the " +
              std::to_string(z.bytes[z.largest]) + " bytes of unit " + std::to_string(z.largest),
          "raise gather_limit_bytes to at least the largest unit, or 0 for the automatic limit");
    m.param_shard = l.shard * elem;
    m.gather_pool = z.pool;
    m.persistent_params = z.persistent_bytes();
  }
  (p.device ? m.device_bytes : m.host_bytes) = m.allocated();
  return m;
}

}  // namespace shardopt
