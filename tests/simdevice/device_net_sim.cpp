// shardopt-train-sim --device cuda: the student's passes on the simulated
// device (sim_device.hpp), the twin of apps/train/device_net.cu for the
// programs that run shardopt-train's device path without a GPU (the device
// suite, scripts/device-check --simulate).
//
// The parameters, gradients, batch, output and loss are simulated device
// memory (shardopt::DeviceBuffer, as apps/train/run.cpp allocates the
// batch), which the host cannot touch. The passes are train::Mlp's, the
// host trainer's own, run as host code enqueued on the device's default
// stream (DeviceRuntime::emulate) on the device view of those buffers; the
// Mlp's activations are the simulated kernels' scratch. The backward pass
// is one such kernel: done(l) follows it for each layer from the last, so
// the optimizer's reductions, on the same stream, come after the gradients.
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../../apps/train/device_net.hpp"
#include "device/device_runtime.hpp"
#include "shardopt/device.hpp"

namespace train {
namespace {

using shardopt::DeviceBuffer;
using shardopt::detail::DeviceRuntime;
using shardopt::detail::Translate;
using shardopt::detail::translated;

// The layers' tensors as a kernel reaches them.
template <class T>
std::vector<LayerTensors<T>> reached(const std::vector<LayerTensors<T>>& layers,
                                     const Translate& tr) {
  std::vector<LayerTensors<T>> out;
  for (const LayerTensors<T>& l : layers)
    out.push_back({translated(l.weight, tr), translated(l.bias, tr)});
  return out;
}

class SimNet final : public DeviceNet {
 public:
  SimNet(const Shape& shape, int max_batch)
      : mlp_(shape, max_batch),
        out_(static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(shape.dims.back()) *
             sizeof(float)),
        loss_(sizeof(double)) {
    rt_ = shardopt::detail::device_runtime();
    if (rt_ == nullptr || !rt_->emulated())
      throw std::runtime_error("--device cuda: this shardopt-train runs on the simulated device");
  }

  const float* forward(std::span<const LayerParams> params, const float* x, int n) override {
    auto* out = static_cast<float*>(out_.data());
    const std::size_t count =
        static_cast<std::size_t>(n) * static_cast<std::size_t>(mlp_.shape().dims.back());
    enqueue([this, p = std::vector<LayerParams>(params.begin(), params.end()), x, n, out,
             count](const Translate& tr) {
      const std::vector<LayerParams> on_device = reached(p, tr);
      const float* y = mlp_.forward(on_device, translated(x, tr), n);
      std::copy_n(y, count, translated(out, tr));
    });
    return out;
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
    enqueue([this, p = std::vector<LayerParams>(params.begin(), params.end()),
             g = std::vector<LayerGrads>(grads.begin(), grads.end()), dy, n,
             accumulate](const Translate& tr) {
      const std::vector<LayerParams> p_on_device = reached(p, tr);
      const std::vector<LayerGrads> g_on_device = reached(g, tr);
      mlp_.backward(p_on_device, g_on_device, translated(dy, tr), n, accumulate, [](int) {});
    });
    for (int l = mlp_.shape().layers() - 1; l >= 0; --l) done(l);
  }

 private:
  // On the default stream, which the optimizer's work follows.
  void enqueue(std::function<void(const Translate&)> kernel) {
    rt_->emulate(nullptr, std::move(kernel));
  }

  Mlp mlp_;  // touched only by the stream's kernels
  DeviceRuntime* rt_ = nullptr;
  DeviceBuffer out_;   // the forward pass's output, [max_batch, outputs]
  DeviceBuffer loss_;  // the loss, read back by mse()
};

}  // namespace

std::unique_ptr<DeviceNet> make_device_net(const Shape& shape, int max_batch) {
  return std::make_unique<SimNet>(shape, max_batch);
}

}  // namespace train
