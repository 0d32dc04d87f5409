// shardopt: the checkpoint header's writer and the number texts of the
// format (docs/checkpoint-format.md); the parser is format.cpp.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "ckpt/format.hpp"
#include "common/check.hpp"

namespace shardopt::ckpt {

using namespace text;

namespace {
using OrderedJson = nlohmann::ordered_json;
}  // namespace

namespace detail {

std::string checksum_hex(std::uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[static_cast<std::size_t>(i)] = kDigits[value & 0xf];
    value >>= 4;
  }
  return s;
}

bool parse_checksum_hex(std::string_view hex, std::uint64_t& value) noexcept {
  if (hex.size() != 16) return false;
  std::uint64_t v = 0;
  for (const char c : hex) {
    std::uint64_t d = 0;
    if (c >= '0' && c <= '9')
      d = static_cast<std::uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<std::uint64_t>(c - 'a' + 10);
    else
      return false;
    v = (v << 4) | d;
  }
  value = v;
  return true;
}

bool parse_decimal(std::string_view text, std::uint64_t& value) noexcept {
  if (text.empty()) return false;
  std::uint64_t v = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  value = v;
  return true;
}

bool is_reserved_key(std::string_view key) noexcept {
  return key == kKeyChunkBytes || key == kKeyChecksum || key.starts_with(kKeyChunksPrefix);
}

std::string build_header(std::vector<TensorInfo>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         std::uint64_t chunk_bytes) {
  // Each name and value is serialized by nlohmann and the pieces joined in
  // order (rather than built as one ordered_json, whose inserts search every
  // key), so that the cost is linear in the number of tensors.
  auto dump = [](const auto& value, const std::string& what) {
    try {
      return value.dump(-1, ' ', false, OrderedJson::error_handler_t::strict);
    } catch (const OrderedJson::exception&) {
      SHARDOPT_THROW(invalid_argument, what + " is not valid UTF-8",
                     "names and metadata of a checkpoint must be UTF-8 text");
    }
  };

  std::unordered_map<std::string_view, std::size_t> seen;
  seen.reserve(tensors.size());
  std::string json = "{";
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    TensorInfo& t = tensors[i];
    const std::string label = tensor_label(t.name);
    if (t.name == kMetadataKey)
      SHARDOPT_THROW(invalid_argument, "a tensor cannot be called \"__metadata__\"",
                     "rename the tensor: safetensors reserves that key for the metadata");
    if (!seen.emplace(t.name, i).second)
      SHARDOPT_THROW(invalid_argument,
                     label + " is given twice (tensors " + std::to_string(seen[t.name]) + " and " +
                         std::to_string(i) + ")",
                     "give every tensor of a file a unique name");
    const std::size_t elem = dtype_bytes(t.dtype);
    if (elem == 0)
      SHARDOPT_THROW(invalid_argument, label + " has unknown dtype " + quote(t.dtype),
                     "use a safetensors dtype name: F32, F64, BF16, F16, I32, I64, U8, ... "
                     "(ckpt::dtype_name gives the one of a DType)");
    std::uint64_t numel = 1, nbytes = 0;
    bool overflow = false;
    for (const auto d : t.shape) overflow = overflow || !mul_u64(numel, d, numel);
    if (std::find(t.shape.begin(), t.shape.end(), std::uint64_t{0}) != t.shape.end()) {
      numel = 0;
      overflow = false;
    }
    if (overflow || !mul_u64(numel, elem, nbytes) ||
        nbytes > std::numeric_limits<std::uint64_t>::max() - cursor)
      SHARDOPT_THROW(invalid_argument,
                     label + " of shape " + shape_text(t.shape) + " and dtype " + t.dtype +
                         " does not fit in a file (more than 2^64 bytes)",
                     "check the tensor's shape");
    if (chunk_bytes > 0 && t.chunks.size() != chunk_count(nbytes, chunk_bytes))
      SHARDOPT_THROW(invalid_argument,
                     label + " has " + std::to_string(t.chunks.size()) + " checksums, but its " +
                         std::to_string(nbytes) + " bytes make " +
                         std::to_string(chunk_count(nbytes, chunk_bytes)) + " chunks of " +
                         std::to_string(chunk_bytes) + " bytes",
                     "give one checksum per chunk (ckpt::detail::chunk_count), or placeholders "
                     "while sizing the header");
    t.begin = cursor;
    t.end = cursor + nbytes;
    cursor = t.end;

    OrderedJson entry = OrderedJson::object();
    entry[kFieldDtype] = t.dtype;
    entry[kFieldShape] = t.shape;
    entry[kFieldOffsets] = {t.begin, t.end};
    if (i) json += ',';
    json += dump(OrderedJson(t.name), "the name of tensor " + std::to_string(i));
    json += ':';
    json += dump(entry, label);
  }

  // The metadata: the caller's keys (sorted), then the checksum keys.
  json += tensors.empty() ? "\"__metadata__\":{" : ",\"__metadata__\":{";
  bool first = true;
  auto add = [&](const std::string& key, const std::string& value) {
    if (!first) json += ',';
    first = false;
    json += dump(OrderedJson(key), "metadata key " + quote(key));
    json += ':';
    json += dump(OrderedJson(value), "the value of metadata " + quote(key));
  };
  for (const auto& [key, value] : metadata) {
    if (is_reserved_key(key))
      SHARDOPT_THROW(invalid_argument,
                     "metadata key " + quote(key) + " is reserved for the checksums",
                     "leave it out: the writer adds the checksum keys itself from chunk_bytes "
                     "and the tensors' chunks");
    add(key, value);
  }
  if (chunk_bytes > 0) {
    add(kKeyChecksum, kChecksumName);
    add(kKeyChunkBytes, std::to_string(chunk_bytes));
    for (const auto& t : tensors) {
      std::string hex;
      hex.reserve(16 * t.chunks.size());
      for (const auto c : t.chunks) hex += checksum_hex(c);
      add(kKeyChunksPrefix + t.name, hex);
    }
  }
  json += '}';
  json += '}';
  // Pad so that the data section starts at a multiple of 8.
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxHeaderBytes)
    SHARDOPT_THROW(invalid_argument,
                   "the header would be " + std::to_string(json.size()) + " bytes, more than the " +
                       std::to_string(kMaxHeaderBytes) + " bytes safetensors readers accept",
                   "write fewer tensors per file, or use a larger checksum chunk");

  std::string out(8, '\0');
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) {
    out[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
    n >>= 8;
  }
  out += json;
  return out;
}

}  // namespace detail
}  // namespace shardopt::ckpt
