// shardopt tests: the simulated device (sim_device.cpp), a DeviceRuntime
// with CUDA's semantics on the CPU. A program linked with it (link_whole:
// it installs itself from a static initializer) runs shardopt's device
// paths without a GPU:
//   - device memory lives at addresses the host cannot read or write (a
//     PROT_NONE range): a host dereference of a device pointer crashes.
//     Only the streams reach it, through a second mapping of the same
//     memory at a fixed offset. Fresh allocations hold 0xFF bytes (NaN),
//     as cudaMalloc leaves what was there;
//   - every stream is a worker thread running its operations in order;
//     events and stream waits are honoured; a copy from pageable host
//     memory takes its bytes when enqueued, one to pageable host memory
//     waits for its stream, as CUDA's do;
//   - SHARDOPT_SIM_DELAY_US=N (default 5; 0: none) delays every operation
//     by a random 0..N microseconds (seed SHARDOPT_SIM_SEED, printed at
//     start), so that a missing wait shows up as a wrong result;
//   - SHARDOPT_SIM_DEVICES=N (default 1) devices, the same N for every
//     process (one node); the calling thread's one is set with
//     set_device(). 0: the process has no device (it installs nothing), as
//     a rank of a job whose node has no GPU. By default every rank starts
//     on device 0, sharing it, as on a machine with one GPU;
//     SHARDOPT_SIM_DEVICE_PER_RANK=1 starts each on its local rank's device
//     (local rank mod N), as a job that gives each rank a GPU of its own;
//   - each device has a name, the same for every process (one host), so
//     that the device's own collectives refuse ranks sharing one, as
//     NCCL's do (SHARDOPT_SIM_NAMED_DEVICES=0 leaves them unnamed);
//   - what a GPU refuses fails here too: a kernel or collective given
//     pageable host memory (an illegal address on a GPU) sets a sticky
//     error that every later call throws; a thread that never chose its
//     device (set_device) using a stream or event of another device than
//     0 is an error (on a GPU it makes a context on device 0); avg in the
//     device's collectives is NCCL's (inputs times 1/n, then summed), and
//     they add floating-point values in an order of their own (the last
//     rank's first), as NCCL picks its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "device/device_runtime.hpp"

namespace shardopt::sim {

// The simulated device runtime (the one the program installed).
detail::DeviceRuntime& runtime();
// The calling thread's device (as cudaSetDevice).
void set_device(int device);
// The seed of the random delays (0 when they are off).
std::uint64_t delay_seed();
// The device's own collectives (NCCL's shape) of this process: the one
// enqueued after `n` more have been fails when its stream reaches it, as an
// NCCL operation fails asynchronously (a CommError its communicator reports
// at its next call). Called alike on every rank, the same operation fails
// everywhere, none of them having moved data. -1: none fails (the default).
void fail_collective_after(int n);
// Tests of the simulated device itself: forgets the sticky error that a
// kernel given pageable host memory set (a GPU has no such reset).
void clear_sticky_error();

}  // namespace shardopt::sim
