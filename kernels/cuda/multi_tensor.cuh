// shardopt CUDA kernels (internal): one optimizer step over a list of
// tensors in one launch, or a few (the functional API's lists, the engine's
// many small parameters). Included by .cu files only.
//
// The tensors of a list are grouped by the loop they need (gradient type,
// parameter storage, modes: kernels/element_loop.hpp); each group is cut into
// chunks (kernels/multi_tensor.hpp) and its launch tables are passed as the
// kernel's parameter (__grid_constant__, within the classic 4 KB of
// parameters): the tensors' buffers, each tensor's vector head, and the
// chunks. So a launch needs no allocation and no copy of its table. Each
// block takes chunks in a grid-stride loop; in a chunk the threads take
// groups of 4 elements with vector loads when the tensor's buffers align
// (kernels/vector_step.hpp), else single elements. Launches of a list follow
// each other on the stream, and the call waits once, for the non-finite flag.
//
// A table entry E is a Buffers struct, or a struct with a member `buffers`
// and optionally `scalars`, the scalars of that tensor's step where they
// differ between tensors (LAMB's apply pass); otherwise the launch's scalars
// apply to every tensor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "kernels/multi_tensor.hpp"

namespace shardopt::kernels::cuda::detail {

inline constexpr std::size_t kChunkElements = kMultiTensorChunk;
// The vector head of a tensor whose buffers do not align: scalar steps only.
inline constexpr std::uint8_t kScalarOnly = 0xff;
// The bytes of kernel parameters every CUDA device accepts.
inline constexpr std::size_t kParamBytes = 4096;

template <class E>
SHARDOPT_HOST_DEVICE const auto& tensor_buffers(const E& e) {
  if constexpr (requires { e.buffers; })
    return e.buffers;
  else
    return e;
}
template <class E, class S>
SHARDOPT_HOST_DEVICE const auto& tensor_scalars(const E& e, const S& s) {
  if constexpr (requires { e.scalars; })
    return e.scalars;
  else
    return s;
}

// How many tensors and chunks a table of entries E holds, with the launch's
// scalars S and its two flags beside it in the kernel's parameters.
template <class E, class S>
struct TableShape {
  static constexpr std::size_t budget = kParamBytes - sizeof(S) - 2 * sizeof(void*) - 64;
  static constexpr std::size_t tensors = std::min<std::size_t>(64, budget / 2 / (sizeof(E) + 1));
  static constexpr std::size_t chunks =
      (budget - tensors * (sizeof(E) + 1) - sizeof(int)) / sizeof(TensorChunk);
};

// The table of one launch.
template <class E, std::size_t T, std::size_t M>
struct Table {
  E tensors[T];
  TensorChunk chunks[M];
  std::uint8_t heads[T];  // vector head of each tensor (kernels/vector_step.hpp), or kScalarOnly
  int chunk_count;
};

template <class E, class S>
using TableFor = Table<E, TableShape<E, S>::tensors, TableShape<E, S>::chunks>;

// Each block processes chunks of the table: groups of 4 elements with
// vector steps from the tensor's head on, the at most 3 + 3 elements around
// them with scalar steps, or all scalar for a tensor that does not align
// (kernels/vector_step.hpp: vector_share, scalar_share). Bounds as
// launch.cuh's vector_kernel. A non-zero *skip (a device word, the engine's
// agreed non-finite verdict) makes every block return before it touches a
// buffer; any_nonfinite may be null (nobody reads it).
template <class Loop, class E, class S, class Tab>
__global__ void __launch_bounds__(kThreads, 1)
    multi_tensor_kernel(const __grid_constant__ Tab table, const S s, unsigned* any_nonfinite,
                        const unsigned* skip) {
  if (skip != nullptr && *skip != 0u) return;
  bool bad = false;
  for (unsigned c = blockIdx.x; c < static_cast<unsigned>(table.chunk_count); c += gridDim.x) {
    const TensorChunk chunk = table.chunks[c];
    const E& e = table.tensors[chunk.tensor];
    const auto& b = tensor_buffers(e);
    const auto& sc = tensor_scalars(e, s);
    const std::size_t begin = static_cast<std::size_t>(chunk.index) * kChunkElements;
    const std::size_t end = b.n - begin < kChunkElements ? b.n : begin + kChunkElements;
    const std::uint8_t head = table.heads[chunk.tensor];
    const bool finite =
        head != kScalarOnly
            ? kernels::detail::vector_share<Loop>(b, sc, begin, end, head, threadIdx.x, blockDim.x)
            : kernels::detail::scalar_share<Loop>(b, sc, begin, end, threadIdx.x, blockDim.x);
    bad |= !finite;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0 && any_nonfinite != nullptr)
    atomicOr(any_nonfinite, 1u);
}

// The launch tables of Loop over the tensors `group` (indices into entries,
// all of them needing Loop): fills each table and calls launch(table) for it.
template <class Loop, class E, class S, class Launch>
void for_each_table(std::span<const E> entries, std::span<const std::size_t> group, const S& s,
                    Launch&& launch) {
  using Shape = TableShape<E, S>;
  using Tab = TableFor<E, S>;
  // The table, the scalars, the flags, and up to 8 bytes of padding between them.
  static_assert(sizeof(Tab) + sizeof(S) + 2 * sizeof(unsigned*) + 8 <= kParamBytes,
                "a launch table must fit in the kernel parameters");
  std::vector<std::size_t> sizes(group.size());
  for (std::size_t j = 0; j < group.size(); ++j) sizes[j] = tensor_buffers(entries[group[j]]).n;
  const auto plan = plan_multi_tensor(sizes, {kChunkElements, Shape::tensors, Shape::chunks});
  for (const MultiTensorLaunch& l : plan) {
    Tab table{};
    for (std::size_t t = 0; t < l.tensors.size(); ++t) {
      const E& e = entries[group[l.tensors[t]]];
      table.tensors[t] = e;
      const int head = kernels::detail::vector_head<Loop>(tensor_buffers(e), tensor_scalars(e, s));
      table.heads[t] = head < 0 ? kScalarOnly : static_cast<std::uint8_t>(head);
    }
    std::copy(l.chunks.begin(), l.chunks.end(), table.chunks);
    table.chunk_count = static_cast<int>(l.chunks.size());
    launch(table);
  }
}

// An address per loop type: the key that groups a list's tensors.
template <class Loop>
inline constexpr char loop_tag = 0;

// The indices of the tensors of `entries` that have elements, grouped by the
// loop that dispatch(buffers, f) picks for each (it calls
// f.template operator()<Loop>()); groups in order of first appearance, list
// order within each.
template <class E, class Dispatch>
std::vector<std::vector<std::size_t>> group_by_loop(std::span<const E> entries,
                                                    Dispatch&& dispatch) {
  std::vector<const void*> keys;
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (tensor_buffers(entries[i]).n == 0) continue;
    const void* key = nullptr;
    dispatch(tensor_buffers(entries[i]), [&]<class Loop>() {
      key = &loop_tag<Loop>;
      return true;
    });
    const auto at = std::find(keys.begin(), keys.end(), key);
    if (at == keys.end()) {
      keys.push_back(key);
      groups.push_back({i});
    } else {
      groups[static_cast<std::size_t>(at - keys.begin())].push_back(i);
    }
  }
  return groups;
}

// Launches the tables of every group of `entries` on `stream` without
// waiting; each group's loop comes from dispatch(buffers, f) as in
// group_by_loop. after(table, stream) runs after each table's launch, with
// the group's loop: f.template operator()<Loop>(table) (LAMB's norms).
// flag (may be null) is raised by a non-finite gradient; skip (may be null):
// the launches do nothing when it holds a non-zero word as they run.
template <class E, class S, class Dispatch, class After>
void launch_multi(const char* kernel, std::span<const E> entries, const S& s, unsigned* flag,
                  cudaStream_t stream, Dispatch&& dispatch, After&& after,
                  const unsigned* skip = nullptr) {
  for (const std::vector<std::size_t>& group : group_by_loop(entries, dispatch)) {
    dispatch(tensor_buffers(entries[group.front()]), [&]<class Loop>() {
      for_each_table<Loop>(entries, std::span<const std::size_t>(group), s, [&](const auto& table) {
        multi_tensor_kernel<Loop, E, S>
            <<<table.chunk_count, kThreads, 0, stream>>>(table, s, flag, skip);
        check(cudaGetLastError(), kernel, "launching");
        after.template operator()<Loop>(table, stream);
      });
      return true;
    });
  }
}

// Does nothing after a table's launch.
struct NothingAfter {
  template <class Loop, class Tab>
  void operator()(const Tab&, cudaStream_t) const {}
};

// Runs the step over every tensor of `entries` on `stream` and waits; true
// if every gradient was finite. dispatch(buffers, f) calls
// f.template operator()<Loop>() with the loop of those buffers.
template <class E, class S, class Dispatch>
bool run_multi(const char* kernel, std::span<const E> entries, const S& s, cudaStream_t stream,
               Dispatch&& dispatch) {
  NonFiniteFlag flag(kernel, stream);
  launch_multi(kernel, entries, s, flag.get(), stream, dispatch, NothingAfter{});
  return flag.read();
}

}  // namespace shardopt::kernels::cuda::detail
