// Casts between f32, bf16 and f16: the reference kernel against independent
// conversions (GCC's _Float16 for f16, a nearest-value search in double for
// bf16), the CPU kernel against the reference bitwise on every vector path,
// size, alignment and thread count, and the checks of shardopt::cast.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cast.hpp"
#include "kernels/cpu/runner.hpp"
#include "optim_helpers.hpp"
#include "shardopt/cast.hpp"

using namespace shardopt;
using namespace shardopt::test;
using kernels::cpu::detail::Isa;

namespace {

constexpr DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// Every vector path this machine has, each run with the kernels limited to
// it; the limit is lifted when the object goes.
struct IsaSweep {
  std::vector<Isa> paths;
  IsaSweep() {
    const Isa best = kernels::cpu::detail::detect_isa();
    for (Isa i : {Isa::baseline, Isa::avx2, Isa::avx512})
      if (i <= best) paths.push_back(i);
  }
  ~IsaSweep() { kernels::cpu::detail::isa_limit() = Isa::avx512; }
  static void use(Isa i) { kernels::cpu::detail::isa_limit() = i; }
  static const char* name(Isa i) {
    return i == Isa::avx512 ? "avx512" : i == Isa::avx2 ? "avx2" : "baseline";
  }
};

// n elements of a type at 64-byte alignment plus `shift` elements, between
// guard bytes that a kernel must not touch.
class Slot {
 public:
  Slot(DType t, std::size_t n, std::size_t shift)
      : size_(dtype_size(t)), n_(n), raw_((n + 4) * size_ + 128, kGuard) {
    const auto base = reinterpret_cast<std::uintptr_t>(raw_.data());
    offset_ = static_cast<std::size_t>((base + 63) / 64 * 64 - base) + 64 + shift * size_;
  }
  void* data() { return raw_.data() + offset_; }
  const void* data() const { return raw_.data() + offset_; }
  std::size_t bytes() const { return n_ * size_; }
  bool guards_intact() const {
    for (std::size_t i = 0; i < raw_.size(); ++i)
      if ((i < offset_ || i >= offset_ + bytes()) && raw_[i] != kGuard) return false;
    return true;
  }
  bool same(const Slot& o) const {
    return bytes() == o.bytes() && std::memcmp(data(), o.data(), bytes()) == 0;
  }

 private:
  static constexpr unsigned char kGuard = 0xa5;
  std::size_t size_, n_, offset_ = 0;
  std::vector<unsigned char> raw_;
};

// Inputs as raw bits: for bf16 and f16 every 16-bit pattern; for f32 the
// special values of all three types (signed zeros, subnormals, the largest
// finite values and the values just past them, exact ties at both parities,
// inf, quiet and signaling NaNs), then random bit patterns and random values
// in the range of f16.
std::vector<std::uint16_t> all_16bit() {
  std::vector<std::uint16_t> v(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) v[b] = static_cast<std::uint16_t>(b);
  return v;
}

std::vector<std::uint32_t> f32_inputs() {
  std::vector<std::uint32_t> v = {
      0x00000000u, 0x80000000u,                            // +-0
      0x00000001u, 0x807fffffu, 0x00400000u,               // f32 subnormals
      0x00010000u, 0x00018000u, 0x00008000u, 0x00028000u,  // bf16 subnormals and ties
      0x7f7f0000u, 0x7f7f7fffu, 0x7f7f8000u, 0xff7f8000u,  // bf16 max, below and at the tie
      0x7f7effffu, 0x7f7e8000u, 0x7f7fffffu, 0xff7fffffu,  // ... f32 max: overflow to inf
      0x7f800000u, 0xff800000u,                            // inf
      0x7fc00000u, 0xffc00000u, 0x7fc00001u, 0xffffffffu,  // quiet NaNs
      0x7f800001u, 0x7fbfffffu, 0x7f802000u, 0x7f801fffu,  // signaling NaNs
      0xff810000u, 0x7f80e000u,
  };
  const auto add = [&](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    v.push_back(u);
    v.push_back(u ^ 0x80000000u);
  };
  // f16: max 65504, the largest value that still rounds to it, the tie that
  // overflows, values past it; the subnormal range and its ties.
  for (float x : {65504.0f, 65519.0f, std::nextafter(65520.0f, 0.0f), 65520.0f,
                  std::nextafter(65520.0f, 1e9f), 65536.0f, 1e5f, std::ldexp(1.0f, -14),
                  std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.5f, -25),
                  std::nextafter(std::ldexp(1.0f, -25), 1.0f), std::ldexp(1.0f, -26),
                  std::ldexp(3.0f, -25), std::ldexp(5.0f, -26)})
    add(x);
  // Exact f16 ties (the midpoint of two neighbours is exact in float) and
  // their float neighbours.
  for (std::uint32_t b = 0; b < 0x7bff; b += 7) {
    const float a = to_float(float16{static_cast<std::uint16_t>(b)});
    const float c = to_float(float16{static_cast<std::uint16_t>(b + 1)});
    const float mid = (a + c) / 2;
    add(mid);
    add(std::nextafter(mid, 0.0f));
    add(std::nextafter(mid, 1e9f));
  }
  // bf16 ties at both parities and their neighbours.
  for (std::uint32_t hi = 0; hi < 65536; hi += 97) {
    v.push_back((hi << 16) | 0x8000u);
    v.push_back((hi << 16) | 0x7fffu);
    v.push_back((hi << 16) | 0x8001u);
  }
  std::mt19937 rng(2024);
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_real_distribution<float> near(-70000.f, 70000.f), tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 60000; ++i) {
    v.push_back(any(rng));
    add(near(rng));
    add(tiny(rng));
  }
  return v;
}

// The inputs of a source type as bytes, and their count.
struct Inputs {
  std::vector<unsigned char> bytes;
  std::size_t n = 0;
};

template <class T>
Inputs as_bytes(const std::vector<T>& v) {
  Inputs in;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  in.bytes.assign(p, p + v.size() * sizeof(T));
  in.n = v.size();
  return in;
}

const Inputs& inputs(DType t) {
  static const Inputs f32 = as_bytes(f32_inputs()), bf16 = as_bytes(all_16bit()),
                      f16 = as_bytes(all_16bit());
  return t == DType::f32 ? f32 : t == DType::bf16 ? bf16 : f16;
}

// n source elements starting at input `first` (wrapping around).
void fill(Slot& s, DType t, std::size_t n, std::size_t first) {
  const Inputs& in = inputs(t);
  const std::size_t size = dtype_size(t);
  auto* out = static_cast<unsigned char*>(s.data());
  for (std::size_t i = 0; i < n; ++i)
    std::memcpy(out + i * size, in.bytes.data() + ((first + i) % in.n) * size, size);
}

// --- Independent conversions --------------------------------------------

// Round-to-nearest-even to bf16 searched in double: the truncation and the
// next value up are the candidates (past the largest finite value the next
// one is inf, at distance 2^128). A NaN keeps its high half with the quiet
// bit set.
std::uint16_t bf16_oracle(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);
  const double dlo = from_bits(static_cast<std::uint32_t>(lo) << 16);
  const float fhi = from_bits(static_cast<std::uint32_t>(hi) << 16);
  const double dhi = std::isinf(fhi) ? std::copysign(std::ldexp(1.0, 128), x) : double(fhi);
  const double elo = std::fabs(double(x) - dlo), ehi = std::fabs(dhi - double(x));
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1) ? hi : lo;
}

// A bf16 value from its fields, in double (exact); a NaN as the float whose
// high half it is.
double bf16_value(std::uint16_t b) {
  const int e = (b >> 7) & 0xff, m = b & 0x7f;
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 0xff)
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : double(from_bits(static_cast<std::uint32_t>(b) << 16));
  if (e == 0) return sign * std::ldexp(double(m), -133);
  return sign * std::ldexp(double(128 + m), e - 134);
}

#if defined(__FLT16_MAX__)
std::uint16_t f16_oracle(double x) {
  // GCC's conversions to _Float16 (libgcc's soft-float code): a double is
  // rounded once; a NaN goes through float (the payload is the same).
  const _Float16 h =
      std::isnan(x) ? static_cast<_Float16>(static_cast<float>(x)) : static_cast<_Float16>(x);
  std::uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float f32_from_f16_oracle(std::uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
#endif

// The bits independent code expects from casting input i of `from` to `to`;
// false when no independent conversion is available for the pair.
bool oracle(DType from, DType to, const unsigned char* in, unsigned char* out) {
  std::uint32_t f = 0;
  std::uint16_t h = 0;
  if (from == DType::f32)
    std::memcpy(&f, in, 4);
  else
    std::memcpy(&h, in, 2);
  if (from == to) {
    std::memcpy(out, in, dtype_size(to));
    return true;
  }
  std::uint32_t want32 = 0;
  std::uint16_t want16 = 0;
  if (from == DType::bf16 && to == DType::f32) {
    // Widening is exact; a NaN keeps its bits (double would quiet it).
    const bool nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
    want32 =
        nan ? static_cast<std::uint32_t>(h) << 16 : test::bits(static_cast<float>(bf16_value(h)));
  } else if (to == DType::bf16) {
    const float x = from == DType::f32 ? from_bits(f) :
#if defined(__FLT16_MAX__)
                                       f32_from_f16_oracle(h);
#else
                                       to_float(float16{h});
#endif
    want16 = bf16_oracle(x);
  } else {
#if defined(__FLT16_MAX__)
    if (to == DType::f32) {
      want32 = test::bits(f32_from_f16_oracle(h));
    } else {
      want16 = f16_oracle(from == DType::f32 ? double(from_bits(f)) : bf16_value(h));
    }
#else
    return false;
#endif
  }
  if (to == DType::f32)
    std::memcpy(out, &want32, 4);
  else
    std::memcpy(out, &want16, 2);
  return true;
}

}  // namespace

TEST_CASE("cast: the reference equals independent conversions for every pair", "[cast]") {
  for (DType from : kTypes) {
    for (DType to : kTypes) {
      const Inputs& in = inputs(from);
      Slot src(from, in.n, 0), got(to, in.n, 0);
      fill(src, from, in.n, 0);
      kernels::reference::cast(src.data(), from, got.data(), to, in.n);
      const std::size_t is = dtype_size(from), os = dtype_size(to);
      std::size_t wrong = 0, compared = 0;
      for (std::size_t i = 0; i < in.n; ++i) {
        unsigned char want[4];
        if (!oracle(from, to, in.bytes.data() + i * is, want)) continue;
        ++compared;
        if (std::memcmp(want, static_cast<const unsigned char*>(got.data()) + i * os, os) != 0) {
          if (wrong < 5) {
            std::uint32_t x = 0, w = 0, g = 0;
            std::memcpy(&x, in.bytes.data() + i * is, is);
            std::memcpy(&w, want, os);
            std::memcpy(&g, static_cast<const unsigned char*>(got.data()) + i * os, os);
            UNSCOPED_INFO(dtype_name(from) << " -> " << dtype_name(to) << ": input 0x" << std::hex
                                           << x << " want 0x" << w << " got 0x" << g);
          }
          ++wrong;
        }
      }
      INFO(dtype_name(from) << " -> " << dtype_name(to) << ", " << compared << " compared");
      CHECK(wrong == 0);
      CHECK(got.guards_intact());
    }
  }
}

TEST_CASE("cast: values worked out by hand", "[cast]") {
  const auto one = [](float x, DType to) {
    std::uint32_t out = 0;
    kernels::reference::cast(&x, DType::f32, &out, to, 1);
    return out;
  };
  CHECK(one(1.0f, DType::bf16) == 0x3f80);
  CHECK(one(65504.0f, DType::f16) == 0x7bff);
  CHECK(one(65520.0f, DType::f16) == 0x7c00);                 // the tie above max: inf
  CHECK(one(-65519.0f, DType::f16) == 0xfbff);                // rounds down to -max
  CHECK(one(from_bits(0x7f7f8000u), DType::bf16) == 0x7f80);  // the tie above max: inf
  CHECK(one(from_bits(0x3f808000u), DType::bf16) == 0x3f80);  // tie to even (down)
  CHECK(one(from_bits(0x3f818000u), DType::bf16) == 0x3f82);  // tie to even (up)
  CHECK(one(std::ldexp(1.0f, -25), DType::f16) == 0x0000);    // tie to even: zero
  CHECK(one(std::ldexp(1.5f, -25), DType::f16) == 0x0001);    // smallest subnormal
  CHECK(one(-std::ldexp(1.0f, -24), DType::f16) == 0x8001);   // a negative subnormal
  CHECK(one(from_bits(0x7f800001u), DType::f16) == 0x7e00);   // sNaN: quiet, payload cut
  CHECK(one(from_bits(0xffc02000u), DType::f16) == 0xfe01);   // sign and top payload kept
  CHECK(one(from_bits(0x7f810000u), DType::bf16) == 0x7fc1);  // sNaN: quiet, high half
  CHECK(one(-INFINITY, DType::bf16) == 0xff80);
  const std::uint16_t snan = 0x7c01;  // f16 sNaN widens to a quiet float NaN
  float wide = 0;
  kernels::reference::cast(&snan, DType::f16, &wide, DType::f32, 1);
  CHECK(test::bits(wide) == 0x7fc02000u);
  const std::uint16_t bsnan = 0x7f81;  // bf16 widens by a shift: the bits stay
  kernels::reference::cast(&bsnan, DType::bf16, &wide, DType::f32, 1);
  CHECK(test::bits(wide) == 0x7f810000u);
}

TEST_CASE("cast: the CPU kernel equals the reference bitwise on every vector path", "[cast]") {
  IsaSweep sweep;
  const int saved = omp_get_max_threads();
  for (DType from : kTypes) {
    for (DType to : kTypes) {
      for (Isa isa : sweep.paths) {
        IsaSweep::use(isa);
        for (int threads : {1, 3}) {
          omp_set_num_threads(threads);
          for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000},
                                std::size_t{65537}, inputs(from).n}) {
            for (std::size_t shift : {0, 1}) {
              Slot src(from, n, shift), want(to, n, shift), got(to, n, shift);
              fill(src, from, n, n * 13 + shift);
              kernels::reference::cast(src.data(), from, want.data(), to, n);
              kernels::cpu::cast(src.data(), from, got.data(), to, n);
              INFO(dtype_name(from) << " -> " << dtype_name(to) << " " << IsaSweep::name(isa)
                                    << " threads " << threads << " n " << n << " shift " << shift);
              CHECK(got.same(want));
              CHECK(got.guards_intact());
              if (dtype_size(from) == dtype_size(to)) {  // in place
                fill(got, from, n, n * 13 + shift);
                kernels::cpu::cast(got.data(), from, got.data(), to, n);
                CHECK(got.same(want));
                CHECK(got.guards_intact());
              }
            }
          }
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("cast: shardopt::cast converts host buffers as the kernels do", "[cast]") {
  const std::vector<float> x = uniform(70001, 5, -100000.f, 100000.f);
  std::vector<bfloat16> b(x.size());
  std::vector<float16> h(x.size());
  std::vector<float> back(x.size());
  cast(x, b);
  cast(std::span<const float>(x), std::span<float16>(h));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    wrong += b[i].bits != bf16_from_float(x[i]).bits || h[i].bits != f16_from_float(x[i]).bits;
  CHECK(wrong == 0);
  cast(b, back);  // exact on the way up
  for (std::size_t i = 0; i < x.size(); ++i)
    wrong += test::bits(back[i]) != test::bits(to_float(b[i]));
  CHECK(wrong == 0);
  // Untyped, in place from f16 to bf16.
  std::vector<std::uint16_t> inplace(h.size());
  std::memcpy(inplace.data(), h.data(), h.size() * 2);
  cast(inplace.data(), DType::f16, inplace.data(), DType::bf16, inplace.size());
  for (std::size_t i = 0; i < h.size(); ++i)
    wrong += inplace[i] != bf16_from_float(to_float(h[i])).bits;
  CHECK(wrong == 0);
  // A same-type cast copies the bits, signaling NaNs included.
  std::vector<float> nans = {from_bits(0x7f800001u), from_bits(0xffa00000u), 1.0f};
  std::vector<float> copy(nans.size());
  cast(nans, copy);
  CHECK(count_diff(nans, copy) == 0);
  cast(nans.data(), DType::f32, nans.data(), DType::f32, nans.size());  // onto itself: no-op
  CHECK(test::bits(nans[0]) == 0x7f800001u);
  cast(static_cast<const void*>(nullptr), DType::f32, nullptr, DType::bf16, 0);  // n = 0: nothing
}

TEST_CASE("cast: bad arguments are rejected and change nothing", "[cast]") {
  std::vector<float> f(16, 1.0f);
  std::vector<bfloat16> b(16, bfloat16{0x1234});
  std::vector<float16> h(8);
  const auto untouched = [&] {
    for (const bfloat16 v : b)
      if (v.bits != 0x1234) return false;
    return count_diff(f, std::vector<float>(16, 1.0f)) == 0;
  };
  CHECK(rejects([&] { cast(nullptr, DType::f32, b.data(), DType::bf16, 4); },
                ErrorCode::invalid_argument, "src is null"));
  CHECK(rejects([&] { cast(f.data(), DType::f32, nullptr, DType::bf16, 4); },
                ErrorCode::invalid_argument, "dst is null"));
  CHECK(
      rejects([&] { cast(f, h); }, ErrorCode::invalid_argument, "src has 16 elements, dst has 8"));
  CHECK(rejects([&] { cast(f.data(), DType::i32, b.data(), DType::bf16, 4); },
                ErrorCode::invalid_argument, "src_type is i32"));
  CHECK(rejects([&] { cast(f.data(), DType::f32, b.data(), DType::f64, 4); },
                ErrorCode::invalid_argument, "dst_type is f64"));
  CHECK(rejects([&] { cast(f.data(), static_cast<DType>(42), b.data(), DType::bf16, 4); },
                ErrorCode::invalid_argument, "not a DType"));
  // Overlap: types of different sizes on one buffer, or a partial overlap.
  CHECK(rejects([&] { cast(f.data(), DType::f32, f.data(), DType::bf16, 8); },
                ErrorCode::invalid_argument, "overlap"));
  CHECK(rejects([&] { cast(f.data(), DType::bf16, f.data(), DType::f32, 8); },
                ErrorCode::invalid_argument, "src (16 bytes of bf16) and dst (32 bytes of f32)"));
  CHECK(rejects([&] { cast(b.data(), DType::bf16, b.data() + 1, DType::f16, 8); },
                ErrorCode::invalid_argument, "overlap"));
  CHECK(rejects([&] { cast(f.data() + 4, DType::f32, f.data(), DType::f32, 8); },
                ErrorCode::invalid_argument, "overlap"));
  CHECK(untouched());
  // Neighbours that only touch do not overlap.
  cast(b.data(), DType::bf16, b.data() + 8, DType::f16, 8);
  CHECK(b[8].bits == f16_from_float(to_float(bfloat16{0x1234})).bits);
}
