// shardopt: the ZeRO engine's step: the agreed checks, the global norm, the
// fused update of this rank's segments, the loss scaler, and inspection.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "comm/agree.hpp"
#include "common/check.hpp"
#include "common/language.hpp"
#include "common/log.hpp"
#include "common/mpi_lifetime.hpp"
#include "kernels/norm.hpp"
#include "shardopt/cast.hpp"
#include "zero/engine.hpp"

namespace shardopt::detail {

void ZeroEngine::check_hyper_parameters() const {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    try {
      if (groups_[g].index() != kind_)
        throw_error(
            ErrorCode::invalid_argument, "the optimizer kind was changed after construction",
            "change hyper-parameters only, never the kind of optimizer", __FILE__, __LINE__);
      std::visit(
          [&](const auto& o) {
            if constexpr (requires { o.key; }) {
              functional::check_options(o);
            } else if (!(o.lr >= 0.0)) {
              throw_error(ErrorCode::invalid_argument,
                          "CustomOptimizer '" + o.name +
                              "': invalid learning rate: " + std::to_string(o.lr),
                          "lr must be >= 0", __FILE__, __LINE__);
            }
          },
          groups_[g]);
    } catch (const Error& e) {
      throw_error(e.code(), "parameter group " + index_text(g) + ": " + e.message(), e.hint(),
                  __FILE__, __LINE__);
    }
  }
}

double ZeroEngine::grad_multiplier() const {
  const double f = opt_.predivide_factor;
  const double avg = opt_.reduction == GradReduction::avg ? f / nranks_ : f;
  return opt_.loss_scaler ? avg / scale_ : avg;
}

double ZeroEngine::local_sum_squares(int q) const {
  double sum = 0.0;
  for (const Segment& s : layout_.segments) {
    if (s.rank != q) continue;
    DType t;
    const void* g = reducer().reduced_grad(s, t);
    sum += space_.sum_squares(g, t, s.count);
  }
  return sum;
}

bool ZeroEngine::local_grads_finite(double mul) const {
  for (std::size_t si : layout_.mine) {
    const Segment& s = layout_.segments[si];
    DType t;
    const void* g = reducer().reduced_grad(s, t);
    // Rounded to float as the steps' scalars round it.
    if (!space_.all_finite(g, t, s.count, static_cast<float>(mul))) return false;
  }
  return true;
}

void ZeroEngine::ensure_reduced() {
  std::int64_t pending = reducer().open() ? 1 : 0;
  ctl_.allreduce(&pending, &pending, 1, DType::i64, ReduceOp::max);
  if (pending != 0) reducer().finish();
}

void ZeroEngine::reduce_gradients() {
  require_comm("reduce_gradients()");
  if (opt_.stage < 2 && reducer().reduced_once())
    throw_error(
        ErrorCode::invalid_state,
        "reduce_gradients() was called twice before step() in stage " + std::to_string(opt_.stage),
        "stages 0 and 1 reduce once per step, in place in the gradient buffers: "
        "accumulate micro-batches there (call nothing between them), or use stage 2, "
        "whose fp32 gradient shard accumulates reduced micro-batches",
        __FILE__, __LINE__);
  reducer().finish();
  if (opt_.stage >= 2) {
    // The micro-batch is in the shard: hand back zeroed buffers for the
    // next one, which step() (or the next call) reduces.
    reducer().materialize();
    reducer().zero_grad_buffers();
    reducer().reopen();
  }
}

double ZeroEngine::clip_grad_norm(double max_norm) {
  require_comm("clip_grad_norm()");
  if (!(max_norm > 0.0) || !std::isfinite(max_norm))
    throw_error(ErrorCode::invalid_argument,
                "clip_grad_norm: max_norm is " + std::to_string(max_norm),
                "pass a finite max_norm > 0", __FILE__, __LINE__);
  settle();  // the scale
  ensure_reduced();
  reducer().materialize();  // the norm reads the reduced gradients
  // Partial sums per rank, each over its segments in order, then over ranks
  // in order: the same additions in every stage.
  std::vector<double> partial(static_cast<std::size_t>(nranks_), 0.0);
  if (opt_.stage == 0) {
    for (int q = 0; q < nranks_; ++q) partial[std::size_t(q)] = local_sum_squares(q);
  } else {
    const double mine = local_sum_squares(rank_);
    ctl_.allgather(&mine, partial.data(), 1, DType::f64);
  }
  double total = 0.0;
  for (double p : partial) total += p;
  const double norm = std::sqrt(total) * std::abs(grad_multiplier());
  double coef = max_norm / (norm + 1e-6);
  if (!std::isfinite(coef) || coef > 1.0) coef = 1.0;
  clip_coef_ = coef;
  grad_norm_ = norm;
  return norm;
}

bool ZeroEngine::verdict_on_device(NonFinite policy) const noexcept {
  return verdict_.flag.size() > 0 && policy == NonFinite::skip;
}

void ZeroEngine::raise_verdict(double mul) {
  auto* flag = verdict_.flag.as<std::uint32_t>();
  space_.zero(flag, 4);
  for (std::size_t si : layout_.mine) {
    const Segment& s = layout_.segments[si];
    DType t;
    const void* g = reducer().reduced_grad(s, t);
    // Rounded to float as the steps' scalars round it.
    space_.flag_nonfinite(g, t, s.count, static_cast<float>(mul), flag);
  }
  // The ranks' flags agreed on the engine's stream (the largest: any rank's
  // non-finite gradient skips the step everywhere), then copied for the host.
  void* saved = comm_.stream();
  comm_.set_stream(space_.stream());
  try {
    comm_.iallreduce(flag, flag, 1, DType::i32, ReduceOp::max).wait();
  } catch (...) {
    comm_.set_stream(saved);
    throw;
  }
  comm_.set_stream(saved);
  verdict_.host.fetch(flag);
  verdict_.pending = true;
}

void ZeroEngine::settle() {
  if (!verdict_.pending) return;
  verdict_.pending = false;
  const bool finite = verdict_.host.wait() == 0;
  if (finite)
    ++steps_;
  else
    ++skipped_;
  if (opt_.loss_scaler) update_scaler(finite);
}

StepInfo ZeroEngine::step() {
  require_comm("step()");
  settle();  // the previous step's verdict, normally reached long ago
  StepInfo info;
  info.gathers = static_cast<std::int64_t>(trace_.size());
  info.gathers_ahead = gathers_ahead_;
  end_gathers("step()");
  const double t0 = MPI_Wtime();
  watch("step(): agreeing that every gradient was reduced");
  check_hyper_parameters();
  ensure_reduced();
  const double t1 = MPI_Wtime();
  double mul = grad_multiplier();
  info.loss_scale = opt_.loss_scaler ? scale_ : 1.0;
  info.grad_norm = grad_norm_;
  const NonFinite policy = non_finite_policy();
  // The check reads the reduced gradients before the update: a pending
  // fused reduction is made first (collective: the policy is agreed).
  if (policy != NonFinite::ignore) reducer().materialize();
  watch("step(): agreeing that the gradients are finite");
  // On a device (element-wise optimizers, NonFinite::skip) the verdict
  // stays there: the update reads it, the host counts it later (settle()).
  const bool deferred = verdict_on_device(policy);
  if (deferred) {
    raise_verdict(mul);
    info.pending = true;  // the rest of info: what the step does if applied
  } else if (policy != NonFinite::ignore) {
    std::int64_t finite = local_grads_finite(mul) ? 1 : 0;
    ctl_.allreduce(&finite, &finite, 1, DType::i64, ReduceOp::min);
    info.grads_finite = finite != 0;
  }
  if (!info.grads_finite && policy == NonFinite::error) {
    try {
      throw_non_finite(mul);
    } catch (...) {
      end_step();  // the optimizer goes on after zero_grad()
      throw;
    }
  }
  if (!info.grads_finite) {
    if (opt_.loss_scaler) update_scaler(false);
    ++skipped_;
    info.applied = false;
    info.step = steps_;
    info.reduce_seconds = t1 - t0;
    info.update_seconds = MPI_Wtime() - t1;
    fill_comm(info);
    end_step();
    log_window(info);
    return info;
  }
  mul *= clip_coef_;
  if (!deferred) ++steps_;
  info.step = deferred ? steps_ + 1 : steps_;
  // On a device the update is enqueued with the verdict's flag (never
  // raised when the host decided).
  // The update reads the other ranks' gradients when fused: a failed read
  // on one rank is agreed with the release, an error on every rank.
  std::string read_error;
  try {
    shard().update(reducer(), mul, info.step,
                   verdict_.flag.size() > 0 ? verdict_.flag.as<std::uint32_t>() : nullptr);
  } catch (const PeerReadError& e) {
    read_error = e.what();
  }
  reducer().release_fused(read_error);
  const double t2 = MPI_Wtime();
  if (opt_.stage == 1 || opt_.stage == 2) reducer().gather_params();
  if (opt_.stage == 3) refresh_persistent();
  const double t3 = MPI_Wtime();
  prefetch_next_step();  // issued, not waited for: not the step's time
  if (!deferred && opt_.loss_scaler) update_scaler(true);
  info.reduce_seconds = t1 - t0;
  info.update_seconds = t2 - t1;
  info.gather_seconds = t3 - t2;
  fill_comm(info);
  end_step();
  log_window(info);
  if (deferred && check_sync_every_ > 0) {  // the check needs the count: wait for the verdict
    settle();
    info.pending = false;
    info.applied = info.grads_finite = steps_ == info.step;
    info.step = steps_;
    if (!info.applied) return info;  // no check after a skipped step, as on the host
  }
  after_step();
  return info;
}

void ZeroEngine::after_step() {
  if (check_sync_every_ > 0 && steps_ % check_sync_every_ == 0) {
    const SyncReport r = check_sync();
    if (r.in_sync)
      SHARDOPT_LOG(info, "check_sync after step " << steps_ << ": the " << params_.size()
                                                  << " parameters are identical on every rank");
    if (!r.in_sync)
      throw_error(ErrorCode::desync,
                  "after step " + std::to_string(steps_) +
                      ", the parameters differ between ranks: " + r.message,
                  "every rank's parameters must stay identical: look for code that changes them "
                  "outside the optimizer on some ranks (a different initialization or seed, a "
                  "rank-dependent branch), then restart from the last checkpoint",
                  __FILE__, __LINE__);
  }
}

void ZeroEngine::fill_comm(StepInfo& info) const {
  const CommStats& c = reducer().stats();
  const double share = nranks_ > 1 ? double(nranks_ - 1) / nranks_ : 0.0;
  info.reduce_bytes = c.reduce_bytes;
  info.gather_bytes = c.gather_bytes;
  info.exposed_comm_seconds = c.waited;
  if (c.first_launch >= 0 && c.reduce_end >= c.first_launch)
    info.reduce_span_seconds = c.reduce_end - c.first_launch;
  if (info.reduce_span_seconds > 0)
    info.reduce_busbw_gbps = double(c.reduce_bytes) * share / info.reduce_span_seconds / 1e9;
  if (info.gather_seconds > 0)
    info.gather_busbw_gbps = double(c.gather_bytes) * share / info.gather_seconds / 1e9;
}

void ZeroEngine::log_window(const StepInfo& info) {
  const int every = settings().stats_every;
  if (every <= 0 || !log_enabled(LogLevel::info)) return;
  Window& w = window_;
  ++w.steps;
  w.reduce += info.reduce_seconds;
  w.update += info.update_seconds;
  w.gather += info.gather_seconds;
  w.exposed += info.exposed_comm_seconds;
  w.span += info.reduce_span_seconds;
  w.reduce_bytes += info.reduce_bytes;
  w.gather_bytes += info.gather_bytes;
  if (w.steps < every) return;
  const double n = w.steps, share = nranks_ > 1 ? double(nranks_ - 1) / nranks_ : 0.0;
  const auto gbps = [&](std::uint64_t bytes, double s) {
    return s > 0 ? double(bytes) * share / s / 1e9 : 0.0;
  };
  char line[512];
  std::snprintf(line, sizeof line,
                "step %lld: mean of the last %d steps (ms): reduce %.3f (span %.3f, %.2f MB, "
                "busbw %.2f GB/s), update %.3f, gather %.3f (%.2f MB, busbw %.2f GB/s), "
                "exposed communication %.3f",
                static_cast<long long>(steps_), w.steps, w.reduce / n * 1e3, w.span / n * 1e3,
                double(w.reduce_bytes) / n / 1e6, gbps(w.reduce_bytes, w.span), w.update / n * 1e3,
                w.gather / n * 1e3, double(w.gather_bytes) / n / 1e6,
                gbps(w.gather_bytes, w.gather), w.exposed / n * 1e3);
  SHARDOPT_LOG(info, line);
  w = Window{};
}

void ZeroEngine::end_step() {
  reducer().end_step();
  clip_coef_ = 1.0;
  grad_norm_ = -1.0;
}

void ZeroEngine::require_comm(const char* what) const {
  // Checked here, before any collective, so that the error names the
  // user's call rather than the first Communicator operation inside it.
  if (mpi_finalize_started()) [[unlikely]] {
    throw_error(ErrorCode::mpi_finalized,
                std::string("ZeroRedundancyOptimizer::") + what + " called after MPI_Finalize",
                "finish every optimizer call before MPI_Finalize, and destroy the optimizer "
                "before it (keep it in a scope that ends first, or declare a "
                "shardopt::Environment before it)",
                __FILE__, __LINE__);
  }
  if (!comm_.is_freed()) return;
  throw_error(ErrorCode::invalid_state,
              std::string(what) +
                  ": the communicator this optimizer was built on has been freed "
                  "(Communicator::free() or MPI_Comm_free on its MPI communicator)",
              "free the communicator only after the optimizer is destroyed, or build a new "
              "optimizer on a live communicator (save() and load() carry its state over)",
              __FILE__, __LINE__);
}

NonFinite ZeroEngine::non_finite_policy() const noexcept {
  if (opt_.non_finite != NonFinite::automatic) return opt_.non_finite;
  return opt_.loss_scaler ? NonFinite::skip : NonFinite::ignore;
}

void ZeroEngine::throw_non_finite(double mul) {
  // This rank's first (parameter, element) whose gradient times mul is not
  // finite, then the first over ranks, then what the value is there.
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  std::int64_t where[2] = {kNone, kNone};  // parameter, element
  int kind = 0;                            // 1 nan, 2 +inf, 3 -inf
  std::vector<float> g;
  std::vector<std::byte> raw;
  for (std::size_t si : layout_.mine) {
    const Segment& s = layout_.segments[si];
    if (static_cast<std::int64_t>(s.param) > where[0]) continue;
    DType t;
    const void* src = reducer().reduced_grad(s, t);
    raw.resize(s.count * dtype_size(t));
    space_.download(raw.data(), src, raw.size());
    g.resize(s.count);
    cast(raw.data(), t, g.data(), DType::f32, s.count);
    for (std::size_t j = 0; j < s.count; ++j) {
      const float v = static_cast<float>(g[j] * mul);
      if (std::isfinite(v)) continue;
      const std::int64_t p = static_cast<std::int64_t>(s.param);
      const std::int64_t e = static_cast<std::int64_t>(s.offset + j);
      if (p < where[0] || (p == where[0] && e < where[1])) {
        where[0] = p;
        where[1] = e;
        kind = std::isnan(v) ? 1 : v > 0 ? 2 : 3;
      }
      break;
    }
  }
  std::int64_t first[2] = {where[0], kNone};
  ctl_.allreduce(&first[0], &first[0], 1, DType::i64, ReduceOp::min);
  if (where[0] == first[0]) first[1] = where[1];
  ctl_.allreduce(&first[1], &first[1], 1, DType::i64, ReduceOp::min);
  std::int64_t what = where[0] == first[0] && where[1] == first[1] ? kind : 0;
  ctl_.allreduce(&what, &what, 1, DType::i64, ReduceOp::max);
  const char* value = what == 1 ? "nan" : what == 2 ? "inf" : "-inf";
  const std::size_t p = static_cast<std::size_t>(first[0]);
  std::ostringstream msg;
  msg << "step " << steps_ + 1 << ": the gradient of parameter '" << params_[p].name << "' (index "
      << index_text(p) << ") is " << value << " at element " << index_text(first[1])
      << " after the reduction over ranks (a rank's gradient held it, or the sum overflowed)";
  if (mul != 1.0) msg << " and the scaling by " << mul;
  msg << "; nothing was updated";
  throw_error(ErrorCode::non_finite, msg.str(),
              "look for the inf or NaN in the loss or the backward pass; lower the learning rate "
              "or clip gradients; for 16-bit training use a loss scaler; or set "
              "ZeroOptions::non_finite = NonFinite::skip to skip such steps. Call zero_grad() "
              "before the next step",
              __FILE__, __LINE__);
}

void ZeroEngine::update_scaler(bool finite) {
  const LossScaler& l = *opt_.loss_scaler;
  if (!finite) {
    good_steps_ = 0;
    if (--hysteresis_left_ <= 0) {
      scale_ = std::max(scale_ * l.backoff_factor, l.min_scale);
      hysteresis_left_ = 0;
    }
    return;
  }
  hysteresis_left_ = l.hysteresis;
  if (++good_steps_ >= l.growth_interval) {
    scale_ *= l.growth_factor;
    good_steps_ = 0;
  }
}

std::vector<std::string> ZeroEngine::state_names() const {
  std::vector<std::string> names = {"master"};
  names.insert(names.end(), shard().slots().begin(), shard().slots().end());
  return names;
}

std::vector<float> ZeroEngine::gather_state(std::string_view name, std::size_t i) const {
  const Param& p = param(i);
  int slot = -2;
  if (name == "master") slot = -1;
  const std::vector<std::string>& slots = shard().slots();
  for (std::size_t k = 0; k < slots.size(); ++k)
    if (slots[k] == name) slot = static_cast<int>(k);
  if (slot == -2) {
    std::string known;
    for (const auto& n : state_names()) known += (known.empty() ? "" : ", ") + n;
    throw_error(ErrorCode::invalid_argument,
                "gather_state: no state named '" + std::string(name) + "'", "use one of: " + known,
                __FILE__, __LINE__);
  }
  // Each element is owned by one rank; the others contribute -1 to a
  // maximum over the bit patterns, which keeps -0 and every nan as it is.
  std::vector<std::int64_t> bits(p.numel, -1);
  for (std::size_t si : layout_.mine) {
    const Segment& s = layout_.segments[si];
    if (s.param != i) continue;
    std::vector<float> v(s.count);
    if (slot >= 0)
      shard().read_state(std::size_t(slot), s, v.data());
    else
      shard().read_master(s, v.data());
    for (std::size_t k = 0; k < s.count; ++k) {
      std::uint32_t u;
      std::memcpy(&u, &v[k], 4);
      bits[s.offset + k] = static_cast<std::int64_t>(u);
    }
  }
  if (opt_.stage > 0 && p.numel > 0)
    const_cast<Communicator&>(ctl_).allreduce(bits.data(), bits.data(), bits.size(), DType::i64,
                                              ReduceOp::max);
  std::vector<float> out(p.numel);
  for (std::size_t k = 0; k < p.numel; ++k) {
    const std::uint32_t u = static_cast<std::uint32_t>(bits[k]);
    std::memcpy(&out[k], &u, 4);
  }
  return out;
}

MemoryReport ZeroEngine::memory_report() const {
  MemoryReport m;
  shard().add_memory(m);
  reducer().add_memory(m);
  m.param_shard = param_shard_.size();
  m.gather_pool = pool_buf_.size();
  for (const Unit& u : units_) (u.persistent ? m.persistent_params : m.gather_pool) += u.own.size();
  for (const Param& p : params_) {
    // Stage 3 reads the registered parameter buffers at construction only.
    if (opt_.stage != 3) m.user_params += p.numel * elem_;
    if (p.grad != nullptr) m.user_grads += p.numel * elem_;
  }
  // Every buffer of the engine is in its space.
  (space_.on_device() ? m.device_bytes : m.host_bytes) = m.allocated();
  return m;
}

OptimizerConfig& ZeroEngine::param_group(int g) {
  if (g < 0 || g >= num_groups())
    throw_error(ErrorCode::invalid_argument,
                "parameter group " + index_text(g) + " does not exist (" +
                    std::to_string(num_groups()) + " groups)",
                "pass a group index below num_groups()", __FILE__, __LINE__);
  return groups_[std::size_t(g)];
}

void ZeroEngine::set_lr(double lr, int group) {
  for (int g = 0; g < num_groups(); ++g) {
    if (group >= 0 && g != group) continue;
    std::visit([&](auto& o) { o.lr = lr; }, param_group(g));
  }
  if (group >= num_groups()) param_group(group);  // throws
}

}  // namespace shardopt::detail
