// The CUDA LAMB kernels: the direction and apply passes are grid-stride
// launches calling the same element functions as the CPU kernels
// (--fmad=false); the norms' block sums are computed one block per thread
// with lamb_block_sq_sum and added in block order on the host, so they equal
// the reference's bitwise.
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "kernels/lamb.hpp"
#include "kernels/lamb_loop.hpp"

namespace shardopt::kernels::cuda {

namespace {

__global__ void block_sums_kernel(const float* p, const float* r, std::size_t n, double* sums) {
  const std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t begin = k * kLambNormBlock;
  if (begin >= n) return;
  const std::size_t count = n - begin < kLambNormBlock ? n - begin : kLambNormBlock;
  sums[2 * k] = lamb_block_sq_sum(p + begin, count);
  sums[2 * k + 1] = lamb_block_sq_sum(r + begin, count);
}

}  // namespace

LambNorms lamb_direction(const LambBuffers& b, const LambScalars& s, void* stream_arg) {
  const auto stream = static_cast<cudaStream_t>(stream_arg);
  const bool finite = kernels::detail::dispatch_lamb_direction(
      b, [&]<class Loop>() { return detail::run<Loop>("LAMB", b, s, b.n, stream); });
  const std::size_t blocks = (b.n + kLambNormBlock - 1) / kLambNormBlock;
  std::vector<double> sums(2 * blocks);
  if (blocks > 0) {
    double* dsums = nullptr;
    detail::check(
        cudaMallocAsync(reinterpret_cast<void**>(&dsums), sums.size() * sizeof(double), stream),
        "LAMB", "allocating the norm blocks");
    const unsigned threads = 128;
    block_sums_kernel<<<static_cast<unsigned>((blocks + threads - 1) / threads), threads, 0,
                        stream>>>(b.param, b.update, b.n, dsums);
    detail::check(cudaGetLastError(), "LAMB", "launching the norms");
    detail::check(cudaMemcpyAsync(sums.data(), dsums, sums.size() * sizeof(double),
                                  cudaMemcpyDeviceToHost, stream),
                  "LAMB", "reading the norm blocks");
    detail::check(cudaFreeAsync(dsums, stream), "LAMB", "freeing the norm blocks");
    detail::check(cudaStreamSynchronize(stream), "LAMB", "waiting for the norms");
  }
  return kernels::detail::lamb_sum_blocks(sums.data(), b.n, finite);
}

void lamb_apply(const LambApplyBuffers& b, float neg_step, void* stream) {
  kernels::detail::dispatch_lamb_apply(b, [&]<class Loop>() {
    return detail::run<Loop>("LAMB", b, neg_step, b.n, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace shardopt::kernels::cuda
