// The CUDA sum of squares in the CPU's fixed order (see kernels/norm.hpp):
// the blocks' sums are added in order on the host. Bitwise equal to the
// reference.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/norm.hpp"

namespace shardopt::kernels::cuda {

namespace {

// kNormLanes threads per block of the blocking: lane l adds the squares of
// elements begin + l, begin + l + kNormLanes, ... in order (the CPU's lane
// order, so 16 neighbouring threads read 16 neighbouring elements), then
// lane 0 adds the lanes in the CPU's tree order.
constexpr int kThreads = 128;
constexpr int kPerCta = kThreads / kNormLanes;

template <class T>
__global__ void block_sums(const T* x, std::size_t n, std::size_t blocks, double* out) {
  __shared__ double lanes[kThreads];
  const int l = threadIdx.x % kNormLanes;
  const std::size_t b = blockIdx.x * static_cast<std::size_t>(kPerCta) + threadIdx.x / kNormLanes;
  double acc = 0.0;
  if (b < blocks) {
    const std::size_t begin = b * kNormBlock;
    const std::size_t end = begin + kNormBlock < n ? begin + kNormBlock : n;
    for (std::size_t i = begin + l; i < end; i += kNormLanes) {
      const double v = static_cast<double>(to_float(x[i]));
      acc += v * v;
    }
  }
  lanes[threadIdx.x] = acc;
  __syncthreads();
  if (l == 0 && b < blocks) {
    double* lane = lanes + threadIdx.x;
    for (int width = kNormLanes / 2; width > 0; width /= 2)
      for (int k = 0; k < width; ++k) lane[k] += lane[k + width];
    out[b] = lane[0];
  }
}

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("CUDA sum of squares: ") + what + ": " +
                             cudaGetErrorString(rc));
  }
}

template <class T>
double run(const T* x, std::size_t n, cudaStream_t stream) {
  const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  if (blocks == 0) return 0.0;
  double* d = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&d), blocks * sizeof(double), stream),
        "allocating the block sums");
  block_sums<<<static_cast<unsigned>((blocks + kPerCta - 1) / kPerCta), kThreads, 0, stream>>>(
      x, n, blocks, d);
  check(cudaGetLastError(), "launching");
  std::vector<double> partial(blocks);
  check(cudaMemcpyAsync(partial.data(), d, blocks * sizeof(double), cudaMemcpyDeviceToHost, stream),
        "reading the block sums");
  check(cudaFreeAsync(d, stream), "freeing the block sums");
  check(cudaStreamSynchronize(stream), "waiting");
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

double sum_squares(const void* x, DType type, std::size_t n, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return with_float_type(x, type, [&](const auto* p) { return run(p, n, s); });
}

}  // namespace shardopt::kernels::cuda
