// shardopt: the checkpoint file format (internal part; the public part is in
// include/shardopt/checkpoint.hpp, the specification in
// docs/checkpoint-format.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardopt/checkpoint.hpp"

namespace shardopt::ckpt::detail {

// Metadata keys (docs/checkpoint-format.md).
inline constexpr const char* kKeyFormatVersion = "shardopt.format_version";
inline constexpr const char* kKeyVersion = "shardopt.version";
inline constexpr const char* kKeyChunkBytes = "shardopt.chunk_bytes";
inline constexpr const char* kKeyChecksum = "shardopt.checksum";
inline constexpr const char* kChecksumName = "xxh3-64";
// Followed by the tensor's name: its chunk checksums, 16 lowercase hex
// digits each, concatenated in chunk order.
inline constexpr const char* kKeyChunksPrefix = "shardopt.xxh3.";

// The number of checksum chunks of a tensor of `bytes` bytes.
inline std::uint64_t chunk_count(std::uint64_t bytes, std::uint64_t chunk_bytes) noexcept {
  return chunk_bytes == 0 ? 0 : bytes / chunk_bytes + (bytes % chunk_bytes != 0 ? 1 : 0);
}

// A checksum as written in the header: 16 lowercase hex digits, most
// significant first ("%016llx").
std::string checksum_hex(std::uint64_t value);
// The inverse of checksum_hex: false unless `hex` is exactly 16 lowercase
// hex digits.
bool parse_checksum_hex(std::string_view hex, std::uint64_t& value) noexcept;
// A decimal metadata value ("1048576"): false unless `text` is one or more
// ASCII digits whose value fits in 64 bits.
bool parse_decimal(std::string_view text, std::uint64_t& value) noexcept;
// Whether build_header writes `key` itself (kKeyChunkBytes, kKeyChecksum,
// kKeyChunksPrefix...): such keys may not be passed in its metadata.
bool is_reserved_key(std::string_view key) noexcept;

// The file's first data_start bytes: the 8-byte little-endian length N, then
// N bytes of JSON padded with spaces so that the data section starts at a
// multiple of 8. The tensors are laid out back to back in the order given:
// build_header sets each one's begin and end. It writes the metadata given
// (every value a string) and, when chunk_bytes > 0, kKeyChunkBytes,
// kKeyChecksum and one kKeyChunksPrefix key per tensor from its `chunks`,
// which must then hold chunk_count(bytes, chunk_bytes) values (the header's
// length does not depend on their values, so it can be built before the
// checksums are known and rebuilt after with the same length). The JSON
// lists the tensors in file order, then "__metadata__". Throws
// InvalidArgument for a dtype or shape safetensors cannot express, a wrong
// number of checksums, a duplicate tensor name, a reserved metadata key
// (is_reserved_key), text that is not UTF-8, or a header over
// kMaxHeaderBytes.
std::string build_header(std::vector<TensorInfo>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         std::uint64_t chunk_bytes);

}  // namespace shardopt::ckpt::detail

// The texts and checks the header's parser (format.cpp) and writer
// (header_writer.cpp) share.
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
