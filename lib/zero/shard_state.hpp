// shardopt: the ZeRO engine's update part (internal). A ShardState owns this
// rank's optimizer state for the segments it updates (ShardLayout::mine,
// lib/zero/shards.hpp): the fp32 master copy of 16-bit parameters (or their
// 16-bit remainders), one fp32 buffer per state slot any group uses, LAMB's
// update direction and the custom optimizer's scratch; and it runs the
// fused update of those segments, reading the reduced gradients from the
// GradReducer (lib/zero/reduction.hpp). Checkpoints read and replace its
// buffers (lib/zero/save_load.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/zero.hpp"
#include "zero/optimizer_config.hpp"
#include "zero/reduction.hpp"
#include "zero/shards.hpp"
#include "zero/space.hpp"

namespace shardopt::detail {

class ShardState {
 public:
  // Allocates the buffers and fills them from the parameters (the master
  // copy) and the optimizers' initial values. params, groups and layout
  // must outlive it (the engine's own); comm carries LAMB's norms.
  // param_shard: stage 3's pieces of the parameters (null at stages 0-2:
  // the parameters are the registered buffers).
  ShardState(Communicator& comm, const Space& space, const std::vector<Param>& params,
             const std::vector<OptimizerConfig>& groups, const ShardLayout& layout, int stage,
             DType dtype, bool remainders, std::byte* param_shard = nullptr);

  // One step on this rank's segments: gradients from `grads` times mul,
  // step the count after this step. Collective for LAMB (its norms).
  // noop: on a device, a word of device memory; a non-zero value when the
  // stream reaches the update makes it write nothing (element-wise
  // optimizers only).
  void update(const GradReducer& grads, double mul, std::int64_t step,
              const std::uint32_t* noop = nullptr);

  // The state slots allocated, in slot order (their names).
  const std::vector<std::string>& slots() const noexcept { return slots_; }
  // Whether 16-bit parameters have an fp32 master copy, or remainders.
  bool master() const noexcept { return master_; }
  bool remainders() const noexcept { return remainders_; }
  // The master copy (or remainders), and slot k's buffer: indexed by
  // Segment::storage. A checkpoint's load replaces them whole.
  const SpaceBuffer& master_buffer() const noexcept { return master_buf_; }
  const SpaceBuffer& state(std::size_t k) const noexcept { return states_[k]; }
  // Slot k's values of segment s into out[0, s.count) (host memory).
  void read_state(std::size_t k, const Segment& s, float* out) const;
  // Where segment s's parameters live: the user's buffer, or at stage 3
  // the parameter shard.
  std::byte* user_param(const Segment& s) const;
  // Segment s's fp32 master values into out[0, s.count) (host memory): the
  // master copy, the remainders decoded, or the fp32 parameters.
  void read_master(const Segment& s, float* out) const;
  // Takes the values a checkpoint loaded: staging[k] (slot k - 1; 0 the
  // master values, fp32), laid out like the state, holds the parameters p
  // with loaded[k][p] set. A slot loaded for every parameter becomes the
  // state buffer itself; the others are copied segment by segment. The
  // master values also go to the user's parameters (or their remainders).
  void load(std::vector<HostBuffer>& staging, const std::vector<std::vector<char>>& loaded);
  // Adds its buffers to m.
  void add_memory(MemoryReport& m) const;

 private:
  // A run: consecutive elements of one group whose buffers (parameters,
  // gradients, states, parameter copy) are each contiguous.
  struct Run {
    int group = 0;
    std::size_t storage = 0, count = 0;
    std::byte* param = nullptr;  // fp32 master, fp32 parameters, or bf16 with remainders
    const std::byte* grad = nullptr;
    DType grad_type = DType::f32;
    std::byte* out = nullptr;  // the 16-bit parameters beside an fp32 master
  };
  void init();
  Run run_of(const Segment& s);
  void for_each_run(const std::function<void(const Run&)>& f);
  void step_range(const Run& r, std::size_t off, std::size_t n, const void* grad, DType gt,
                  double mul, std::vector<std::span<float>>& states);
  void update_elementwise(double mul);
  void update_elementwise_device(double mul, const std::uint32_t* noop);
  void update_lamb(double mul);
  void update_custom(double mul);

  Communicator& comm_;
  const Space& space_;
  const std::vector<Param>& params_;
  const std::vector<OptimizerConfig>& groups_;
  const ShardLayout& layout_;
  int stage_;
  DType dtype_;
  std::size_t elem_;  // bytes of dtype_
  bool master_, remainders_;
  OptKind kind_;  // OptimizerConfig's alternative, the same in every group
  int rank_, nranks_;
  std::vector<std::string> slots_;
  std::byte* param_shard_;

  SpaceBuffer master_buf_;           // fp32 master, or 16-bit remainders
  std::vector<SpaceBuffer> states_;  // one per slot
  SpaceBuffer lamb_update_;          // LAMB's direction
  SpaceBuffer custom_scratch_;       // custom optimizer: fp32 gradients of one segment

  // The step under way (update()).
  const GradReducer* grads_ = nullptr;
  std::int64_t step_ = 0;
};

}  // namespace shardopt::detail
