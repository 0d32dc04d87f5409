// The simulated device's test interface (sim_device.hpp) over the process's
// own device runtime, CUDA: the device suites linked with this file instead
// of sim_device.cpp run their assertions on a GPU (the gpu suite). A
// process that sees no device says so and exits 77 (a skip), before MPI
// starts, so that every rank of an mpirun job skips alike.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "device/device_runtime.hpp"
#include "simdevice/sim_device.hpp"

namespace shardopt::sim {

namespace {
struct NeedsDevice {
  NeedsDevice() {
    if (detail::device_runtime() == nullptr) {
      std::printf("SKIP: this process sees no CUDA device: the device suites on a GPU need one\n");
      std::fflush(stdout);
      std::_Exit(77);
    }
  }
} needs_device;
}  // namespace

detail::DeviceRuntime& runtime() { return *detail::device_runtime(); }

void set_device(int device) { runtime().set_current_device(device); }

std::uint64_t delay_seed() { return 0; }

void fail_collective_after(int n) {
  if (n >= 0)
    throw std::logic_error(
        "sim::fail_collective_after: only the simulated device fails a collective on request; "
        "tag the test [sim-only]");
}

void clear_sticky_error() {
  throw std::logic_error(
      "sim::clear_sticky_error: a GPU's context cannot be reset after an illegal address; tag "
      "the test [sim-only]");
}

}  // namespace shardopt::sim
