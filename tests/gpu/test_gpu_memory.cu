// gpu suite: device memory is recognised, and the host communicator refuses
// it with a clear error instead of crashing inside MPI. Skips (exit 77, which
// Meson reports as SKIP) when no CUDA device is visible.
#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "common/device.hpp"
#include "shardopt/shardopt.hpp"

namespace {

int g_failed = 0;
int g_passed = 0;

void check(bool ok, const char* what) {
  (ok ? g_passed : g_failed)++;
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
}

__global__ void fill(float* p, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

}  // namespace

int main(int argc, char** argv) {
  const int devices = shardopt::detail::cuda_device_count();
  if (devices == 0) {
    std::printf(
        "SKIP: no CUDA device visible to this process (cudaGetDeviceCount found none); "
        "the gpu suite runs on a machine with a GPU (scripts/device-check)\n");
    return 77;
  }
  shardopt::Environment env(&argc, &argv);
  shardopt::Communicator comm(MPI_COMM_WORLD);
  std::printf("%s\n", shardopt::build_info_string().c_str());

  const int n = 1 << 20;
  float* dev = nullptr;
  check(cudaMalloc(&dev, n * sizeof(float)) == cudaSuccess, "cudaMalloc");
  fill<<<(n + 255) / 256, 256>>>(dev, n, 1.0f);
  check(cudaDeviceSynchronize() == cudaSuccess, "fill kernel ran");
  float probe[4] = {};
  cudaMemcpy(probe, dev + 1000, sizeof probe, cudaMemcpyDeviceToHost);
  check(probe[0] == 1001.0f && probe[3] == 1004.0f, "kernel wrote the expected values");

  const auto where = shardopt::detail::locate(dev);
  check(where.kind == shardopt::detail::MemoryKind::device && where.device == 0,
        "device memory is located on device 0");
  check(shardopt::detail::locate(probe).kind == shardopt::detail::MemoryKind::host,
        "a stack array is host memory");

  bool refused = false;
  try {
    comm.allreduce(dev, dev, n, shardopt::DType::f32, shardopt::ReduceOp::sum);
  } catch (const shardopt::DeviceError& e) {
    refused = e.code() == shardopt::ErrorCode::wrong_device &&
              std::string(e.what()).find("CUDA device memory") != std::string::npos;
    std::printf("  error: %s\n", e.what());
  }
  check(refused, "the mpi-host backend refuses device buffers with a clear error");

  float* pinned = nullptr;
  check(cudaMallocHost(&pinned, n * sizeof(float)) == cudaSuccess, "cudaMallocHost");
  for (int i = 0; i < n; ++i) pinned[i] = 1.0f;
  comm.allreduce(pinned, pinned, n, shardopt::DType::f32, shardopt::ReduceOp::sum);
  check(pinned[0] == static_cast<float>(comm.size()) && pinned[n - 1] == comm.size(),
        "pinned host memory is accepted and reduced");

  cudaFreeHost(pinned);
  cudaFree(dev);
  std::printf("gpu memory: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
