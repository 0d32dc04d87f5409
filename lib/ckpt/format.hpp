// shardopt: the checkpoint file format (internal part; the public part is in
// include/shardopt/checkpoint.hpp, the specification in
// docs/checkpoint-format.md).
#pragma once

#include <cstdint>
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
