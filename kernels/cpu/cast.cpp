// The CPU cast: OpenMP slices, each converted by the widest vector unit
// present (kernels/cpu/runner.hpp): AVX-512 or AVX2 through
// kernels/cpu/float_vectors.hpp (f16 by the F16C instructions), the
// x86-64 baseline by the scalar cast_element. Every path gives the
// reference's bits; a same-type cast is a copy.
#include "kernels/cast.hpp"

#include <cstring>
#include <type_traits>

#include "kernels/cpu/float_vectors.hpp"
#include "kernels/cpu/runner.hpp"

namespace shardopt::kernels::cpu {

namespace {

template <class Dst, class Src>
void cast_range(const Src* s, Dst* d, std::size_t begin, std::size_t end) {
  switch (detail::current_isa()) {
#if defined(__x86_64__)
    case detail::Isa::avx512:
      return detail::convert_avx512(s, d, begin, end);
    case detail::Isa::avx2:
      return detail::convert_avx2(s, d, begin, end);
#endif
    default:
      return detail::convert_scalar(s, d, begin, end);
  }
}

}  // namespace

void cast(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n) {
  kernels::detail::with_cast_types(src, src_type, dst, dst_type, [&](const auto* s, auto* d) {
    using Src = std::remove_cvref_t<decltype(*s)>;
    using Dst = std::remove_cvref_t<decltype(*d)>;
    // Slices of whole cache lines of the 16-bit side.
    detail::for_slices(n, 32, [&](std::size_t begin, std::size_t end) {
      if constexpr (std::is_same_v<Src, Dst>) {
        if (static_cast<const void*>(s) != static_cast<const void*>(d) && end > begin)
          std::memcpy(d + begin, s + begin, (end - begin) * sizeof(Dst));
      } else {
        cast_range(s, d, begin, end);
      }
      return true;
    });
  });
}

}  // namespace shardopt::kernels::cpu
