// Parameter remainders on the host: the encoding of kernels/element.hpp, the
// one the optimizers' loops use, over whole buffers.
#include <string>

#include "kernels/element.hpp"
#include "shardopt/optim.hpp"
#include "step_checks.hpp"

namespace shardopt::functional {

namespace {

void check_sizes(const char* what, std::size_t master, std::size_t params, std::size_t remainders) {
  if (params != master || remainders != master) {
    detail::bad_buffer(what,
                       "sizes differ: master " + std::to_string(master) + ", params " +
                           std::to_string(params) + ", remainders " + std::to_string(remainders),
                       "pass one bf16 parameter and one remainder for each fp32 value");
  }
}

}  // namespace

void encode_param_remainders(std::span<const float> master, std::span<bfloat16> params,
                             std::span<std::uint16_t> remainders) {
  check_sizes("encode_param_remainders", master.size(), params.size(), remainders.size());
  for (std::size_t i = 0; i < master.size(); ++i)
    kernels::encode_remainder(master[i], params[i], remainders[i]);
}

void decode_param_remainders(std::span<const bfloat16> params,
                             std::span<const std::uint16_t> remainders, std::span<float> master) {
  check_sizes("decode_param_remainders", master.size(), params.size(), remainders.size());
  for (std::size_t i = 0; i < master.size(); ++i)
    master[i] = kernels::decode_remainder(params[i], remainders[i]);
}

}  // namespace shardopt::functional
