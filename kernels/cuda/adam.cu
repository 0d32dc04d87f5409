// The CUDA Adam kernel: one launch over the contiguous range, grid-stride,
// calling the same adam_element as the CPU kernels (built with --fmad=false
// and IEEE division and square root, so the results equal the reference
// kernel's bitwise).
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/adam.hpp"
#include "kernels/adam_loop.hpp"

namespace shardopt::kernels::cuda {

namespace {

template <class G, class O, WeightDecay W, bool Ams>
__global__ void adam_kernel(AdamBuffers b, AdamScalars s, unsigned* any_nonfinite) {
  const G* g = static_cast<const G*>(b.grad);
  O* out = static_cast<O*>(b.param_out);
  bool bad = false;
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < b.n;
       i += stride) {
    float p = b.param[i];
    float m = b.exp_avg[i];
    float v = b.exp_avg_sq[i];
    bad |= !adam_element<W, Ams>(p, load_grad(g, i), m, v, Ams ? b.max_exp_avg_sq + i : nullptr, s);
    b.param[i] = p;
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    if constexpr (!std::is_same_v<O, float>) store_param(out, i, p);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(any_nonfinite, 1u);
}

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("CUDA Adam kernel: ") + what + ": " +
                             cudaGetErrorString(rc));
  }
}

template <class G, class O, WeightDecay W, bool Ams>
bool launch(const AdamBuffers& b, const AdamScalars& s, cudaStream_t stream) {
  unsigned* flag = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&flag), sizeof(unsigned), stream),
        "allocating the non-finite flag");
  check(cudaMemsetAsync(flag, 0, sizeof(unsigned), stream), "clearing the non-finite flag");
  if (b.n > 0) {
    int device = 0, sms = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
          "querying the SM count");
    const int threads = 256;
    const std::size_t needed = (b.n + threads - 1) / threads;
    const int blocks = static_cast<int>(std::min<std::size_t>(needed, std::size_t{8} * sms));
    adam_kernel<G, O, W, Ams><<<blocks, threads, 0, stream>>>(b, s, flag);
    check(cudaGetLastError(), "launching");
  }
  unsigned host_flag = 0;
  check(cudaMemcpyAsync(&host_flag, flag, sizeof host_flag, cudaMemcpyDeviceToHost, stream),
        "reading the non-finite flag");
  check(cudaFreeAsync(flag, stream), "freeing the non-finite flag");
  check(cudaStreamSynchronize(stream), "waiting for the step");
  return host_flag == 0;
}

}  // namespace

bool adam(const AdamBuffers& b, const AdamScalars& s, void* stream) {
  return detail::dispatch_adam(b, s, [&]<class G, class O, WeightDecay W, bool Ams>() {
    return launch<G, O, W, Ams>(b, s, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace shardopt::kernels::cuda
