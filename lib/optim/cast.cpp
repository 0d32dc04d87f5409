// shardopt::cast: the checks of the buffers and types, then the cast kernel
// where the buffers live (kernels/cast.hpp).
#include "shardopt/cast.hpp"

#include <cstdint>
#include <string>

#include "kernels/cast.hpp"
#include "step_checks.hpp"

namespace shardopt {

namespace {

constexpr const char* kWhat = "cast";

std::string type_text(DType t) {
  return is_valid(t) ? std::string(dtype_name(t))
                     : "the value " + std::to_string(static_cast<int>(t)) + " (not a DType)";
}

void check_type(const char* which, DType t) {
  if (!kernels::is_cast_type(t)) {
    detail::bad_buffer(kWhat,
                       std::string(which) + " is " + type_text(t) +
                           ": casts convert between f32, bf16 and f16 only",
                       "pass DType::f32, DType::bf16 or DType::f16");
  }
}

// The byte ranges [src, src + n * src_size) and [dst, ...) may only meet as
// the same buffer of a same-size type, which every kernel converts in place.
void check_overlap(const void* src, DType src_type, const void* dst, DType dst_type,
                   std::size_t n) {
  const std::size_t src_bytes = n * dtype_size(src_type), dst_bytes = n * dtype_size(dst_type);
  const auto s = reinterpret_cast<std::uintptr_t>(src), d = reinterpret_cast<std::uintptr_t>(dst);
  const bool overlap = s < d + dst_bytes && d < s + src_bytes;
  if (overlap && !(s == d && src_bytes == dst_bytes)) {
    detail::bad_buffer(kWhat,
                       "src (" + std::to_string(src_bytes) + " bytes of " + dtype_name(src_type) +
                           ") and dst (" + std::to_string(dst_bytes) + " bytes of " +
                           dtype_name(dst_type) + ") overlap",
                       "cast into a separate buffer; only a cast between types of the same size "
                       "(bf16 <-> f16) may convert in place, with src == dst");
  }
}

}  // namespace

void cast(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, void* stream) {
  check_type("src_type", src_type);
  check_type("dst_type", dst_type);
  if (n == 0) return;
  if (src == nullptr)
    detail::bad_buffer(kWhat, "src is null with n = " + std::to_string(n),
                       "pass a buffer of n elements, or n = 0");
  if (dst == nullptr)
    detail::bad_buffer(kWhat, "dst is null with n = " + std::to_string(n),
                       "pass a buffer of n elements, or n = 0");
  check_overlap(src, src_type, dst, dst_type, n);
  const detail::MemoryLocation where =
      detail::common_location(kWhat, {{"src", src}, {"dst", dst}},
                              "copy the buffer to the other memory first (cudaMemcpy), then "
                              "cast with both buffers in the same memory");
  detail::run_at(
      kWhat, where, [&] { kernels::cpu::cast(src, src_type, dst, dst_type, n); },
      [&] {
        detail::device_kernel(
            kWhat, stream, [&] { kernels::cuda::cast(src, src_type, dst, dst_type, n, stream); },
            [&](const detail::Translate& tr) {
              kernels::cpu::cast(detail::translated(src, tr), src_type, detail::translated(dst, tr),
                                 dst_type, n);
            });
      });
}

namespace detail {

void cast_sized(const void* src, DType src_type, std::size_t src_size, void* dst, DType dst_type,
                std::size_t dst_size, void* stream) {
  if (src_size != dst_size) {
    bad_buffer(
        kWhat,
        "src has " + std::to_string(src_size) + " elements, dst has " + std::to_string(dst_size),
        "pass a destination as long as the source (a subspan converts part of a buffer)");
  }
  cast(src, src_type, dst, dst_type, src_size, stream);
}

}  // namespace detail

}  // namespace shardopt
