// shardopt internal: the functional step without its checks, for a caller
// that checked the same kind of arguments once already and calls the step
// many times over pieces of buffers it owns: the ZeRO engine's fused
// update, one call per block of a shard (lib/zero/shard_state.cpp). The
// public functional::step checks its hyper-parameters, every buffer's size
// and memory, and then runs the same kernel; here host buffers go to the
// CPU kernel directly.
#pragma once

#include <cstdint>
#include <span>

#include "shardopt/optim.hpp"

namespace shardopt::detail {

// functional::step(params, grads, states, step, options, extra) on host
// buffers that functional::step would accept, without checking them: the
// caller's contract. extra's stream, noop_flag and skip_nonfinite are not
// read. Returns whether the gradients were finite, as the kernel found.
template <class O>
requires is_elementwise<O>
bool trusted_host_step(const functional::ParamView& params, const functional::GradView& grads,
                       std::span<const std::span<float>> states, std::int64_t step,
                       const O& options, const functional::StepOptions& extra);

}  // namespace shardopt::detail
