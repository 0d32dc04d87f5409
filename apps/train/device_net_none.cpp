// shardopt-train --device cuda in a build without CUDA: the error that
// says so (device_net.hpp).
#include <stdexcept>

#include "device_net.hpp"

namespace train {

std::unique_ptr<DeviceNet> make_device_net(const Shape&, int) {
  throw std::runtime_error(
      "--device cuda: this shardopt-train was built without CUDA; rebuild shardopt with "
      "-Dcuda=enabled on a machine with the CUDA toolkit, or train on the host (--device host)");
}

}  // namespace train
