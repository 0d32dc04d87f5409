// shardopt-train --device cuda: the student's forward and backward passes on
// a CUDA device, the passes of train::Mlp (mlp.hpp) with its matmuls
// through cuBLAS and its element-wise work in small kernels
// (device_net.cu; device_net_none.cpp in a build without CUDA).
//
// Every buffer is device memory, and all the work runs on the device's
// default stream, in order: the optimizer's work (ZeroOptions::stream null)
// follows it there, so a gradient handed to grad_ready(i) from done(l) is
// complete when the optimizer reads it. The host waits only for the loss.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>

#include "mlp.hpp"

namespace train {

class DeviceNet {
 public:
  virtual ~DeviceNet() = default;
  // As Mlp::forward, x [n, inputs] in device memory: the output [n,
  // outputs] in device memory, valid until the next forward().
  virtual const float* forward(std::span<const LayerParams> params, const float* x, int n) = 0;
  // As train::mse on device buffers: writes dy = 2 (y_hat - y) grad_scale
  // and returns the mean squared error (the host waits for it).
  virtual double mse(const float* y_hat, const float* y, std::size_t count, float* dy,
                     double grad_scale) = 0;
  // As Mlp::backward, on device buffers.
  virtual void backward(std::span<const LayerParams> params, std::span<const LayerGrads> grads,
                        const float* dy, int n, bool accumulate,
                        const std::function<void(int)>& done) = 0;
};

// The passes of `shape` over at most max_batch samples on the current
// device. Throws std::runtime_error when the build has no CUDA or cuBLAS
// fails to start.
std::unique_ptr<DeviceNet> make_device_net(const Shape& shape, int max_batch);

}  // namespace train
