// shardopt-train: the model and the data of a run: the student's tensors
// (the parameters and gradients the optimizer works on), the teacher it
// learns to reproduce, the batches of samples and the loss on them. The
// network's passes are mlp.hpp's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mlp.hpp"
#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace train {

using shardopt::DType;

// Purposes of the random streams (see train::stream_key).
inline constexpr std::uint64_t kTeacherStream = 1;
inline constexpr std::uint64_t kStudentStream = 2;
inline constexpr std::uint64_t kDataStream = 3;
inline constexpr std::uint64_t kEvalStream = 4;

// The layer widths of the student and of the teacher.
train::Shape student_shape(const Options& o);
train::Shape teacher_shape(const Options& o);

// The parameters and gradients the optimizer works on, in the model's
// dtype, and the fp32 views the forward and backward passes use. Tensor 2l
// is layer l's weight, 2l + 1 its bias (the order of the forward pass).
// Contiguous (the default): one buffer holds every parameter, end to end in
// that order, and one every gradient, as a code with flat parameter
// storage has them. Scattered: a buffer per tensor.
class ModelTensors {
 public:
  // device: every buffer (the tensors and the fp32 working copies) in the
  // current device's memory, contiguous.
  ModelTensors(const train::Shape& shape, DType dtype, bool scattered, bool device = false)
      : dtype_(dtype), scattered_(scattered), device_(device) {
    for (int l = 0; l < shape.layers(); ++l) {
      add("layers." + std::to_string(l) + ".weight", shape.weight_numel(l),
          {static_cast<std::uint32_t>(shape.out(l)), static_cast<std::uint32_t>(shape.in(l))});
      add("layers." + std::to_string(l) + ".bias", shape.bias_numel(l),
          {static_cast<std::uint32_t>(shape.out(l)), 0});
    }
    const std::size_t esize = shardopt::dtype_size(dtype);
    if (scattered_) {
      for (Tensor& t : tensors_) {
        // At least one element, so that no pointer is null.
        t.param_storage.resize(std::max<std::size_t>(t.numel, 1) * esize);
        t.grad_storage.resize(std::max<std::size_t>(t.numel, 1) * esize);
        t.param = t.param_storage.data();
        t.grad = t.grad_storage.data();
      }
    } else {
      std::byte* params = nullptr;
      std::byte* grads = nullptr;
      const std::size_t bytes = std::max<std::size_t>(numel_, 1) * esize;
      if (device_) {
        device_params_ = shardopt::DeviceBuffer(bytes);
        device_grads_ = shardopt::DeviceBuffer(bytes);
        params = static_cast<std::byte*>(device_params_.data());
        grads = static_cast<std::byte*>(device_grads_.data());
      } else {
        params_ = shardopt::HostBuffer(bytes);
        grads_ = shardopt::HostBuffer(bytes);
        params = params_.as<std::byte>();
        grads = grads_.as<std::byte>();
      }
      for (Tensor& t : tensors_) {
        t.param = params + t.offset * esize;
        t.grad = grads + t.offset * esize;
      }
    }
    if (dtype_ != DType::f32) {
      if (device_) {
        device_work_params_ = shardopt::DeviceBuffer(std::max<std::size_t>(numel_, 1) * 4);
        device_work_grads_ = shardopt::DeviceBuffer(std::max<std::size_t>(numel_, 1) * 4);
      } else {
        work_params_.resize(numel_);
        work_grads_.resize(numel_);
      }
    }
  }

  std::size_t count() const { return tensors_.size(); }
  std::size_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  bool scattered() const { return scattered_; }
  bool on_device() const { return device_; }
  const std::string& name(std::size_t i) const { return tensors_[i].name; }
  std::size_t numel(std::size_t i) const { return tensors_[i].numel; }
  std::size_t offset(std::size_t i) const { return tensors_[i].offset; }
  // {rows, columns}; columns 0 for a vector.
  std::array<std::uint32_t, 2> dims(std::size_t i) const { return tensors_[i].dims; }
  void* param(std::size_t i) { return tensors_[i].param; }
  const void* param(std::size_t i) const { return tensors_[i].param; }
  void* grad(std::size_t i) { return tensors_[i].grad; }
  // Bytes of the trainer's fp32 working copies (16-bit models only).
  std::size_t working_bytes() const {
    return (work_params_.size() + work_grads_.size()) * sizeof(float) + device_work_params_.size() +
           device_work_grads_.size();
  }

  // units: each layer (its weight and bias) a unit, ZeRO stage 3's.
  std::vector<shardopt::Param> registration(bool units = false) {
    std::vector<shardopt::Param> out;
    for (Tensor& t : tensors_) {
      shardopt::Param p;
      if (units) p.unit = static_cast<int>(out.size() / 2);
      p.name = t.name;
      p.data = t.param;
      p.numel = t.numel;
      p.dtype = dtype_;
      p.grad = t.grad;
      // [out, in] for a weight, [out] for a bias: the shapes of checkpoints
      // and exports.
      p.shape = {t.dims[0]};
      if (t.dims[1] != 0) p.shape.push_back(t.dims[1]);
      out.push_back(std::move(p));
    }
    return out;
  }

  // Sets the parameters from fp32 values laid out as offset() says.
  void set_params(std::span<const float> values) {
    if (device_) {
      std::vector<std::byte> bytes(numel_ * shardopt::dtype_size(dtype_));
      shardopt::cast(values.data(), DType::f32, bytes.data(), dtype_, numel_);
      shardopt::device_copy(device_params_.data(), bytes.data(), bytes.size());
      return;
    }
    for (std::size_t i = 0; i < count(); ++i) {
      shardopt::cast(values.data() + offset(i), DType::f32, param(i), dtype_, numel(i));
    }
  }

  // The parameters' bytes in host memory, tensor i from host_param(i): the
  // tensors themselves on the host; on a device, a copy made by this call.
  void mirror_params() {
    if (!device_) return;
    host_mirror_.resize(numel_ * shardopt::dtype_size(dtype_));
    shardopt::device_copy(host_mirror_.data(), device_params_.data(), host_mirror_.size());
  }
  const void* host_param(std::size_t i) const {
    if (!device_) return param(i);
    return host_mirror_.data() + offset(i) * shardopt::dtype_size(dtype_);
  }

  // The fp32 parameters of each layer in host memory (for evaluation on the
  // host): layer_params() on the host, a copy made by this call on a
  // device. 16-bit models: call refresh_working() first.
  std::vector<train::LayerParams> host_layer_params() {
    if (!device_) return layer_params();
    host_fp32_.resize(numel_);
    const void* from = dtype_ == DType::f32 ? device_params_.data() : device_work_params_.data();
    shardopt::device_copy(host_fp32_.data(), from, numel_ * sizeof(float));
    std::vector<train::LayerParams> out;
    for (std::size_t i = 0; i + 1 < count(); i += 2)
      out.push_back({host_fp32_.data() + offset(i), host_fp32_.data() + offset(i + 1)});
    return out;
  }

  // The fp32 parameters of each layer: the parameters themselves for an
  // fp32 model, else working copies that refresh_working() fills.
  std::vector<train::LayerParams> layer_params() {
    std::vector<train::LayerParams> out;
    for (std::size_t i = 0; i + 1 < count(); i += 2) {
      out.push_back({fp32_param(i), fp32_param(i + 1)});
    }
    return out;
  }
  // The fp32 gradients of each layer: the registered gradient buffers for an
  // fp32 model, else working copies that publish_grad() converts.
  std::vector<train::LayerGrads> layer_grads() {
    std::vector<train::LayerGrads> out;
    for (std::size_t i = 0; i + 1 < count(); i += 2) {
      out.push_back({fp32_grad(i), fp32_grad(i + 1)});
    }
    return out;
  }

  // 16-bit models: converts the parameters (as the last step left them)
  // into the fp32 working copies.
  void refresh_working() {
    if (dtype_ == DType::f32) return;
    if (device_) {
      shardopt::cast(device_params_.data(), dtype_, device_work_params_.data(), DType::f32, numel_);
      return;
    }
    if (!scattered_) {
      shardopt::cast(params_.data(), dtype_, work_params_.data(), DType::f32, numel_);
      return;
    }
    for (std::size_t i = 0; i < count(); ++i) {
      shardopt::cast(param(i), dtype_, work_params_.data() + offset(i), DType::f32, numel(i));
    }
  }

  // The fp32 tensor i the passes read: the parameter itself for an fp32
  // model, else its working copy.
  float* fp32_param(std::size_t i) {
    if (dtype_ == DType::f32) return static_cast<float*>(param(i));
    if (device_) return static_cast<float*>(device_work_params_.data()) + offset(i);
    return work_params_.data() + offset(i);
  }

  // 16-bit models: writes tensor i's fp32 gradient into its gradient buffer.
  void publish_grad(std::size_t i) {
    if (dtype_ == DType::f32) return;
    shardopt::cast(work_grad(i), DType::f32, grad(i), dtype_, numel(i));
  }

 private:
  struct Tensor {
    std::string name;
    std::size_t numel = 0;
    std::size_t offset = 0;  // elements before it in the contiguous layout
    std::array<std::uint32_t, 2> dims{};
    void* param = nullptr;
    void* grad = nullptr;
    std::vector<std::byte> param_storage;  // scattered only
    std::vector<std::byte> grad_storage;
  };

  void add(std::string name, std::size_t numel, std::array<std::uint32_t, 2> dims) {
    Tensor t;
    t.name = std::move(name);
    t.numel = numel;
    t.offset = numel_;
    t.dims = dims;
    numel_ += numel;
    tensors_.push_back(std::move(t));
  }

  float* work_grad(std::size_t i) {
    if (device_) return static_cast<float*>(device_work_grads_.data()) + offset(i);
    return work_grads_.data() + offset(i);
  }
  float* fp32_grad(std::size_t i) {
    if (dtype_ == DType::f32) return static_cast<float*>(grad(i));
    return work_grad(i);
  }

  DType dtype_;
  bool scattered_;
  bool device_;
  std::size_t numel_ = 0;
  std::vector<Tensor> tensors_;
  shardopt::HostBuffer params_;  // contiguous on the host only
  shardopt::HostBuffer grads_;
  std::vector<float> work_params_;  // 16-bit models on the host only
  std::vector<float> work_grads_;
  shardopt::DeviceBuffer device_params_;  // on a device only
  shardopt::DeviceBuffer device_grads_;
  shardopt::DeviceBuffer device_work_params_;  // 16-bit models on a device only
  shardopt::DeviceBuffer device_work_grads_;
  std::vector<std::byte> host_mirror_;  // mirror_params()
  std::vector<float> host_fp32_;        // host_layer_params()
};

// torch.nn.Linear's default initialization: weights and biases uniform in
// +-1/sqrt(fan_in). Laid out as ModelTensors' offsets.
std::vector<float> student_init(const train::Shape& shape, std::uint64_t seed);

// The teacher: fp32 weights of unit gain, small biases, and each output
// standardized (zero mean,
// unit variance over random inputs), so that the loss reads as the fraction
// of the targets' variance the student has not learned: about 1 at first.
struct Teacher {
  std::vector<float> values;
  std::vector<train::LayerParams> layers;
};

Teacher make_teacher(train::Mlp& net, std::uint64_t seed);

// One batch of samples: inputs [n, inputs] and the teacher's outputs.
struct Batch {
  std::vector<float> x;
  std::vector<float> y;
};

// Draws n samples from the stream `key` and their targets, the teacher's
// outputs.
void draw_batch(Batch& batch, int n, std::uint64_t key, const Teacher& teacher,
                train::Mlp& teacher_net);

// The student's mean loss on a batch, forward only, in chunks of its
// largest batch.
double evaluate(train::Mlp& net, std::span<const train::LayerParams> params, const Batch& batch);

}  // namespace train
