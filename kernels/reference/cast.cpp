// The reference cast: one plain loop of cast_element. It defines the result
// the other kernels must match bitwise.
#include "kernels/cast.hpp"

namespace shardopt::kernels::reference {

void cast(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n) {
  detail::with_cast_types(src, src_type, dst, dst_type, [&](const auto* s, auto* d) {
    using Dst = std::remove_pointer_t<decltype(d)>;
    for (std::size_t i = 0; i < n; ++i) d[i] = cast_element<Dst>(s[i]);
  });
}

}  // namespace shardopt::kernels::reference
