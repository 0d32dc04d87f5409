// shardopt kernels: NAdam (Dozat 2016, "Incorporating Nesterov Momentum
// into Adam"), one fused pass over a contiguous range.
//
// nadam_element() is the single definition of the per-element math, called
// by the reference, CPU and CUDA kernels. It follows torch.optim.NAdam's
// single-tensor step operation by operation in float32, as Adam does
// (kernels/adam.hpp: the moments as torch 1.13 updates them, explicit fused
// multiply-adds where torch's CPU kernels use them), with the momentum
// products of torch 2: mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)),
// their running product kept in float32 as torch's state["mu_product"], and
// the next step's product mu_product * mu_{t+1} (torch 1.13 multiplied in
// mu_t twice there, which torch 2.0 fixed).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/adam.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/element.hpp"
#include "kernels/optimizer.hpp"
#include "shardopt/optimizers.hpp"

namespace shardopt::kernels {

// The scalars of one step: computed in double, rounded to float as torch
// rounds a Python float meeting a float32 tensor.
struct NAdamScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias_correction2;  // 1 - beta2^step
  float eps;
  float grad_coef;  // -lr * (1 - mu_t) / (1 - mu_product)
  float avg_coef;   // -lr * mu_{t+1} / (1 - mu_product * mu_{t+1})
  float weight_decay;
  float decay;      // 1 - lr * weight_decay, for decoupled weight decay
  float grad_sign;  // -1 when maximizing, else 1
  float grad_mul;   // applied to the gradient first: 1 / loss_scale * clip_coef
  WeightDecay wd_mode;
};

// mu_t, in double as torch computes it.
inline double nadam_mu(double beta1, double momentum_decay, std::int64_t t) {
  return beta1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(t) * momentum_decay));
}

// The float32 product mu_1 * ... * mu_step, each factor rounded to float and
// each product rounded, as torch's mu_product tensor accumulates it. A
// per-thread cache continues from the last step asked, so a run's steps cost
// O(1) each.
inline float nadam_mu_product(double beta1, double momentum_decay, std::int64_t step) {
  struct Cache {
    double beta1 = -1.0, momentum_decay = -1.0;
    std::int64_t step = 0;
    float product = 1.0f;
  };
  thread_local Cache c;
  if (c.beta1 != beta1 || c.momentum_decay != momentum_decay || c.step > step)
    c = Cache{beta1, momentum_decay, 0, 1.0f};
  while (c.step < step) {
    ++c.step;
    c.product = c.product * static_cast<float>(nadam_mu(beta1, momentum_decay, c.step));
  }
  return c.product;
}

inline NAdamScalars make_nadam_scalars(const NAdam& o, std::int64_t step, double grad_mul) {
  NAdamScalars s{};
  const double beta1 = o.betas.first, beta2 = o.betas.second, lr = o.lr;
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.bias_correction2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(step)));
  s.eps = static_cast<float>(o.eps);
  const double mu = nadam_mu(beta1, o.momentum_decay, step);
  const double mu_next = nadam_mu(beta1, o.momentum_decay, step + 1);
  const double product = nadam_mu_product(beta1, o.momentum_decay, step);
  s.grad_coef = static_cast<float>(-lr * (1.0 - mu) / (1.0 - product));
  s.avg_coef = static_cast<float>((-lr * mu_next) / (1.0 - product * mu_next));
  s.weight_decay = static_cast<float>(o.weight_decay);
  s.decay = static_cast<float>(1.0 - lr * o.weight_decay);
  s.grad_sign = o.maximize ? -1.0f : 1.0f;
  s.grad_mul = static_cast<float>(grad_mul);
  s.wd_mode = o.weight_decay == 0.0      ? WeightDecay::none
              : o.decoupled_weight_decay ? WeightDecay::decoupled
                                         : WeightDecay::l2;
  return s;
}

// One element: p, m and v updated in place; g is the gradient as stored,
// converted to float. Returns whether the gradient (after grad_mul) is finite.
template <WeightDecay W>
SHARDOPT_HOST_DEVICE inline bool nadam_element(float& p, float g, float& m, float& v,
                                               const NAdamScalars& s) {
  g = g * s.grad_mul;
  const bool finite = is_finite_bits(g);
  g = g * s.grad_sign;
  if constexpr (W == WeightDecay::decoupled) p = p * s.decay;          // param.mul_(1 - lr*wd)
  if constexpr (W == WeightDecay::l2) g = fmaf(s.weight_decay, p, g);  // grad.add(param, alpha=wd)
  m = fmaf(s.one_minus_beta1, g, m * s.beta1);                         // mul_(b1).add_(g, 1-b1)
  v = fmaf(s.one_minus_beta2 * g, g, v * s.beta2);            // mul_(b2).addcmul_(g, g, 1-b2)
  const float denom = sqrtf(v / s.bias_correction2) + s.eps;  // div(bc2).sqrt().add_(eps)
  p = p + (s.grad_coef * g) / denom;                          // addcdiv_(grad, denom, coef)
  p = p + (s.avg_coef * m) / denom;                           // addcdiv_(exp_avg, denom, coef)
  return finite;
}

// The buffers of one NAdam step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   exp_avg:     first moment, read and written
//   exp_avg_sq:  second moment, read and written
struct NAdamBuffers : StepBuffers {
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;

  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    each_step_buffer(f, [&] {
      f(exp_avg, 4, Access::read_write);
      f(exp_avg_sq, 4, Access::read_write);
    });
  }
};

}  // namespace shardopt::kernels

namespace shardopt::kernels::detail {

template <class G, class P, WeightDecay W>
struct NAdamLoop {
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = NAdamLoop<G2, P2, W>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const NAdamBuffers& b, const NAdamScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict m = b.exp_avg;
    float* __restrict v = b.exp_avg_sq;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = nadam_element<W>(pi, load_grad(g, i), m[i], v[i], s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const NAdamBuffers& b, const NAdamScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i), m = b.exp_avg[i], v = b.exp_avg_sq[i];
    const bool finite = nadam_element<W>(p, load_grad(static_cast<const G*>(b.grad), i), m, v, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    return finite;
  }
};

}  // namespace shardopt::kernels::detail

namespace shardopt::kernels {

template <>
struct Kernel<NAdam> {
  using Family = NAdam;
  using Buffers = NAdamBuffers;
  using Scalars = NAdamScalars;
  static Scalars scalars(const NAdam& o, std::int64_t step, double grad_mul) {
    return make_nadam_scalars(o, step, grad_mul);
  }
  static void set_states(Buffers& b, float* const* states) {
    b.exp_avg = states[0];
    b.exp_avg_sq = states[1];
  }
  template <class F>
  static bool dispatch(const Buffers& b, const Scalars& s, F&& f) {
    return detail::dispatch_types(
        b.grad_type, b.param_out, b.param_out_type, b.remainder, [&]<class G, class P>() {
          switch (s.wd_mode) {
            case WeightDecay::l2:
              return f.template operator()<detail::NAdamLoop<G, P, WeightDecay::l2>>();
            case WeightDecay::decoupled:
              return f.template operator()<detail::NAdamLoop<G, P, WeightDecay::decoupled>>();
            default:
              return f.template operator()<detail::NAdamLoop<G, P, WeightDecay::none>>();
          }
        });
  }
};

}  // namespace shardopt::kernels
