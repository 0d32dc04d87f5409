// shardopt kernels (internal): how a list of tensors is cut into the launch
// tables of the multi-tensor CUDA kernels (kernels/cuda/multi_tensor.cuh).
// Host code, no CUDA: the CPU tests check the plan.
//
// Each tensor is cut into chunks of `chunk_elements` elements (the last one
// shorter); each block of a launch processes whole chunks. A launch's table
// holds at most `max_tensors` tensors and `max_chunks` chunks (what fits in
// the kernel's parameters); a list that needs more takes several launches,
// in order, a tensor split across two launches where the first fills up.
// Empty tensors take no chunk and no table entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

namespace shardopt::kernels {

// The chunk of the CUDA multi-tensor kernels: 64 iterations of a block of
// 256 threads taking 4 elements each.
inline constexpr std::size_t kMultiTensorChunk = std::size_t{1} << 16;

// One chunk of a launch: elements [index * chunk_elements,
// min(n, (index + 1) * chunk_elements)) of the launch's table entry `tensor`.
struct TensorChunk {
  std::uint32_t tensor;
  std::uint32_t index;
};

struct MultiTensorLimits {
  std::size_t chunk_elements;  // a multiple of 4 (whole vector groups)
  std::size_t max_tensors;     // table entries per launch
  std::size_t max_chunks;      // chunks per launch
};

// One launch: its table's tensors (indices into the list) and its chunks.
struct MultiTensorLaunch {
  std::vector<std::size_t> tensors;
  std::vector<TensorChunk> chunks;
};

// The launches that cover every element of tensors of the given sizes
// exactly once, in list order. Throws std::invalid_argument for limits that
// cannot hold a chunk.
inline std::vector<MultiTensorLaunch> plan_multi_tensor(std::span<const std::size_t> sizes,
                                                        const MultiTensorLimits& limits) {
  if (limits.chunk_elements == 0 || limits.chunk_elements % 4 != 0 || limits.max_tensors == 0 ||
      limits.max_chunks == 0)
    throw std::invalid_argument("multi-tensor plan: limits cannot hold a chunk");
  std::vector<MultiTensorLaunch> launches;
  MultiTensorLaunch current;
  const auto flush = [&] {
    if (!current.chunks.empty()) launches.push_back(std::move(current));
    current = {};
  };
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const std::size_t chunks = (sizes[t] + limits.chunk_elements - 1) / limits.chunk_elements;
    if (chunks > UINT32_MAX) throw std::invalid_argument("multi-tensor plan: tensor too large");
    for (std::size_t k = 0; k < chunks; ++k) {
      if (current.chunks.size() == limits.max_chunks) flush();
      if (current.tensors.empty() || current.tensors.back() != t) {
        if (current.tensors.size() == limits.max_tensors) flush();
        current.tensors.push_back(t);
      }
      current.chunks.push_back(
          {static_cast<std::uint32_t>(current.tensors.size() - 1), static_cast<std::uint32_t>(k)});
    }
  }
  flush();
  return launches;
}

}  // namespace shardopt::kernels
