// shardopt: the ZeRO engine's update part (lib/zero/shard_state.hpp): this
// rank's optimizer state and the fused update of its segments.
#include "zero/shard_state.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <vector>

#include "kernels/cast.hpp"
#include "kernels/lamb.hpp"
#include "optim/trusted_step.hpp"
#include "shardopt/optim.hpp"
#include "zero/buffers.hpp"
#include "zero/convert.hpp"

namespace shardopt::detail {

ShardState::ShardState(Communicator& comm, const Space& space, const std::vector<Param>& params,
                       const std::vector<OptimizerConfig>& groups, const ShardLayout& layout,
                       int stage, DType dtype, bool remainders, std::byte* param_shard)
    : comm_(comm),
      space_(space),
      params_(params),
      groups_(groups),
      layout_(layout),
      stage_(stage),
      dtype_(dtype),
      elem_(dtype_size(dtype)),
      master_(dtype != DType::f32 && !remainders),
      remainders_(remainders),
      kind_(groups.empty() ? 0 : groups[0].index()),
      rank_(comm.rank()),
      nranks_(comm.size()),
      param_shard_(param_shard) {
  slots_ = state_slots(groups_);
  // The sizes of lib/zero/buffers.hpp, which plan_memory() adds up.
  master_buf_ =
      space_.allocate(master_bytes(layout_, dtype_, remainders_),
                      remainders_ ? "the parameter remainders" : "the fp32 master parameters");
  for (std::size_t k = 0; k < slots_.size(); ++k)
    states_.push_back(space_.allocate(state_bytes(layout_), "the optimizer state"));
  if (kind_ == kind_of<Lamb>())
    lamb_update_ = space_.allocate(state_bytes(layout_), "LAMB's update direction");
  if (kind_ == kCustomKind)
    custom_scratch_ =
        space_.allocate(custom_scratch_bytes(layout_), "the custom optimizer's gradients");
  init();
}

void ShardState::init() {
  // Each group's (state index, initial value) for the states it starts off 0.
  std::vector<std::vector<std::pair<std::size_t, float>>> initial(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (const Slot& slot : slots_of(groups_[g]))
      for (std::size_t k = 0; k < slots_.size(); ++k)
        if (slot.used && slot.initial != 0.0 && slots_[k] == slot.name)
          initial[g].emplace_back(k, static_cast<float>(slot.initial));
  for (std::size_t si : layout_.mine) {
    const Segment& s = layout_.segments[si];
    if (master_)
      space_.convert(user_param(s), dtype_, master_buf_.as<float>() + s.storage, DType::f32,
                     s.count, 1.0f);
    // States that do not start at 0 (Adagrad's sum).
    for (const auto& [state, value] : initial[std::size_t(params_[s.param].group)])
      space_.fill(states_[state].as<float>() + s.storage, s.count, value);
  }
}

std::byte* ShardState::user_param(const Segment& s) const {
  if (param_shard_ != nullptr) return param_shard_ + s.storage * elem_;
  return static_cast<std::byte*>(params_[s.param].data) + s.offset * elem_;
}

void ShardState::read_master(const Segment& s, float* out) const {
  if (master_) {
    space_.download(out, master_buf_.as<float>() + s.storage, s.count * 4);
  } else if (remainders_) {
    std::vector<bfloat16> p(s.count);
    std::vector<std::uint16_t> r(s.count);
    space_.download(p.data(), user_param(s), s.count * 2);
    space_.download(r.data(), master_buf_.as<std::uint16_t>() + s.storage, s.count * 2);
    functional::decode_param_remainders({p.data(), s.count}, {r.data(), s.count}, {out, s.count});
  } else {
    space_.download(out, user_param(s), s.count * 4);
  }
}

void ShardState::read_state(std::size_t k, const Segment& s, float* out) const {
  space_.download(out, states_[k].as<float>() + s.storage, s.count * 4);
}

void ShardState::update(const GradReducer& grads, double mul, std::int64_t step,
                        const std::uint32_t* noop) {
  grads_ = &grads;
  step_ = step;
  if (noop != nullptr && (!space_.on_device() || kind_ == kind_of<Lamb>() || kind_ == kCustomKind))
    throw_error(ErrorCode::internal, "a device verdict for an update that decides on the host",
                "report this as a shardopt bug", __FILE__, __LINE__);
  if (kind_ == kind_of<Lamb>())
    update_lamb(mul);
  else if (kind_ == kCustomKind)
    update_custom(mul);
  // The one fork of the element-wise update: on a device a launch costs
  // more than the data, so each group's runs go as one list step (the
  // multi-tensor kernel, gated by the device's verdict); on the host the
  // runs go block by block through the CPU kernel, which lets a pending
  // fused reduction feed each block from cache.
  else if (space_.on_device())
    update_elementwise_device(mul, noop);
  else
    update_elementwise(mul);
}

void ShardState::load(std::vector<HostBuffer>& staging,
                      const std::vector<std::vector<char>>& loaded) {
  const auto whole = [&](std::size_t k) {
    return std::all_of(loaded[k].begin(), loaded[k].end(), [](char c) { return c != 0; });
  };
  // On the host a slot loaded whole becomes the state buffer itself.
  if (!space_.on_device()) {
    if (master_ && whole(0)) master_buf_ = SpaceBuffer(std::move(staging[0]));
    for (std::size_t k = 1; k <= slots_.size(); ++k)
      if (whole(k)) states_[k - 1] = SpaceBuffer(std::move(staging[k]));
  }
  std::vector<bfloat16> params;
  std::vector<std::uint16_t> rems;
  for (std::size_t si : layout_.mine) {
    const Segment& s = layout_.segments[si];
    if (loaded[0][s.param]) {
      // Null when the buffer became the master itself (no offset from null).
      const float* values =
          staging[0].data() != nullptr ? staging[0].as<float>() + s.storage : nullptr;
      if (master_) {
        float* m = master_buf_.as<float>() + s.storage;
        if (staging[0].data() != nullptr) space_.upload(m, values, s.count * 4);
        space_.convert(m, DType::f32, user_param(s), dtype_, s.count, 1.0f);
      } else if (remainders_) {
        params.resize(s.count);
        rems.resize(s.count);
        functional::encode_param_remainders({values, s.count}, {params.data(), s.count},
                                            {rems.data(), s.count});
        space_.upload(user_param(s), params.data(), s.count * 2);
        space_.upload(master_buf_.as<std::uint16_t>() + s.storage, rems.data(), s.count * 2);
      } else {
        space_.upload(user_param(s), values, s.count * 4);
      }
    }
    for (std::size_t k = 1; k <= slots_.size(); ++k)
      if (loaded[k][s.param] && staging[k].data() != nullptr)
        space_.upload(states_[k - 1].as<float>() + s.storage, staging[k].as<float>() + s.storage,
                      s.count * 4);
  }
  space_.synchronize();
}

void ShardState::add_memory(MemoryReport& m) const {
  m.master_params = master_buf_.size();
  for (const SpaceBuffer& s : states_) m.optimizer_state += s.size();
  m.optimizer_state += lamb_update_.size();
  m.buckets += custom_scratch_.size();
}

ShardState::Run ShardState::run_of(const Segment& s) {
  Run r;
  r.group = params_[s.param].group;
  r.storage = s.storage;
  r.count = s.count;
  r.param = master_ ? master_buf_.as<std::byte>() + s.storage * 4 : user_param(s);
  // A pending fused reduction: the update reduces block by block (no
  // gradient buffer to point at).
  if (!grads_->fused_pending())
    r.grad = static_cast<const std::byte*>(grads_->reduced_grad(s, r.grad_type));
  r.out = master_ ? user_param(s) : nullptr;
  return r;
}

// Consecutive segments of one group whose buffers all continue each other
// run as one call.
void ShardState::for_each_run(const std::function<void(const Run&)>& f) {
  const std::size_t psize = master_ ? 4 : elem_;
  Run cur;
  bool open = false;
  for (std::size_t si : layout_.mine) {
    const Run r = run_of(layout_.segments[si]);
    if (open && r.group == cur.group && r.storage == cur.storage + cur.count &&
        r.param == cur.param + cur.count * psize &&
        (cur.grad == nullptr ? r.grad == nullptr
                             : r.grad == cur.grad + cur.count * dtype_size(cur.grad_type)) &&
        r.grad_type == cur.grad_type && (r.out == nullptr) == (cur.out == nullptr) &&
        (r.out == nullptr || r.out == cur.out + cur.count * elem_)) {
      cur.count += r.count;
      continue;
    }
    if (open) f(cur);
    cur = r;
    open = true;
  }
  if (open) f(cur);
}

// Elements [off, off + n) of run r, their gradients at grad (of type gt).
void ShardState::step_range(const Run& r, std::size_t off, std::size_t n, const void* grad,
                            DType gt, double mul, std::vector<std::span<float>>& states) {
  using namespace functional;
  const ParamView pv =
      remainders_ ? ParamView(std::span<bfloat16>(reinterpret_cast<bfloat16*>(r.param) + off, n),
                              std::span<std::uint16_t>(
                                  master_buf_.as<std::uint16_t>() + r.storage + off, n))
                  : ParamView(reinterpret_cast<float*>(r.param) + off, n);
  const GradView gv(grad, n, gt);
  StepOptions so;
  so.grad_mul = mul;
  so.param_out = r.out != nullptr ? r.out + off * elem_ : nullptr;
  so.param_out_dtype = dtype_;
  std::visit(
      [&](const auto& o) {
        if constexpr (is_elementwise<std::remove_cvref_t<decltype(o)>>) {
          // This group's slots, in order, from the engine's state buffers
          // (allocated for the slots any group uses).
          states.clear();
          o.slots([&](const Slot& slot) {
            std::span<float> span;
            for (std::size_t k = 0; slot.used && k < slots_.size(); ++k)
              if (slots_[k] == slot.name) span = {states_[k].as<float>() + r.storage + off, n};
            states.push_back(span);
          });
          // Checked once: the options at construction and set_lr, the
          // buffers are the engine's own, sized by its layout.
          trusted_host_step(pv, gv, states, step_, o, so);
        }
      },
      groups_[std::size_t(r.group)]);
}

void ShardState::update_elementwise(double mul) {
  std::vector<std::span<float>> states;
  if (!grads_->fused_pending()) {
    for_each_run(
        [&](const Run& r) { step_range(r, 0, r.count, r.grad, r.grad_type, mul, states); });
    return;
  }
  // The fused step: each thread reduces a block of the run's gradients
  // from every rank's shared buffers into its own block, which stays in
  // its cache, and updates it; blocks in order, each thread a contiguous
  // share of them. Element-wise, so the split changes no result.
  const std::size_t B = GradReducer::block_elements();
  const int threads = std::max(1, std::min(grads_->block_threads(), omp_get_max_threads()));
  for_each_run([&](const Run& r) {
    const long blocks = static_cast<long>((r.count + B - 1) / B);
    std::exception_ptr error;
#pragma omp parallel num_threads(threads) if (blocks > 1)
    {
      std::vector<std::span<float>> mine;
      const int t = omp_get_thread_num();
#pragma omp for schedule(static)
      for (long k = 0; k < blocks; ++k) {
        try {
          const std::size_t off = std::size_t(k) * B, n = std::min(B, r.count - off);
          const float* g = grads_->reduced_block(r.storage + off);
          if (g == nullptr) {
            grads_->reduce_block(r.storage + off, n, grads_->block(t), t);
            g = grads_->block(t);
          }
          step_range(r, off, n, g, DType::f32, mul, mine);
        } catch (...) {
#pragma omp critical(shardopt_fused_update)
          if (!error) error = std::current_exception();
        }
      }
    }
    if (error) std::rethrow_exception(error);
  });
}

// On a device: each group's runs as one list step (the multi-tensor kernel,
// one launch per group of tensors of the same types), on the engine's
// stream.
void ShardState::update_elementwise_device(double mul, const std::uint32_t* noop) {
  using namespace functional;
  std::vector<std::vector<Run>> by_group(groups_.size());
  for_each_run([&](const Run& r) { by_group[std::size_t(r.group)].push_back(r); });
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<Run>& runs = by_group[g];
    if (runs.empty()) continue;
    std::vector<ParamView> pv;
    std::vector<GradView> gv;
    std::vector<void*> outs;
    for (const Run& r : runs) {
      pv.push_back(
          remainders_
              ? ParamView(
                    std::span<bfloat16>(reinterpret_cast<bfloat16*>(r.param), r.count),
                    std::span<std::uint16_t>(master_buf_.as<std::uint16_t>() + r.storage, r.count))
              : ParamView(reinterpret_cast<float*>(r.param), r.count));
      gv.emplace_back(r.grad, r.count, r.grad_type);
      outs.push_back(r.out);
    }
    StepOptions so;
    so.grad_mul = mul;
    so.param_out_dtype = dtype_;
    so.stream = space_.stream();
    so.noop_flag = noop;
    std::visit(
        [&](const auto& o) {
          if constexpr (is_elementwise<std::remove_cvref_t<decltype(o)>>) {
            // states[slot][run], empty lists for the slots this group does not use.
            std::vector<std::vector<std::span<float>>> per_slot;
            o.slots([&](const Slot& slot) {
              std::vector<std::span<float>> list;
              for (std::size_t k = 0; slot.used && k < slots_.size(); ++k)
                if (slots_[k] == slot.name)
                  for (const Run& r : runs)
                    list.emplace_back(states_[k].as<float>() + r.storage, r.count);
              per_slot.push_back(std::move(list));
            });
            std::vector<std::span<const std::span<float>>> states(per_slot.begin(), per_slot.end());
            functional::step(std::span<const ParamView>(pv), std::span<const GradView>(gv),
                             std::span<const std::span<const std::span<float>>>(states), step_, o,
                             so, master_ ? std::span<void* const>(outs) : std::span<void* const>());
          }
        },
        groups_[g]);
  }
}

void ShardState::update_lamb(double mul) {
  const std::size_t np = params_.size();
  // partial[(q * np + p) * 2 + {0, 1}]: rank q's sums of squares of
  // parameter p's values and update direction, over its segments in order.
  std::vector<double> partial(std::size_t(nranks_) * np * 2, 0.0);
  const auto direction = [&](const Segment& s) {
    const Lamb& o = std::get<Lamb>(groups_[std::size_t(params_[s.param].group)]);
    kernels::LambBuffers b;
    if (remainders_) {
      b.param_bf16 = reinterpret_cast<const bfloat16*>(user_param(s));
      b.remainder = master_buf_.as<std::uint16_t>() + s.storage;
    } else {
      b.param = master_ ? master_buf_.as<float>() + s.storage
                        : reinterpret_cast<const float*>(user_param(s));
    }
    b.grad = grads_->reduced_grad(s, b.grad_type);
    b.exp_avg = states_[0].as<float>() + s.storage;
    b.exp_avg_sq = states_[1].as<float>() + s.storage;
    b.update = lamb_update_.as<float>() + s.storage;
    b.n = s.count;
    const kernels::LambScalars sc = kernels::make_lamb_scalars(
        o.betas.first, o.betas.second, o.eps, o.weight_decay, o.maximize, step_, mul);
    const kernels::LambNorms n = space_.lamb_direction(b, sc);
    double* d = &partial[(std::size_t(s.rank) * np + s.param) * 2];
    d[0] += n.param_sq;
    d[1] += n.update_sq;
  };
  for (std::size_t si : layout_.mine) direction(layout_.segments[si]);
  if (stage_ > 0) {
    std::vector<double> mine(partial.begin() + std::ptrdiff_t(std::size_t(rank_) * np * 2),
                             partial.begin() + std::ptrdiff_t(std::size_t(rank_ + 1) * np * 2));
    comm_.allgather(mine.data(), partial.data(), np * 2, DType::f64);
  }
  std::vector<float> neg_step(np);
  for (std::size_t p = 0; p < np; ++p) {
    double ps = 0.0, us = 0.0;
    for (int q = 0; q < nranks_; ++q) {
      ps += partial[(std::size_t(q) * np + p) * 2];
      us += partial[(std::size_t(q) * np + p) * 2 + 1];
    }
    const double trust = ps > 0.0 && us > 0.0 ? std::sqrt(ps) / std::sqrt(us) : 1.0;
    const Lamb& o = std::get<Lamb>(groups_[std::size_t(params_[p].group)]);
    neg_step[p] = static_cast<float>(-(o.lr * trust));
  }
  for (std::size_t si : layout_.mine) {
    const Segment& s = layout_.segments[si];
    kernels::LambApplyBuffers a;
    if (remainders_) {
      a.param_out = user_param(s);
      a.param_out_type = DType::bf16;
      a.remainder = master_buf_.as<std::uint16_t>() + s.storage;
    } else if (master_) {
      a.param = master_buf_.as<float>() + s.storage;
      a.param_out = user_param(s);
      a.param_out_type = dtype_;
    } else {
      a.param = reinterpret_cast<float*>(user_param(s));
    }
    a.update = lamb_update_.as<float>() + s.storage;
    a.n = s.count;
    space_.lamb_apply(a, neg_step[s.param]);
  }
}

void ShardState::update_custom(double mul) {
  std::vector<std::span<float>> states(slots_.size());
  for_each_run([&](const Run& r) {
    const CustomOptimizer& o = std::get<CustomOptimizer>(groups_[std::size_t(r.group)]);
    float* g = custom_scratch_.as<float>();
    // Runs merge segments, so one may be longer than the scratch: go in
    // pieces of the longest segment.
    const std::size_t chunk = custom_scratch_.size() / 4;
    for (std::size_t k = 0; k < r.count; k += chunk) {
      const std::size_t m = std::min(chunk, r.count - k);
      convert(r.grad + k * dtype_size(r.grad_type), r.grad_type, reinterpret_cast<std::byte*>(g),
              DType::f32, m, static_cast<float>(mul));
      for (std::size_t q = 0; q < slots_.size(); ++q)
        states[q] = {states_[q].as<float>() + r.storage + k, m};
      float* params = reinterpret_cast<float*>(r.param) + k;
      CustomStep cs;
      cs.params = {params, m};
      cs.grads = {g, m};
      cs.states = states;
      cs.step = step_;
      cs.group = r.group;
      o.update(cs, o.lr);
      if (r.out != nullptr) kernels::cpu::cast(params, DType::f32, r.out + k * elem_, dtype_, m);
    }
  });
}

}  // namespace shardopt::detail
