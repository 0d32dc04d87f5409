// The CUDA LAMB kernels: the direction and apply passes are grid-stride
// launches calling the same element functions as the CPU kernels
// (--fmad=false); the norms' block sums are computed one block per thread
// with lane_sum_squares and added in block order on the host, so they equal
// the reference's bitwise.
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "kernels/lamb.hpp"
#include "kernels/lamb_loop.hpp"

namespace shardopt::kernels::cuda {

namespace {

template <class Loop>
__global__ void block_sums_kernel(LambBuffers b, double* sums) {
  const std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t begin = k * kLambNormBlock;
  if (begin >= b.n) return;
  const std::size_t count = b.n - begin < kLambNormBlock ? b.n - begin : kLambNormBlock;
  sums[2 * k] = lane_sum_squares(Loop::values(b), begin, count);
  sums[2 * k + 1] = lane_sum_squares(b.update, begin, count);
}

// The squared sums of p and r per norm block, into sums (2 per block).
template <class Loop>
void block_sums(const LambBuffers& b, std::vector<double>& sums, cudaStream_t stream) {
  const std::size_t blocks = sums.size() / 2;
  double* dsums = nullptr;
  detail::check(
      cudaMallocAsync(reinterpret_cast<void**>(&dsums), sums.size() * sizeof(double), stream),
      "LAMB", "allocating the norm blocks");
  const unsigned threads = 128;
  block_sums_kernel<Loop>
      <<<static_cast<unsigned>((blocks + threads - 1) / threads), threads, 0, stream>>>(b, dsums);
  detail::check(cudaGetLastError(), "LAMB", "launching the norms");
  detail::check(cudaMemcpyAsync(sums.data(), dsums, sums.size() * sizeof(double),
                                cudaMemcpyDeviceToHost, stream),
                "LAMB", "reading the norm blocks");
  detail::check(cudaFreeAsync(dsums, stream), "LAMB", "freeing the norm blocks");
  detail::check(cudaStreamSynchronize(stream), "LAMB", "waiting for the norms");
}

}  // namespace

LambNorms lamb_direction(const LambBuffers& b, const LambScalars& s, void* stream_arg) {
  const auto stream = static_cast<cudaStream_t>(stream_arg);
  const std::size_t blocks = (b.n + kLambNormBlock - 1) / kLambNormBlock;
  std::vector<double> sums(2 * blocks);
  const bool finite = kernels::detail::dispatch_lamb_direction(b, [&]<class Loop>() {
    const bool ok = detail::run<Loop>("LAMB", b, s, b.n, stream);
    if (blocks > 0) block_sums<Loop>(b, sums, stream);
    return ok;
  });
  return kernels::detail::lamb_sum_blocks(sums.data(), b.n, finite);
}

void lamb_apply(const LambApplyBuffers& b, float neg_step, void* stream) {
  kernels::detail::dispatch_lamb_apply(b, [&]<class Loop>() {
    return detail::run<Loop>("LAMB", b, neg_step, b.n, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace shardopt::kernels::cuda
