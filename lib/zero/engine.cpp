// shardopt: the ZeRO engine's parameters and gradients as the user reaches
// them; the reduction itself is the GradReducer's (lib/zero/reduction.cpp).
#include "zero/engine.hpp"

#include <string>

#include "common/check.hpp"
#include "common/language.hpp"
#include "common/watchdog.hpp"

namespace shardopt::detail {

const Param& ZeroEngine::param(std::size_t i) const {
  if (i >= params_.size())
    throw_error(ErrorCode::invalid_argument,
                "parameter index " + index_text(i) + " is out of range (" +
                    std::to_string(params_.size()) + " parameters)",
                "pass an index below num_params()", __FILE__, __LINE__);
  return params_[i];
}

void* ZeroEngine::grad(std::size_t i) {
  param(i);  // checks the index
  return reducer().grad(i);
}

void ZeroEngine::zero_grad() {
  reducer().discard();
  reducer().zero_grad_buffers();
}

void ZeroEngine::grad_ready(std::size_t i, const void* grad, std::optional<StreamHandle> producer) {
  param(i);  // checks the index
  reducer().grad_ready(i, grad, producer);
}

void ZeroEngine::watch(const char* what, std::size_t bucket, bool after_update) const {
  if (!watchdog_armed()) return;
  // The step under way: the allgather of the parameters comes after the
  // update has counted it (unless its verdict is still on the device).
  const std::int64_t step = after_update && !verdict_.pending ? steps_ : steps_ + 1;
  watch_context(step, what, bucket, reducer().bucket_count());
}

}  // namespace shardopt::detail
