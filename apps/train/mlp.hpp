// shardopt apps: the model and data of shardopt-train. A multi-layer
// perceptron (tanh hidden layers, a linear output layer) whose matmuls run
// through OpenBLAS's cblas_sgemm, its forward and backward passes in fp32
// over buffers the caller owns, and the deterministic random numbers of the
// teacher, the initial weights and the data.
//
// Layout follows torch.nn.Linear: layer l has a weight of shape
// [out, in] and a bias of [out], both row-major; a batch is [n, features],
// one sample per row.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <utility>
#include <vector>

#include "../support/optim_steps.hpp"

namespace train {

// ---------------------------------------------------------------------------
// Random numbers

// SplitMix64's finalizer (optim_steps.hpp), used to derive independent
// streams from (seed, purpose, rank, step) without any shared state.
using bench::mix64;

// The key of a stream: every rank derives the same key from the same
// arguments, so the teacher and the initial weights agree across ranks
// while each rank's data stream is its own.
inline std::uint64_t stream_key(std::uint64_t seed, std::uint64_t purpose, std::uint64_t a = 0,
                                std::uint64_t b = 0) {
  return mix64(mix64(mix64(seed ^ mix64(purpose)) ^ a) + b);
}

// A sequential generator over one stream. Implemented here rather than with
// <random>'s distributions, whose output differs between standard
// libraries, so that a seed draws the same numbers everywhere.
class Rng {
 public:
  explicit Rng(std::uint64_t key) : state_(key) {}

  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }
  // Uniform in (0, 1): never 0, so that log() below is finite.
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller; the second value of each pair is kept).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double t = 2.0 * std::numbers::pi * uniform();
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

 private:
  std::uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// ---------------------------------------------------------------------------
// The network

// dims = {inputs, hidden..., outputs}: dims.size() - 1 linear layers.
struct Shape {
  std::vector<int> dims;

  int layers() const { return static_cast<int>(dims.size()) - 1; }
  int in(int l) const { return dims[static_cast<std::size_t>(l)]; }
  int out(int l) const { return dims[static_cast<std::size_t>(l) + 1]; }
  std::size_t weight_numel(int l) const {
    return static_cast<std::size_t>(in(l)) * static_cast<std::size_t>(out(l));
  }
  std::size_t bias_numel(int l) const { return static_cast<std::size_t>(out(l)); }
  std::size_t numel() const {
    std::size_t n = 0;
    for (int l = 0; l < layers(); ++l) n += weight_numel(l) + bias_numel(l);
    return n;
  }
  int max_dim() const { return *std::max_element(dims.begin(), dims.end()); }
};

// The fp32 tensors of one layer (its parameters, or their gradients).
template <class T>
struct LayerTensors {
  T* weight = nullptr;  // [out, in]
  T* bias = nullptr;    // [out]
};
using LayerParams = LayerTensors<const float>;
using LayerGrads = LayerTensors<float>;

// Where a pass's layers come from, one at a time (ZeRO stage 3): begin(l)
// before a pass reads layer l's parameters (it may point params[l] at
// them), end(l) after its last read of them.
class LayerSource {
 public:
  virtual void begin(int layer) = 0;
  virtual void end(int layer) = 0;

 protected:
  ~LayerSource() = default;
};

// Forward and backward passes over n <= max_batch samples. Keeps the
// activations of the last forward pass for the backward pass.
class Mlp {
 public:
  Mlp(Shape shape, int max_batch) : shape_(std::move(shape)), max_batch_(max_batch) {
    const auto rows = static_cast<std::size_t>(max_batch);
    acts_.resize(static_cast<std::size_t>(shape_.layers()) + 1);
    for (int l = 1; l <= shape_.layers(); ++l) {
      const auto width = static_cast<std::size_t>(shape_.dims[static_cast<std::size_t>(l)]);
      acts_[static_cast<std::size_t>(l)].resize(rows * width);
    }
    const std::size_t scratch = rows * static_cast<std::size_t>(shape_.max_dim());
    delta_.resize(scratch);
    delta_next_.resize(scratch);
  }

  const Shape& shape() const { return shape_; }
  int max_batch() const { return max_batch_; }

  // x: [n, inputs], which must stay valid until backward() returns. Returns
  // the output, [n, outputs], valid until the next forward().
  const float* forward(std::span<const LayerParams> params, const float* x, int n,
                       LayerSource* source = nullptr) {
    input_ = x;
    const float* a = x;
    for (int l = 0; l < shape_.layers(); ++l) {
      if (source != nullptr) source->begin(l);
      const int in = shape_.in(l);
      const int out = shape_.out(l);
      float* z = acts_[static_cast<std::size_t>(l) + 1].data();
      // z = a W^T + b: the bias rows first, then the product added to them.
      for (int i = 0; i < n; ++i) {
        std::copy_n(params[static_cast<std::size_t>(l)].bias, out,
                    z + static_cast<std::ptrdiff_t>(i) * out);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, a, in,
                  params[static_cast<std::size_t>(l)].weight, in, 1.0f, z, out);
      if (l + 1 < shape_.layers()) {
        const std::size_t count = static_cast<std::size_t>(n) * static_cast<std::size_t>(out);
        for (std::size_t k = 0; k < count; ++k) z[k] = std::tanh(z[k]);
      }
      if (source != nullptr) source->end(l);
      a = z;
    }
    return a;
  }

  // dy: the gradient of the loss with respect to the last forward pass's
  // output, [n, outputs]. Writes the gradients (or, with accumulate, adds
  // to them) layer by layer from the last, and calls done(l) as soon as
  // layer l's gradients are complete, before the rest of the pass, so that
  // their reduction can overlap with it. The weights are read for the
  // input's gradient, which layer 0 does not need: source->begin(l) for
  // layers from the last to 1.
  template <class Done>
  void backward(std::span<const LayerParams> params, std::span<const LayerGrads> grads,
                const float* dy, int n, bool accumulate, Done&& done,
                LayerSource* source = nullptr) {
    const int layers = shape_.layers();
    std::copy_n(dy, static_cast<std::size_t>(n) * static_cast<std::size_t>(shape_.out(layers - 1)),
                delta_.data());
    for (int l = layers - 1; l >= 0; --l) {
      const int in = shape_.in(l);
      const int out = shape_.out(l);
      float* delta = delta_.data();  // dL/dz of this layer, [n, out]
      if (l + 1 < layers) {
        // Through the tanh: dz = da * (1 - a^2), with a the layer's output.
        const float* a = acts_[static_cast<std::size_t>(l) + 1].data();
        const std::size_t count = static_cast<std::size_t>(n) * static_cast<std::size_t>(out);
        for (std::size_t k = 0; k < count; ++k) delta[k] *= 1.0f - a[k] * a[k];
      }
      const float* a_in = l == 0 ? input_ : acts_[static_cast<std::size_t>(l)].data();
      const LayerGrads& g = grads[static_cast<std::size_t>(l)];
      // dW = delta^T a_in: [out, in].
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, delta, out, a_in, in,
                  accumulate ? 1.0f : 0.0f, g.weight, in);
      // db = the column sums of delta.
      if (!accumulate) std::fill_n(g.bias, out, 0.0f);
      for (int i = 0; i < n; ++i) {
        const float* row = delta + static_cast<std::ptrdiff_t>(i) * out;
        for (int j = 0; j < out; ++j) g.bias[j] += row[j];
      }
      done(l);
      if (l > 0) {
        // dL/da of the layer below: delta W, [n, in].
        if (source != nullptr) source->begin(l);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, delta, out,
                    params[static_cast<std::size_t>(l)].weight, in, 0.0f, delta_next_.data(), in);
        if (source != nullptr) source->end(l);
        std::swap(delta_, delta_next_);
      }
    }
  }

 private:
  Shape shape_;
  int max_batch_;
  const float* input_ = nullptr;
  std::vector<std::vector<float>> acts_;  // acts_[l]: the output of layer l - 1, [n, dims[l]]
  std::vector<float> delta_;
  std::vector<float> delta_next_;
};

// Mean squared error of y_hat against y over count elements; writes its
// gradient times `grad_scale` into dy.
inline double mse(const float* y_hat, const float* y, std::size_t count, float* dy,
                  double grad_scale) {
  double sum = 0.0;
  const auto scale = static_cast<float>(2.0 * grad_scale);
  for (std::size_t k = 0; k < count; ++k) {
    const float d = y_hat[k] - y[k];
    sum += static_cast<double>(d) * d;
    if (dy != nullptr) dy[k] = scale * d;
  }
  return count == 0 ? 0.0 : sum / static_cast<double>(count);
}

}  // namespace train
