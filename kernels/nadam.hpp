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
#include "kernels/element_loop.hpp"
#include "kernels/optimizer.hpp"
#include "shardopt/optimizers.hpp"

namespace shardopt::kernels {

// The scalars of one step: the moments' (kernels/moments.hpp) and
struct NAdamScalars : MomentScalars {
  float bias_correction2;  // 1 - beta2^step
  float grad_coef;         // -lr * (1 - mu_t) / (1 - mu_product)
  float avg_coef;          // -lr * mu_{t+1} / (1 - mu_product * mu_{t+1})
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
  static_cast<MomentScalars&>(s) = make_moment_scalars(
      o.lr, o.betas, o.eps, o.weight_decay, o.decoupled_weight_decay, o.maximize, grad_mul);
  const double beta1 = o.betas.first, beta2 = o.betas.second, lr = o.lr;
  s.bias_correction2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(step)));
  const double mu = nadam_mu(beta1, o.momentum_decay, step);
  const double mu_next = nadam_mu(beta1, o.momentum_decay, step + 1);
  const double product = nadam_mu_product(beta1, o.momentum_decay, step);
  s.grad_coef = static_cast<float>(-lr * (1.0 - mu) / (1.0 - product));
  s.avg_coef = static_cast<float>((-lr * mu_next) / (1.0 - product * mu_next));
  return s;
}

// One element: p, m and v updated in place; g is the gradient as stored,
// converted to float. Returns whether the gradient (after grad_mul) is finite.
template <WeightDecay W, class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto nadam_element(F& p, F g, F& m, F& v,
                                                              const NAdamScalars& s) {
  const auto finite = update_moments<W>(p, g, m, v, s);
  const F denom = sqrt_op(v / s.bias_correction2) + s.eps;  // div(bc2).sqrt().add_(eps)
  p = p + (s.grad_coef * g) / denom;                        // addcdiv_(grad, denom, coef)
  p = p + (s.avg_coef * m) / denom;                         // addcdiv_(exp_avg, denom, coef)
  return finite;
}

// The buffers of one NAdam step over n elements: the moments' (kernels/moments.hpp).
using NAdamBuffers = MomentBuffers;

// One element of a NAdam step of the given weight decay (kernels/element_loop.hpp).
template <WeightDecay W>
struct NAdamStep : StepTypes<NAdamBuffers, NAdamScalars> {
  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE static auto apply(F& p, F g, const Buffers& b,
                                                               std::size_t i, const Scalars& s) {
    return nadam_element<W>(p, g, lane<F>(b.exp_avg, i), lane<F>(b.exp_avg_sq, i), s);
  }
};

template <>
struct Kernel<NAdam> : ElementKernel<NAdam, NAdamBuffers, NAdamScalars> {
  static Scalars scalars(const NAdam& o, std::int64_t step, double grad_mul) {
    return make_nadam_scalars(o, step, grad_mul);
  }
  template <class F>
  static bool modes(const Scalars& s, F&& f) {
    return with_weight_decay(
        s.wd_mode, [&]<WeightDecay W>() { return f.template operator()<NAdamStep<W>>(); });
  }
};

}  // namespace shardopt::kernels
