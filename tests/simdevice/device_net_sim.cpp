// shardopt-train-sim --device cuda: the student's passes on the simulated
// device (sim_device.hpp), the twin of apps/train/device_net.cu for the
// programs that run shardopt-train's device path without a GPU (the device
// suite, scripts/device-check --simulate).
//
// Every buffer is simulated device memory (shardopt::DeviceBuffer, as
// apps/train/run.cpp allocates the batch), which the host cannot touch;
// every pass is host code enqueued on the device's default stream
// (DeviceRuntime::emulate), which reaches the memory through its device
// view, in the order device_net.cu enqueues its kernels: the forward pass,
// the loss (train::mse, the host waiting for its value), then per layer
// from the last its gradients, done(l) from the host, the input's
// gradient. The products are train::Mlp's, row-major through OpenBLAS.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../../apps/train/device_net.hpp"
#include "common/device_runtime.hpp"
#include "shardopt/device.hpp"

namespace train {
namespace {

using shardopt::DeviceBuffer;
using shardopt::detail::DeviceRuntime;
using shardopt::detail::Translate;
using shardopt::detail::translated;

DeviceBuffer floats(std::size_t n) { return DeviceBuffer(std::max<std::size_t>(n, 1) * 4); }

float* as_floats(const DeviceBuffer& b) { return static_cast<float*>(b.data()); }

class SimNet final : public DeviceNet {
 public:
  SimNet(const Shape& shape, int max_batch) : shape_(shape) {
    rt_ = shardopt::detail::device_runtime();
    if (rt_ == nullptr || !rt_->emulated())
      throw std::runtime_error("--device cuda: this shardopt-train runs on the simulated device");
    const auto rows = static_cast<std::size_t>(max_batch);
    acts_.resize(static_cast<std::size_t>(shape_.layers()) + 1);
    for (int l = 1; l <= shape_.layers(); ++l)
      acts_[static_cast<std::size_t>(l)] =
          floats(rows * static_cast<std::size_t>(shape_.dims[static_cast<std::size_t>(l)]));
    const std::size_t scratch = rows * static_cast<std::size_t>(shape_.max_dim());
    delta_ = floats(scratch);
    delta_next_ = floats(scratch);
    loss_ = DeviceBuffer(sizeof(double));
  }

  const float* forward(std::span<const LayerParams> params, const float* x, int n) override {
    input_ = x;
    std::vector<LayerParams> p(params.begin(), params.end());
    std::vector<float*> acts;
    for (const DeviceBuffer& a : acts_) acts.push_back(as_floats(a));
    const Shape shape = shape_;
    enqueue([shape, p = std::move(p), acts, x, n](const Translate& tr) {
      const float* a = translated(x, tr);
      for (int l = 0; l < shape.layers(); ++l) {
        const int in = shape.in(l), out = shape.out(l);
        const float* w = translated(p[static_cast<std::size_t>(l)].weight, tr);
        const float* b = translated(p[static_cast<std::size_t>(l)].bias, tr);
        float* z = translated(acts[static_cast<std::size_t>(l) + 1], tr);
        // z = a W^T + b: the bias rows, then the product added to them.
        for (int i = 0; i < n; ++i) std::copy_n(b, out, z + static_cast<std::ptrdiff_t>(i) * out);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, a, in, w, in, 1.0f,
                    z, out);
        if (l + 1 < shape.layers()) {
          const std::size_t count = static_cast<std::size_t>(n) * static_cast<std::size_t>(out);
          for (std::size_t k = 0; k < count; ++k) z[k] = std::tanh(z[k]);
        }
        a = z;
      }
    });
    return as_floats(acts_.back());
  }

  double mse(const float* y_hat, const float* y, std::size_t count, float* dy,
             double grad_scale) override {
    if (count == 0) return 0.0;
    auto* loss = static_cast<double*>(loss_.data());
    enqueue([=](const Translate& tr) {
      float* d = dy != nullptr ? translated(dy, tr) : nullptr;
      *translated(loss, tr) =
          train::mse(translated(y_hat, tr), translated(y, tr), count, d, grad_scale);
    });
    double value = 0.0;
    shardopt::device_copy(&value, loss, sizeof value);  // waits for the stream
    return value;
  }

  void backward(std::span<const LayerParams> params, std::span<const LayerGrads> grads,
                const float* dy, int n, bool accumulate,
                const std::function<void(int)>& done) override {
    const int layers = shape_.layers();
    float* delta = as_floats(delta_);
    float* delta_next = as_floats(delta_next_);
    const std::size_t out_count =
        static_cast<std::size_t>(n) * static_cast<std::size_t>(shape_.out(layers - 1));
    enqueue([=](const Translate& tr) {
      std::copy_n(translated(dy, tr), out_count, translated(delta, tr));
    });
    for (int l = layers - 1; l >= 0; --l) {
      const int in = shape_.in(l), out = shape_.out(l);
      const float* a_out =
          l + 1 < layers ? as_floats(acts_[static_cast<std::size_t>(l) + 1]) : nullptr;
      const float* a_in = l == 0 ? input_ : as_floats(acts_[static_cast<std::size_t>(l)]);
      const LayerGrads g = grads[static_cast<std::size_t>(l)];
      // This layer's gradients, from dL/dz (through the tanh first).
      enqueue([=](const Translate& tr) {
        float* d = translated(delta, tr);
        const std::size_t count = static_cast<std::size_t>(n) * static_cast<std::size_t>(out);
        if (a_out != nullptr) {
          const float* a = translated(a_out, tr);
          for (std::size_t k = 0; k < count; ++k) d[k] *= 1.0f - a[k] * a[k];
        }
        // dW = delta^T a_in: [out, in].
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, d, out,
                    translated(a_in, tr), in, accumulate ? 1.0f : 0.0f, translated(g.weight, tr),
                    in);
        // db = the column sums of delta.
        float* db = translated(g.bias, tr);
        if (!accumulate) std::fill_n(db, out, 0.0f);
        for (int i = 0; i < n; ++i) {
          const float* row = d + static_cast<std::ptrdiff_t>(i) * out;
          for (int j = 0; j < out; ++j) db[j] += row[j];
        }
      });
      done(l);
      if (l > 0) {
        // dL/da of the layer below: delta W, [n, in].
        const float* w = params[static_cast<std::size_t>(l)].weight;
        enqueue([=](const Translate& tr) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f,
                      translated(delta, tr), out, translated(w, tr), in, 0.0f,
                      translated(delta_next, tr), in);
        });
        std::swap(delta, delta_next);
      }
    }
  }

 private:
  // On the default stream, which the optimizer's work follows.
  void enqueue(std::function<void(const Translate&)> kernel) {
    rt_->emulate(nullptr, std::move(kernel));
  }

  Shape shape_;
  DeviceRuntime* rt_ = nullptr;
  const float* input_ = nullptr;
  std::vector<DeviceBuffer> acts_;  // acts_[l]: the output of layer l - 1, [n, dims[l]]
  DeviceBuffer delta_;
  DeviceBuffer delta_next_;
  DeviceBuffer loss_;  // the loss, read back by mse()
};

}  // namespace

std::unique_ptr<DeviceNet> make_device_net(const Shape& shape, int max_batch) {
  return std::make_unique<SimNet>(shape, max_batch);
}

}  // namespace train
