// shardopt: the texts and checks the checkpoint header's parser and writer
// share (internal to lib/ckpt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace shardopt::ckpt::text {

// The header's reserved key and a tensor entry's fields.
inline constexpr const char* kMetadataKey = "__metadata__";
inline constexpr const char* kFieldDtype = "dtype";
inline constexpr const char* kFieldShape = "shape";
inline constexpr const char* kFieldOffsets = "data_offsets";
// Names quoted in messages are cut to this many bytes.
inline constexpr std::size_t kMaxQuoted = 120;

// 'name', cut to kMaxQuoted bytes, for messages.
inline std::string quote(std::string_view s) {
  std::string out = "'";
  if (s.size() > kMaxQuoted) {
    out.append(s.substr(0, kMaxQuoted));
    out += "...";
  } else {
    out.append(s);
  }
  out += "'";
  return out;
}

inline std::string tensor_label(std::string_view name) { return "tensor " + quote(name); }

// "1 byte", "3 bytes".
inline std::string count_text(std::uint64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// a * b, or false on overflow.
inline bool mul_u64(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  out = a * b;
  return true;
}

inline std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace shardopt::ckpt::text
