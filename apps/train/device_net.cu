// shardopt-train --device cuda: the student's passes on a CUDA device
// (device_net.hpp).
//
// Row-major [rows, cols] matrices are cuBLAS's column-major [cols, rows]
// with the same leading dimension, so each product of Mlp is the cuBLAS
// call on the transposed views:
//   z [n, out]  = a [n, in] W^T + b:  z' = W'^T a'     (sgemm T, N; m out, n n, k in)
//   dW [out, in] = delta^T a_in:      dW' = a_in' delta'^T  (sgemm N, T; m in, n out, k n)
//   db [out]    = column sums of delta: delta' 1        (sgemv N)
//   d_in [n, in] = delta W:            d_in' = W' delta'     (sgemm N, N; m in, n n, k out)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "device_net.hpp"

namespace train {
namespace {

constexpr int kThreads = 256;
constexpr int kLossBlocks = 128;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(rc));
}
void check(cublasStatus_t rc, const char* what) {
  if (rc != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS: ") + what + ": status " +
                             std::to_string(static_cast<int>(rc)));
}

int blocks_for(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

__global__ void bias_rows(float* z, const float* bias, std::size_t rows, int cols) {
  const std::size_t total = rows * static_cast<std::size_t>(cols);
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<std::size_t>(blockDim.x) * gridDim.x)
    z[k] = bias[k % static_cast<std::size_t>(cols)];
}

__global__ void tanh_in_place(float* z, std::size_t n) {
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(blockDim.x) * gridDim.x)
    z[k] = tanhf(z[k]);
}

// Through the tanh: delta *= 1 - a^2, a the layer's output.
__global__ void tanh_backward(float* delta, const float* a, std::size_t n) {
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(blockDim.x) * gridDim.x)
    delta[k] *= 1.0f - a[k] * a[k];
}

__global__ void fill(float* x, float v, std::size_t n) {
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(blockDim.x) * gridDim.x)
    x[k] = v;
}

// dy = scale (y_hat - y); each block's sum of the squared differences in
// partial[blockIdx.x], summed by the host in block order (deterministic).
__global__ void squared_error(const float* y_hat, const float* y, std::size_t n, float* dy,
                              float scale, double* partial) {
  __shared__ double sums[kThreads];
  double s = 0.0;
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    const float d = y_hat[k] - y[k];
    s += static_cast<double>(d) * d;
    dy[k] = scale * d;
  }
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

template <class T>
T* device_array(std::size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, (n > 0 ? n : 1) * sizeof(T)), "allocating the network's buffers");
  return static_cast<T*>(p);
}

class CudaNet final : public DeviceNet {
 public:
  CudaNet(const Shape& shape, int max_batch) : shape_(shape) {
    check(cublasCreate(&blas_), "creating the handle");
    check(cublasSetStream(blas_, nullptr), "setting the default stream");
    const auto rows = static_cast<std::size_t>(max_batch);
    acts_.assign(static_cast<std::size_t>(shape_.layers()) + 1, nullptr);
    for (int l = 1; l <= shape_.layers(); ++l)
      acts_[static_cast<std::size_t>(l)] =
          device_array<float>(rows * static_cast<std::size_t>(shape_.dims[std::size_t(l)]));
    const std::size_t scratch = rows * static_cast<std::size_t>(shape_.max_dim());
    delta_ = device_array<float>(scratch);
    delta_next_ = device_array<float>(scratch);
    ones_ = device_array<float>(rows);
    fill<<<blocks_for(rows), kThreads>>>(ones_, 1.0f, rows);
    check(cudaGetLastError(), "filling the ones");
    partial_ = device_array<double>(kLossBlocks);
  }
  ~CudaNet() override {
    for (float* a : acts_) cudaFree(a);
    cudaFree(delta_);
    cudaFree(delta_next_);
    cudaFree(ones_);
    cudaFree(partial_);
    cublasDestroy(blas_);
  }

  const float* forward(std::span<const LayerParams> params, const float* x, int n) override {
    input_ = x;
    const float* a = x;
    const float one = 1.0f;
    for (int l = 0; l < shape_.layers(); ++l) {
      const int in = shape_.in(l), out = shape_.out(l);
      const LayerParams& p = params[static_cast<std::size_t>(l)];
      float* z = acts_[static_cast<std::size_t>(l) + 1];
      const std::size_t count = static_cast<std::size_t>(n) * static_cast<std::size_t>(out);
      bias_rows<<<blocks_for(count), kThreads>>>(z, p.bias, static_cast<std::size_t>(n), out);
      check(cudaGetLastError(), "the bias rows");
      check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, p.weight, in, a, in,
                        &one, z, out),
            "the forward product");
      if (l + 1 < shape_.layers()) {
        tanh_in_place<<<blocks_for(count), kThreads>>>(z, count);
        check(cudaGetLastError(), "the tanh");
      }
      a = z;
    }
    return a;
  }

  double mse(const float* y_hat, const float* y, std::size_t count, float* dy,
             double grad_scale) override {
    if (count == 0) return 0.0;
    squared_error<<<kLossBlocks, kThreads>>>(y_hat, y, count, dy,
                                             static_cast<float>(2.0 * grad_scale), partial_);
    check(cudaGetLastError(), "the loss");
    std::vector<double> partial(kLossBlocks);
    check(
        cudaMemcpy(partial.data(), partial_, kLossBlocks * sizeof(double), cudaMemcpyDeviceToHost),
        "reading the loss");
    double sum = 0.0;
    for (double s : partial) sum += s;
    return sum / static_cast<double>(count);
  }

  void backward(std::span<const LayerParams> params, std::span<const LayerGrads> grads,
                const float* dy, int n, bool accumulate,
                const std::function<void(int)>& done) override {
    const int layers = shape_.layers();
    const float one = 1.0f, zero = 0.0f, beta = accumulate ? 1.0f : 0.0f;
    check(cudaMemcpyAsync(delta_, dy,
                          static_cast<std::size_t>(n) *
                              static_cast<std::size_t>(shape_.out(layers - 1)) * sizeof(float),
                          cudaMemcpyDeviceToDevice, nullptr),
          "copying the output's gradient");
    for (int l = layers - 1; l >= 0; --l) {
      const int in = shape_.in(l), out = shape_.out(l);
      const std::size_t count = static_cast<std::size_t>(n) * static_cast<std::size_t>(out);
      if (l + 1 < layers) {
        tanh_backward<<<blocks_for(count), kThreads>>>(delta_, acts_[std::size_t(l) + 1], count);
        check(cudaGetLastError(), "the tanh's gradient");
      }
      const float* a_in = l == 0 ? input_ : acts_[static_cast<std::size_t>(l)];
      const LayerGrads& g = grads[static_cast<std::size_t>(l)];
      check(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, a_in, in, delta_, out,
                        &beta, g.weight, in),
            "the weight's gradient");
      check(cublasSgemv(blas_, CUBLAS_OP_N, out, n, &one, delta_, out, ones_, 1, &beta, g.bias, 1),
            "the bias's gradient");
      done(l);
      if (l > 0) {
        check(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one,
                          params[static_cast<std::size_t>(l)].weight, in, delta_, out, &zero,
                          delta_next_, in),
              "the input's gradient");
        std::swap(delta_, delta_next_);
      }
    }
  }

 private:
  Shape shape_;
  cublasHandle_t blas_ = nullptr;
  const float* input_ = nullptr;
  std::vector<float*> acts_;  // acts_[l]: the output of layer l - 1, [n, dims[l]]
  float* delta_ = nullptr;
  float* delta_next_ = nullptr;
  float* ones_ = nullptr;      // max_batch ones: the bias gradient's column sums
  double* partial_ = nullptr;  // the loss's per-block sums
};

}  // namespace

std::unique_ptr<DeviceNet> make_device_net(const Shape& shape, int max_batch) {
  return std::make_unique<CudaNet>(shape, max_batch);
}

}  // namespace train
