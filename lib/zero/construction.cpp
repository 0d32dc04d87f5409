// shardopt: the ZeRO engine's construction: local checks, the agreement on
// the layout across ranks, the sharded layout (lib/zero/shards.hpp) and its
// buffers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "comm/agree.hpp"
#include "common/check.hpp"
#include "common/language.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "device/device.hpp"
#include "device/device_runtime.hpp"
#include "shardopt/cast.hpp"
#include "zero/engine.hpp"
#include "zero/optimizer_config.hpp"

namespace shardopt::detail {

namespace {

std::string num(double v) { return format_number(v); }

// "key=value" lines of a group's hyper-parameters, for the fingerprint and
// for naming the first one that differs.
std::string describe_group(const OptimizerConfig& g, int index) {
  return describe_hypers(g, "group " + index_text(index) + " ");
}

}  // namespace

ZeroEngine::ZeroEngine(Communicator& comm, std::vector<Param> params,
                       std::vector<OptimizerConfig> groups, ZeroOptions options)
    : comm_(comm),
      ctl_(comm.mpi_comm()),
      params_(std::move(params)),
      groups_(std::move(groups)),
      opt_(std::move(options)),
      rank_(comm.rank()),
      nranks_(comm.size()) {
  if (!groups_.empty()) kind_ = groups_[0].index();
  if (!params_.empty()) dtype_ = params_[0].dtype;
  std::string error;
  ErrorCode code = ErrorCode::invalid_argument;
  validate_locally(error, code);
  agree_or_throw(ctl_, error, code,
                 "fix the argument on the rank(s) named; every rank must pass valid, "
                 "identical parameter lists and options");
  agree_on_space();
  agree_on_layout();
  build_layout();
  allocate();
  if (rank_ == 0 && log_enabled(LogLevel::info)) {
    // memory_report() is one rank's; the node's memory is its ranks' sum.
    const NodeLayout& nodes = comm_.nodes();
    const std::size_t buckets = reducer().bucket_count();
    std::string per_node = "a node holds the sum over its ranks";
    if (nodes.uniform) {
      const std::string k = std::to_string(nodes.local_ranks);
      per_node = "a node of ";
      per_node.append(k).append(" ranks holds about ").append(k).append(" x that");
    }
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.2f MiB",
                  static_cast<double>(memory_report().allocated()) / (1024.0 * 1024.0));
    SHARDOPT_LOG(info, "ZeRO engine: stage " << opt_.stage << ", " << params_.size()
                                             << (params_.size() == 1 ? " parameter" : " parameters")
                                             << " in " << buckets
                                             << (buckets == 1 ? " bucket, " : " buckets, ")
                                             << nodes.summary() << "; rank 0 allocated " << mib
                                             << " (memory_report(), per rank: " << per_node << ")");
  }
}

ZeroEngine::~ZeroEngine() {
  // Stage 3: prefetched units' allgathers still write into the pool.
  for (Unit& u : units_)
    for (Request& r : u.pending) try {
        r.wait();
      } catch (const std::exception&) {  // a failed communicator: nothing more arrives
      }
}

void ZeroEngine::validate_locally(std::string& error, ErrorCode& code) const {
  const auto fail = [&](ErrorCode c, std::string msg) {
    if (error.empty()) {
      error = std::move(msg);
      code = c;
    }
  };
  const ErrorCode bad = ErrorCode::invalid_argument;
  if (opt_.stage < 0 || opt_.stage > 3)
    fail(bad, "ZeroOptions::stage is " + std::to_string(opt_.stage) + "; use 0, 1, 2 or 3");
  // Units: consecutive parameters with one index; an index met again after
  // another one is a unit split in two.
  for (std::size_t i = 1; i < params_.size(); ++i) {
    const int u = params_[i].unit;
    if (u < 0 || u == params_[i - 1].unit) continue;
    for (std::size_t j = 0; j + 1 < i; ++j)
      if (params_[j].unit == u) {
        fail(bad, "parameter " + index_text(i) + " ('" + params_[i].name + "') is in unit " +
                      std::to_string(u) + ", which ended before it (at parameter " + index_text(j) +
                      ", '" + params_[j].name +
                      "'); a unit is consecutive parameters: register them together");
        break;
      }
  }
  if (!(opt_.bucket_mb >= 0.0) || !std::isfinite(opt_.bucket_mb))
    fail(bad, "ZeroOptions::bucket_mb is " + num(opt_.bucket_mb) +
                  "; use a size in MiB > 0, or 0 for SHARDOPT_BUCKET_MB");
  if (static_cast<int>(opt_.non_finite) < 0 || static_cast<int>(opt_.non_finite) > 3)
    fail(bad, "ZeroOptions::non_finite is " + std::to_string(static_cast<int>(opt_.non_finite)) +
                  "; use NonFinite::automatic, skip, error or ignore");
  else if (opt_.loss_scaler && opt_.non_finite == NonFinite::ignore)
    fail(bad,
         "ZeroOptions::non_finite is NonFinite::ignore with a loss scaler, which needs the check "
         "to back off; use automatic (skip), skip or error, or no loss scaler");
  if (opt_.check_sync_every < -1)
    fail(bad, "ZeroOptions::check_sync_every is " + std::to_string(opt_.check_sync_every) +
                  "; use N > 0 (every N steps), 0 for SHARDOPT_CHECK_SYNC, or -1 for never");
  if (!(opt_.predivide_factor > 0.0) || !std::isfinite(opt_.predivide_factor))
    fail(bad, "ZeroOptions::predivide_factor is " + num(opt_.predivide_factor) +
                  "; use a finite factor > 0 (1: none)");
  if (opt_.loss_scaler) {
    const LossScaler& l = *opt_.loss_scaler;
    if (!(l.init_scale > 0.0) || !std::isfinite(l.init_scale))
      fail(bad, "LossScaler::init_scale must be finite and > 0, not " + num(l.init_scale));
    if (!(l.growth_factor >= 1.0) || !std::isfinite(l.growth_factor))
      fail(bad, "LossScaler::growth_factor must be finite and >= 1, not " + num(l.growth_factor));
    if (!(l.backoff_factor > 0.0 && l.backoff_factor < 1.0))
      fail(bad, "LossScaler::backoff_factor must be in (0, 1), not " + num(l.backoff_factor));
    if (l.growth_interval < 1)
      fail(bad,
           "LossScaler::growth_interval must be >= 1, not " + std::to_string(l.growth_interval));
    if (l.hysteresis < 1)
      fail(bad, "LossScaler::hysteresis must be >= 1, not " + std::to_string(l.hysteresis));
    if (!(l.min_scale > 0.0)) fail(bad, "LossScaler::min_scale must be > 0");
  }
  if (groups_.empty()) fail(bad, "no parameter group: pass at least one OptimizerConfig");
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].index() != kind_)
      fail(bad, std::string("parameter group ") + index_text(g) + " uses " + kind_name(groups_[g]) +
                    " but group " + index_text(0) + " uses " + kind_name(groups_[0]) +
                    "; every group must use the same kind of optimizer");
    if (const auto* c = std::get_if<CustomOptimizer>(&groups_[g]); c && !c->update)
      fail(bad, "CustomOptimizer '" + c->name + "' of group " + index_text(g) +
                    " has no update function");
  }
  if (error.empty()) {
    try {
      check_hyper_parameters();
    } catch (const Error& e) {
      fail(e.code(), e.message());
    }
  }
  std::set<std::string> names;
  struct Range {
    const std::byte* begin;
    const std::byte* end;
    std::size_t param;
    const char* what;
  };
  std::vector<Range> ranges;
  std::optional<MemoryLocation> first_where;
  std::string first_who;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    const std::string who = "parameter " + index_text(i) + " ('" + p.name + "')";
    if (p.name.empty()) fail(bad, who + " has an empty name; give every parameter a name");
    if (!names.insert(p.name).second)
      fail(bad, who + ": the name is used twice; names must be unique");
    if (p.dtype != DType::f32 && p.dtype != DType::bf16 && p.dtype != DType::f16)
      fail(ErrorCode::unsupported,
           who + " has dtype " + dtype_name(p.dtype) + "; parameters must be f32, bf16 or f16");
    if (p.dtype != dtype_)
      fail(ErrorCode::unsupported, who + " is " + dtype_name(p.dtype) + " but parameter " +
                                       index_text(0) + " is " + dtype_name(dtype_) +
                                       "; every parameter must have the same dtype");
    if (p.group < 0 || p.group >= static_cast<int>(groups_.size()))
      fail(bad, who + " is in group " + index_text(p.group) + " but there are " +
                    std::to_string(groups_.size()) + " group(s)");
    if (p.numel > 0 && p.data == nullptr)
      fail(bad, who + " has " + std::to_string(p.numel) + " elements but a null data pointer");
    if (!p.shape.empty()) {
      std::size_t product = 1;
      std::string dims;
      for (std::size_t d : p.shape) {
        product = d != 0 && product > SIZE_MAX / d ? SIZE_MAX : product * d;
        dims += (dims.empty() ? "" : ", ") + std::to_string(d);
      }
      if (product != p.numel)
        fail(bad, who + " has shape [" + dims + "] of " +
                      (product == SIZE_MAX ? std::string("too many") : std::to_string(product)) +
                      " elements but numel " + std::to_string(p.numel) +
                      "; give a shape whose product is numel, or none");
    }
    // Every buffer in the memory of the first one: the host, or one device.
    for (const auto& [what, ptr] : {std::pair{"data", p.data}, std::pair{"gradient", p.grad}}) {
      if (ptr == nullptr || p.numel == 0) continue;
      const MemoryLocation where = locate(ptr);
      if (!first_where) {
        first_where = where;
        first_who = who + "'s " + what + " buffer";
      }
      if (where.kind == MemoryKind::managed)
        fail(ErrorCode::wrong_device,
             who + ": its " + what + " buffer is in " + location_name(where) +
                 ", which the optimizer does not take (the device may be writing it while the "
                 "host reads it); allocate parameters and gradients with cudaMalloc, or in host "
                 "memory");
      else if (where.kind != first_where->kind || where.device != first_where->device)
        fail(ErrorCode::wrong_device,
             who + ": its " + what + " buffer is in " + location_name(where) + " but " + first_who +
                 " is in " + location_name(*first_where) +
                 "; every parameter and gradient of an optimizer must be in the same memory "
                 "(copy them to one device, or all to the host)");
    }
    const std::size_t bytes = p.numel * dtype_size(p.dtype);
    if (p.numel > 0 && p.data != nullptr) {
      const auto* b = static_cast<const std::byte*>(p.data);
      ranges.push_back({b, b + bytes, i, "parameter"});
    }
    if (p.numel > 0 && p.grad != nullptr) {
      const auto* b = static_cast<const std::byte*>(p.grad);
      ranges.push_back({b, b + bytes, i, "gradient"});
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (std::size_t k = 1; k < ranges.size(); ++k) {
    if (ranges[k].begin < ranges[k - 1].end) {
      const Range& a = ranges[k - 1];
      const Range& b = ranges[k];
      fail(bad, std::string("the ") + a.what + " buffer of parameter " + index_text(a.param) +
                    " ('" + params_[a.param].name + "') overlaps the " + b.what +
                    " buffer of parameter " + index_text(b.param) + " ('" + params_[b.param].name +
                    "'); every parameter and gradient needs its own memory");
      break;
    }
  }
  if (opt_.stream_grads && opt_.stage < 2)
    fail(bad, "ZeroOptions::stream_grads needs stage 2 or 3 (stage " + std::to_string(opt_.stage) +
                  " keeps whole gradients); set stage = 2 or leave stream_grads off");
  if (opt_.param_remainders) {
    if (dtype_ != DType::bf16)
      fail(ErrorCode::unsupported, std::string("ZeroOptions::param_remainders needs bf16 "
                                               "parameters, these are ") +
                                       dtype_name(dtype_) +
                                       " (an f16 value is not the high half of an fp32 one)");
    if (kind_ == kCustomKind)
      fail(ErrorCode::unsupported,
           "ZeroOptions::param_remainders is not supported with a CustomOptimizer; keep an fp32 "
           "master copy (param_remainders = false)");
  }
}

// The options and parameters as "key=value" lines: what every rank must
// agree on.
namespace {

std::string describe_options(const ZeroOptions& o, DType dtype, double bucket_mb,
                             int check_sync_every, const std::vector<OptimizerConfig>& groups) {
  std::ostringstream s;
  s << "stage=" << o.stage << "\n";
  s << "bucket_mb=" << num(bucket_mb) << "\n";
  s << "check_sync_every (or SHARDOPT_CHECK_SYNC)=" << check_sync_every << "\n";
  s << "non_finite=" << static_cast<int>(o.non_finite) << "\n";
  s << "reduction=" << (o.reduction == GradReduction::avg ? "avg" : "sum") << "\n";
  s << "predivide_factor=" << num(o.predivide_factor) << "\n";
  s << "reduce_in_fp32=" << o.reduce_in_fp32 << "\n";
  s << "param_remainders=" << o.param_remainders << "\n";
  s << "stream_grads=" << o.stream_grads << "\n";
  s << "gather_limit_bytes=" << o.gather_limit_bytes << "\n";
  s << "prefetch=" << o.prefetch << "\n";
  s << "reshard_after_forward=" << o.reshard_after_forward << "\n";
  s << "persist_below_bytes=" << o.persist_below_bytes << "\n";
  s << "parameter dtype=" << dtype_name(dtype) << "\n";
  if (o.loss_scaler) {
    const LossScaler& l = *o.loss_scaler;
    s << "loss_scaler=(" << num(l.init_scale) << ", " << num(l.growth_factor) << ", "
      << num(l.backoff_factor) << ", " << l.growth_interval << ", " << l.hysteresis << ", "
      << num(l.min_scale) << ")\n";
  } else {
    s << "loss_scaler=none\n";
  }
  s << "optimizer=" << (groups.empty() ? "none" : kind_name(groups[0])) << "\n";
  s << "parameter groups=" << groups.size() << "\n";
  for (std::size_t g = 0; g < groups.size(); ++g) s << describe_group(groups[g], int(g));
  return s.str();
}

std::string describe_param(const Param& p) {
  std::ostringstream s;
  s << "name=" << p.name << "\nnumel=" << p.numel << "\ndtype=" << dtype_name(p.dtype)
    << "\ngroup=" << index_text(p.group) << "\nshape=";
  for (std::size_t d : p.shape) s << d << ",";
  s << "\n";
  return s.str();
}

}  // namespace

// The memory of the first buffer (validate_locally checked that the others
// are in it), the same kind on every rank; on a device, the stream's device.
void ZeroEngine::agree_on_space() {
  MemoryLocation where{};
  for (const Param& p : params_) {
    const void* ptr = p.data != nullptr ? p.data : p.grad;
    if (p.numel > 0 && ptr != nullptr) {
      where = locate(ptr);
      break;
    }
  }
  std::string error;
  if (where.kind == MemoryKind::device && opt_.stream != nullptr &&
      Space::device_of(opt_.stream) != where.device)
    error = "ZeroOptions::stream belongs to device " +
            std::to_string(Space::device_of(opt_.stream)) + " but the parameters are in " +
            location_name(where) +
            "; pass a stream of the parameters' device (or none: its "
            "default stream)";
  agree_or_throw(ctl_, error, ErrorCode::wrong_device,
                 "fix the memory of the parameters on the rank(s) named");
  std::string custom;
  if (where.kind == MemoryKind::device && kind_ == kCustomKind)
    custom = "a CustomOptimizer's update is a host function, but the parameters are in " +
             location_name(where);
  agree_or_throw(ctl_, custom, ErrorCode::unsupported,
                 "use a built-in optimizer for device parameters, or keep them (and the custom "
                 "optimizer) in host memory");
  // Every rank in the same kind of memory: host on all, or a device on all.
  std::int32_t mine = where.kind == MemoryKind::device ? 1 : 0;
  std::vector<std::int32_t> all(static_cast<std::size_t>(nranks_));
  ctl_.allgather(&mine, all.data(), 1, DType::i32);
  std::vector<int> on_device, on_host;
  for (int r = 0; r < nranks_; ++r) (all[std::size_t(r)] ? on_device : on_host).push_back(r);
  if (!on_device.empty() && !on_host.empty())
    throw_error(ErrorCode::wrong_device,
                "the parameters are in device memory on " + ranks_list(on_device) +
                    " but in host memory on " + ranks_list(on_host),
                "every rank must put its parameters in the same kind of memory: one device per "
                "rank (a rank without a device cannot join ranks that have one), or the host on "
                "all",
                __FILE__, __LINE__);
  if (where.kind == MemoryKind::device) space_ = Space::device(where.device, opt_.stream, nranks_);
}

void ZeroEngine::agree_on_layout() {
  const double bucket_mb = opt_.bucket_mb > 0.0 ? opt_.bucket_mb : settings().bucket_mb;
  // Agreed like every option: a check that runs on some ranks only would
  // leave the others waiting.
  check_sync_every_ = opt_.check_sync_every > 0    ? opt_.check_sync_every
                      : opt_.check_sync_every == 0 ? settings().check_sync
                                                   : 0;
  const std::string options = describe_options(opt_, dtype_, bucket_mb, check_sync_every_, groups_);
  const char* hint =
      "every rank must register the same parameters (names, sizes, dtypes, groups) in the same "
      "order, with the same optimizer, hyper-parameters and options";
  // Options first, then the number of parameters, then each parameter.
  std::vector<std::int64_t> head = {fingerprint(options),
                                    static_cast<std::int64_t>(params_.size())};
  if (!all_equal(ctl_, head)) {
    if (!all_equal(ctl_, {head[0]})) {
      throw_agreed(
          ctl_, ErrorCode::layout_mismatch,
          "ranks passed different optimizer options: " + first_difference(ctl_, options, "option"),
          hint, __FILE__, __LINE__);
    }
  }
  const std::int64_t count = static_cast<std::int64_t>(params_.size());
  const std::int64_t fewest = min_over_ranks(ctl_, count);
  std::vector<std::int64_t> prints(static_cast<std::size_t>(fewest));
  for (std::size_t i = 0; i < prints.size(); ++i)
    prints[i] = fingerprint(describe_param(params_[i]));
  const std::int64_t differs = first_unequal(ctl_, prints);
  if (differs >= 0) {
    const std::size_t i = static_cast<std::size_t>(differs);
    const std::string name = allgather_strings(ctl_, params_[i].name)[0];
    throw_agreed(ctl_, ErrorCode::layout_mismatch,
                 "ranks registered different parameters: parameter " + index_text(i) + " ('" +
                     name +
                     "' on rank 0): " + first_difference(ctl_, describe_param(params_[i]), "the"),
                 hint, __FILE__, __LINE__);
  }
  if (min_over_ranks(ctl_, -count) != -fewest) {
    const std::string extra =
        count > fewest ? "'" + params_[static_cast<std::size_t>(fewest)].name + "'" : "";
    throw_agreed(
        ctl_, ErrorCode::layout_mismatch,
        "ranks registered different numbers of parameters: " +
            first_difference(ctl_, "number of parameters=" + std::to_string(count) + "\n", "the") +
            " (the first " + std::to_string(fewest) + " agree; the first extra one is parameter " +
            index_text(fewest) + ": " + gather_first_nonempty(ctl_, extra) + ")",
        hint, __FILE__, __LINE__);
  }
  reduce_type_ = (opt_.reduce_in_fp32 || dtype_ == DType::f32) ? DType::f32 : dtype_;
  bucket_elems_ = ShardLayout::bucket_elements(bucket_mb, dtype_size(reduce_type_), nranks_);
}

void ZeroEngine::build_layout() {
  elem_ = dtype_size(dtype_);
  master_ = dtype_ != DType::f32 && !opt_.param_remainders;
  remainders_ = opt_.param_remainders;
  std::vector<std::size_t> numel(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) numel[i] = params_[i].numel;
  std::vector<int> units(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) units[i] = params_[i].unit;
  layout_ = ShardLayout(numel, nranks_, rank_, opt_.stage, bucket_elems_,
                        unit_starts(units, units.size(), opt_.stage));
  unit_of_.assign(params_.size(), 0);
  for (std::size_t u = 0; u < layout_.units.size(); ++u)
    for (std::size_t i = layout_.units[u].first_param; i < layout_.units[u].end_param; ++i)
      unit_of_[i] = u;
}

void ZeroEngine::allocate() {
  // Stage 3: this rank's pieces of the parameters, from the registered
  // buffers; the gradients are reduced as at stage 2.
  reducer_opt_ = opt_;
  if (opt_.stage == 3) {
    reducer_opt_.stage = 2;
    param_shard_ = space_.allocate(layout_.shard * elem_, "the parameter shard");
    for (std::size_t si : layout_.mine) {
      const Segment& s = layout_.segments[si];
      space_.copy(param_shard_.as<std::byte>() + s.storage * elem_,
                  static_cast<const std::byte*>(params_[s.param].data) + s.offset * elem_,
                  s.count * elem_);
    }
    setup_units();
  }
  reducer_ = std::make_unique<GradReducer>(
      comm_, ctl_, space_, params_, layout_, reducer_opt_, dtype_, reduce_type_,
      [this](const char* what, std::size_t bucket, bool after_update) {
        watch(what, bucket, after_update);
      },
      kind_ != kind_of<Lamb>() && kind_ != kCustomKind, opt_.stage != 3);
  shard_ = std::make_unique<ShardState>(comm_, space_, params_, groups_, layout_, opt_.stage,
                                        dtype_, remainders_, param_shard_.as<std::byte>());
  if (opt_.loss_scaler) {
    scale_ = opt_.loss_scaler->init_scale;
    hysteresis_left_ = opt_.loss_scaler->hysteresis;
  }
  // Device updates of the element-wise optimizers are enqueued with a
  // verdict flag (zero unless a step raises it: update.cpp).
  if (space_.on_device() && kind_ != kind_of<Lamb>() && kind_ != kCustomKind) {
    verdict_.flag = space_.allocate(4, "the non-finite verdict");
    verdict_.host = space_.host_word("the non-finite verdict");
  }
}

}  // namespace shardopt::detail
