// The CUDA LAMB kernels: the direction and apply passes are grid-stride
// launches calling the same element functions as the CPU kernels
// (--fmad=false), with vector loads where the buffers align
// (kernels/cuda/launch.cuh); the norms' block sums are computed one block
// per thread with lane_sum_squares and added in block order on the host, so
// they equal the reference's bitwise. Lists of tensors run each pass as
// multi-tensor launches (kernels/cuda/multi_tensor.cuh), the norms of each
// tensor from its own blocks.
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/multi_tensor.cuh"
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
  detail::DeviceScratch<double> dsums(sums.size(), "LAMB", "allocating the norm blocks", stream);
  const unsigned threads = 128;
  block_sums_kernel<Loop>
      <<<static_cast<unsigned>((blocks + threads - 1) / threads), threads, 0, stream>>>(
          b, dsums.get());
  detail::check(cudaGetLastError(), "LAMB", "launching the norms");
  detail::check(cudaMemcpyAsync(sums.data(), dsums.get(), sums.size() * sizeof(double),
                                cudaMemcpyDeviceToHost, stream),
                "LAMB", "reading the norm blocks");
  detail::check(cudaStreamSynchronize(stream), "LAMB", "waiting for the norms");
}

// A tensor of a list's direction pass and where its norm blocks' sums go
// (2 per block of kLambNormBlock elements, as block_sums).
struct LambDirectionTensor {
  LambBuffers buffers;
  double* sums;
};

// A tensor of a list's apply pass with its own neg_step.
struct LambApplyTensor {
  LambApplyBuffers buffers;
  float scalars;
};

constexpr unsigned kNormBlocksPerChunk =
    static_cast<unsigned>(detail::kChunkElements / kLambNormBlock);
static_assert(detail::kChunkElements % kLambNormBlock == 0,
              "a chunk holds whole norm blocks, each summed by one thread");

// The block sums of the norm blocks of a table's chunks, one thread each.
template <class Loop, class Tab>
__global__ void multi_block_sums_kernel(const __grid_constant__ Tab table) {
  for (unsigned c = blockIdx.x; c < static_cast<unsigned>(table.chunk_count); c += gridDim.x) {
    const TensorChunk chunk = table.chunks[c];
    const LambDirectionTensor& e = table.tensors[chunk.tensor];
    const std::size_t k = static_cast<std::size_t>(chunk.index) * kNormBlocksPerChunk + threadIdx.x;
    const std::size_t begin = k * kLambNormBlock;
    if (threadIdx.x < kNormBlocksPerChunk && begin < e.buffers.n) {
      const std::size_t count =
          e.buffers.n - begin < kLambNormBlock ? e.buffers.n - begin : kLambNormBlock;
      e.sums[2 * k] = lane_sum_squares(Loop::values(e.buffers), begin, count);
      e.sums[2 * k + 1] = lane_sum_squares(e.buffers.update, begin, count);
    }
  }
}

// After each direction table: the block sums of its chunks, which the
// direction kernel before it on the stream has finished.
struct BlockSumsAfter {
  template <class Loop, class Tab>
  void operator()(const Tab& table, cudaStream_t stream) const {
    multi_block_sums_kernel<Loop>
        <<<static_cast<unsigned>(table.chunk_count), kNormBlocksPerChunk, 0, stream>>>(table);
    detail::check(cudaGetLastError(), "LAMB", "launching the norms");
  }
};

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

bool lamb_direction(std::span<const LambBuffers> tensors, const LambScalars& s,
                    std::span<LambNorms> norms, void* stream_arg) {
  const auto stream = static_cast<cudaStream_t>(stream_arg);
  // Each tensor's norm blocks, one after the other in one array.
  std::vector<std::size_t> first_block(tensors.size() + 1, 0);
  for (std::size_t i = 0; i < tensors.size(); ++i)
    first_block[i + 1] = first_block[i] + (tensors[i].n + kLambNormBlock - 1) / kLambNormBlock;
  const std::size_t blocks = first_block.back();
  detail::DeviceScratch<double> dsums(2 * blocks, "LAMB", "allocating the norm blocks", stream);
  std::vector<LambDirectionTensor> entries(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    entries[i] = {tensors[i], blocks > 0 ? dsums.get() + 2 * first_block[i] : nullptr};
  detail::NonFiniteFlag flag("LAMB", stream);
  detail::launch_multi(
      "LAMB", std::span<const LambDirectionTensor>(entries), s, flag.get(), stream,
      [&](const LambBuffers& b, auto&& f) {
        return kernels::detail::dispatch_lamb_direction(b, f);
      },
      BlockSumsAfter{});
  std::vector<double> sums(2 * blocks);
  if (blocks > 0)
    detail::check(cudaMemcpyAsync(sums.data(), dsums.get(), sums.size() * sizeof(double),
                                  cudaMemcpyDeviceToHost, stream),
                  "LAMB", "reading the norm blocks");
  const bool finite = flag.read();  // waits for the stream, the copy included
  for (std::size_t i = 0; i < tensors.size(); ++i)
    norms[i] =
        kernels::detail::lamb_sum_blocks(sums.data() + 2 * first_block[i], tensors[i].n, finite);
  return finite;
}

void lamb_apply(std::span<const LambApplyBuffers> tensors, std::span<const float> neg_steps,
                void* stream) {
  std::vector<LambApplyTensor> entries(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) entries[i] = {tensors[i], neg_steps[i]};
  detail::run_multi("LAMB", std::span<const LambApplyTensor>(entries), 0.0f,
                    static_cast<cudaStream_t>(stream), [&](const LambApplyBuffers& b, auto&& f) {
                      return kernels::detail::dispatch_lamb_apply(b, f);
                    });
}

}  // namespace shardopt::kernels::cuda
