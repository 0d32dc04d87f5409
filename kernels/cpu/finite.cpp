// The CPU finiteness check: OpenMP slices, each scanned by the widest vector
// unit present (kernels/cpu/float_vectors.hpp: the gradients loaded as
// floats, f16 through F16C, multiplied by grad_mul and their exponent bits
// tested), the x86-64 baseline and the tails by scaled_finite. The vector
// multiply is the scalar one lane by lane, so the answer is the reference's.
#include "kernels/finite.hpp"

#include "kernels/cpu/float_vectors.hpp"
#include "kernels/cpu/runner.hpp"

namespace shardopt::kernels::cpu {

namespace {

template <class G>
[[gnu::always_inline]] inline bool finite_scalar(const G* g, float mul, std::size_t begin,
                                                 std::size_t end) {
  unsigned bad = 0;
  for (std::size_t i = begin; i < end; ++i) bad |= !scaled_finite(load_grad(g, i), mul);
  return bad == 0;
}

#if defined(__x86_64__)
template <class G>
SHARDOPT_CPU_TARGET_AVX512 bool finite_avx512(const G* g, float mul, std::size_t begin,
                                              std::size_t end) {
  using V = detail::Avx512;
  const V::Vec m = V::broadcast(mul);
  unsigned bad = 0;
  std::size_t i = begin;
  for (; i + V::width <= end; i += V::width) bad |= V::nonfinite(V::load(g + i), m);
  return bad == 0 && finite_scalar(g, mul, i, end);
}

template <class G>
SHARDOPT_CPU_TARGET_AVX2 bool finite_avx2(const G* g, float mul, std::size_t begin,
                                          std::size_t end) {
  using V = detail::Avx2;
  const V::Vec m = V::broadcast(mul);
  unsigned bad = 0;
  std::size_t i = begin;
  for (; i + V::width <= end; i += V::width) bad |= V::nonfinite(V::load(g + i), m);
  return bad == 0 && finite_scalar(g, mul, i, end);
}
#endif

template <class G>
bool finite_range(const G* g, float mul, std::size_t begin, std::size_t end) {
  switch (detail::current_isa()) {
#if defined(__x86_64__)
    case detail::Isa::avx512:
      return finite_avx512(g, mul, begin, end);
    case detail::Isa::avx2:
      return finite_avx2(g, mul, begin, end);
#endif
    default:
      return finite_scalar(g, mul, begin, end);
  }
}

}  // namespace

bool all_finite(const void* grad, DType grad_type, std::size_t n, float grad_mul) {
  return kernels::with_float_type(grad, grad_type, [&](const auto* g) {
    return detail::for_slices(n, 32, [&](std::size_t begin, std::size_t end) {
      return finite_range(g, grad_mul, begin, end);
    });
  });
}

}  // namespace shardopt::kernels::cpu
