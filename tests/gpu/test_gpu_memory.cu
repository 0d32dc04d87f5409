// gpu suite: device memory is recognised; the Communicator moves it (NCCL
// at one rank, staged at more) with the host's results, avg included; the
// optimizer refuses parameters and gradients split between the host and
// the GPU, and managed memory, naming them; pinned host memory is host
// memory. Skips (exit 77, which Meson reports as SKIP) when no CUDA device
// is visible.
#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "gpu_test.hpp"
#include "shardopt/shardopt.hpp"

using gpu_test::check;

namespace {

__global__ void fill(float* p, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

}  // namespace

int main(int argc, char** argv) {
  if (gpu_test::no_device()) return gpu_test::kSkip;
  shardopt::Environment env(&argc, &argv);
  shardopt::Communicator comm(MPI_COMM_WORLD);
  std::printf("%s\n", shardopt::build_info_string().c_str());

  const int n = 1 << 20;
  float* dev = nullptr;
  CUDA_CHECK(cudaMalloc(&dev, n * sizeof(float)));
  fill<<<(n + 255) / 256, 256>>>(dev, n, 1.0f);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  float probe[4] = {};
  CUDA_CHECK(cudaMemcpy(probe, dev + 1000, sizeof probe, cudaMemcpyDeviceToHost));
  check(probe[0] == 1001.0f && probe[3] == 1004.0f, "kernel wrote the expected values");

  const auto where = shardopt::detail::locate(dev);
  check(where.kind == shardopt::detail::MemoryKind::device && where.device == 0,
        "device memory is located on device 0");
  check(shardopt::detail::locate(probe).kind == shardopt::detail::MemoryKind::host,
        "a stack array is host memory");

  // Device buffers go through the device transport (NCCL at one rank),
  // avg as the host computes it: a sum, then a division.
  std::printf("  device buffers over %s\n", comm.device_backend_name());
  for (const auto op : {shardopt::ReduceOp::sum, shardopt::ReduceOp::avg}) {
    fill<<<(n + 255) / 256, 256>>>(dev, n, 1.0f);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    comm.allreduce(dev, dev, n, shardopt::DType::f32, op);
    CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(comm.stream())));
    std::vector<float> back(n);
    CUDA_CHECK(cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; ++i) {
      const float want = op == shardopt::ReduceOp::sum
                             ? (1.0f + float(i)) * float(comm.size())
                             : (1.0f + float(i)) * float(comm.size()) / float(comm.size());
      ok = ok && back[std::size_t(i)] == want;
    }
    check(ok, op == shardopt::ReduceOp::sum ? "an allreduce (sum) on device buffers"
                                            : "an allreduce (avg) on device buffers, bitwise");
  }

  // The ZeRO optimizer checks every registered buffer at construction: a
  // parameter whose data and gradient are in different memories is a
  // DeviceError naming the parameter, both buffers and their memories.
  std::vector<float> host(n, 1.0f), host_grad(n, 0.0f);
  for (const bool grad_on_device : {false, true}) {
    const std::string name = grad_on_device ? "grad_on_gpu" : "data_on_gpu";
    shardopt::Param p{.name = name,
                      .data = grad_on_device ? static_cast<void*>(host.data()) : dev,
                      .numel = static_cast<std::size_t>(n),
                      .dtype = shardopt::DType::f32,
                      .grad = grad_on_device ? static_cast<void*>(dev) : host_grad.data(),
                      .group = 0};
    bool named = false;
    try {
      shardopt::ZeroRedundancyOptimizer opt(comm, {p}, shardopt::SGD{}, shardopt::ZeroOptions{});
    } catch (const shardopt::DeviceError& e) {
      const std::string m = e.what();
      named = e.code() == shardopt::ErrorCode::wrong_device &&
              m.find("'" + name + "'") != std::string::npos &&
              m.find("gradient buffer is in") != std::string::npos &&
              m.find("CUDA device memory (device 0)") != std::string::npos &&
              m.find("host memory") != std::string::npos &&
              m.find("must be in the same memory") != std::string::npos;
      std::printf("  error: %s\n", e.what());
    }
    check(named, grad_on_device
                     ? "ZeroRedundancyOptimizer refuses a gradient on the GPU for host data"
                     : "ZeroRedundancyOptimizer refuses a host gradient for data on the GPU");
  }
  // Managed memory: the device may write it while the host reads it.
  float* managed = nullptr;
  CUDA_CHECK(cudaMallocManaged(&managed, 2 * n * sizeof(float)));
  {
    shardopt::Param p{.name = "managed",
                      .data = managed,
                      .numel = static_cast<std::size_t>(n),
                      .dtype = shardopt::DType::f32,
                      .grad = managed + n,
                      .group = 0};
    bool named = false;
    try {
      shardopt::ZeroRedundancyOptimizer opt(comm, {p}, shardopt::SGD{}, shardopt::ZeroOptions{});
    } catch (const shardopt::DeviceError& e) {
      named = std::string(e.what()).find("CUDA managed memory") != std::string::npos;
      std::printf("  error: %s\n", e.what());
    }
    check(named, "ZeroRedundancyOptimizer refuses managed memory, naming it");
  }
  CUDA_CHECK(cudaFree(managed));

  float* pinned = nullptr;
  CUDA_CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
  for (int i = 0; i < n; ++i) pinned[i] = 1.0f;
  comm.allreduce(pinned, pinned, n, shardopt::DType::f32, shardopt::ReduceOp::sum);
  check(pinned[0] == static_cast<float>(comm.size()) && pinned[n - 1] == comm.size(),
        "pinned host memory is accepted and reduced");

  CUDA_CHECK(cudaFreeHost(pinned));
  CUDA_CHECK(cudaFree(dev));
  return gpu_test::finish("gpu memory");
}
