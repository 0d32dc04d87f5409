// shardopt-train: the model and the data of a run (model.hpp).
#include "model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace train {

namespace {

// --inputs, then --layers - 1 hidden layers of width `hidden`, then --outputs.
train::Shape mlp_shape(const Options& o, int hidden) {
  train::Shape s;
  s.dims.push_back(o.inputs);
  s.dims.insert(s.dims.end(), static_cast<std::size_t>(std::max(o.layers - 1, 0)), hidden);
  s.dims.push_back(o.outputs);
  return s;
}

}  // namespace

train::Shape student_shape(const Options& o) { return mlp_shape(o, o.hidden); }

train::Shape teacher_shape(const Options& o) { return mlp_shape(o, o.teacher_hidden); }

std::vector<float> student_init(const train::Shape& shape, std::uint64_t seed) {
  std::vector<float> v(shape.numel());
  train::Rng rng(train::stream_key(seed, kStudentStream));
  std::size_t k = 0;
  for (int l = 0; l < shape.layers(); ++l) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(shape.in(l)));
    const std::size_t n = shape.weight_numel(l) + shape.bias_numel(l);
    for (std::size_t j = 0; j < n; ++j) v[k++] = static_cast<float>(rng.uniform(-bound, bound));
  }
  return v;
}

Teacher make_teacher(train::Mlp& net, std::uint64_t seed) {
  const train::Shape& shape = net.shape();
  Teacher t;
  t.values.resize(shape.numel());
  train::Rng rng(train::stream_key(seed, kTeacherStream));
  std::size_t k = 0;
  std::vector<std::size_t> at;
  for (int l = 0; l < shape.layers(); ++l) {
    // Unit gain: the tanh layers are mildly nonlinear, a function a wider
    // student learns to a small fraction of its variance in a few hundred steps.
    const double std_w = 1.0 / std::sqrt(static_cast<double>(shape.in(l)));
    at.push_back(k);
    for (std::size_t j = 0; j < shape.weight_numel(l); ++j) {
      t.values[k++] = static_cast<float>(std_w * rng.normal());
    }
    at.push_back(k);
    for (std::size_t j = 0; j < shape.bias_numel(l); ++j) {
      t.values[k++] = static_cast<float>(0.1 * rng.normal());
    }
  }
  for (int l = 0; l < shape.layers(); ++l) {
    const auto i = 2 * static_cast<std::size_t>(l);
    t.layers.push_back({t.values.data() + at[i], t.values.data() + at[i + 1]});
  }

  // Standardize the outputs, measured on samples of a stream of their own.
  const int in = shape.dims.front();
  const int out = shape.dims.back();
  const int samples = 4096;
  std::vector<double> sum(static_cast<std::size_t>(out), 0.0);
  std::vector<double> sum_sq(static_cast<std::size_t>(out), 0.0);
  std::vector<float> x(static_cast<std::size_t>(net.max_batch()) * static_cast<std::size_t>(in));
  train::Rng sample_rng(train::stream_key(seed, kTeacherStream, 1));
  for (int first = 0; first < samples; first += net.max_batch()) {
    const int rows = std::min(net.max_batch(), samples - first);
    for (float& v : x) v = static_cast<float>(sample_rng.normal());
    const float* y = net.forward(t.layers, x.data(), rows);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < out; ++j) {
        const double v = y[static_cast<std::ptrdiff_t>(r) * out + j];
        sum[static_cast<std::size_t>(j)] += v;
        sum_sq[static_cast<std::size_t>(j)] += v * v;
      }
    }
  }
  float* w_last = t.values.data() + at[at.size() - 2];
  float* b_last = t.values.data() + at[at.size() - 1];
  for (int j = 0; j < out; ++j) {
    const double mean = sum[static_cast<std::size_t>(j)] / samples;
    const double var = std::max(sum_sq[static_cast<std::size_t>(j)] / samples - mean * mean, 1e-12);
    const double inv_sd = 1.0 / std::sqrt(var);
    for (int c = 0; c < shape.in(shape.layers() - 1); ++c) {
      float& w = w_last[static_cast<std::ptrdiff_t>(j) * shape.in(shape.layers() - 1) + c];
      w = static_cast<float>(w * inv_sd);
    }
    b_last[j] = static_cast<float>((b_last[j] - mean) * inv_sd);
  }
  return t;
}

void draw_batch(Batch& batch, int n, std::uint64_t key, const Teacher& teacher,
                train::Mlp& teacher_net) {
  const train::Shape& shape = teacher_net.shape();
  const auto n_in = static_cast<std::size_t>(n) * static_cast<std::size_t>(shape.dims.front());
  const auto n_out = static_cast<std::size_t>(n) * static_cast<std::size_t>(shape.dims.back());
  batch.x.resize(n_in);
  batch.y.resize(n_out);
  train::Rng rng(key);
  for (float& v : batch.x) v = static_cast<float>(rng.normal());
  // In chunks of the teacher's largest batch.
  const int chunk = teacher_net.max_batch();
  for (int first = 0; first < n; first += chunk) {
    const int rows = std::min(chunk, n - first);
    const float* out = teacher_net.forward(
        teacher.layers, batch.x.data() + static_cast<std::size_t>(first) * shape.dims.front(),
        rows);
    std::copy_n(out, static_cast<std::size_t>(rows) * static_cast<std::size_t>(shape.dims.back()),
                batch.y.data() + static_cast<std::size_t>(first) * shape.dims.back());
  }
}

double evaluate(train::Mlp& net, std::span<const train::LayerParams> params, const Batch& batch) {
  const train::Shape& shape = net.shape();
  const std::size_t in = static_cast<std::size_t>(shape.dims.front());
  const std::size_t out = static_cast<std::size_t>(shape.dims.back());
  const int n = static_cast<int>(batch.x.size() / in);
  double sum = 0.0;
  for (int first = 0; first < n; first += net.max_batch()) {
    const int rows = std::min(net.max_batch(), n - first);
    const float* y_hat =
        net.forward(params, batch.x.data() + static_cast<std::size_t>(first) * in, rows);
    const std::size_t count = static_cast<std::size_t>(rows) * out;
    sum += train::mse(y_hat, batch.y.data() + static_cast<std::size_t>(first) * out, count, nullptr,
                      0.0) *
           static_cast<double>(count);
  }
  return sum / static_cast<double>(static_cast<std::size_t>(n) * out);
}

}  // namespace train
