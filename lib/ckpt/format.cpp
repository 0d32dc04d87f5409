// shardopt: the checkpoint file format: dtypes, checksums, and the header's
// validating parser (docs/checkpoint-format.md); its writer is
// header_writer.cpp.
#include "ckpt/format.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "common/check.hpp"

namespace shardopt::ckpt {

using namespace text;

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// A valid header nests 3 levels deep (tensor entry, shape array, dims); the
// limit only stops pathological inputs from exhausting memory.
constexpr int kMaxNesting = 64;

constexpr const char* kHintRewrite =
    "the file is damaged or was not written by a safetensors writer; write it again or restore "
    "a good copy";

struct DtypeEntry {
  const char* name;
  std::size_t bytes;
};
constexpr DtypeEntry kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
};

// A JSON value that is a non-negative integer (nlohmann stores non-negative
// literals as unsigned; "-0" comes as a signed zero).
bool as_u64(const Json& v, std::uint64_t& out) noexcept {
  if (v.is_number_unsigned()) {
    out = v.get<std::uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<std::int64_t>() == 0) {
    out = 0;
    return true;
  }
  return false;
}

// "[1, 2.5]" and the like: a JSON value as it appears in the file, cut.
std::string json_text(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > kMaxQuoted) s = s.substr(0, kMaxQuoted) + "...";
  return s;
}

// Tracks every object's keys while nlohmann parses, so that a duplicate
// key (which nlohmann would silently resolve) is reported, and keeps the
// order of the top-level keys (the tensors' order in the file).
class KeyTracker {
 public:
  bool on_event(int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxNesting)
          SHARDOPT_THROW(checkpoint,
                         "checkpoint header: JSON values nested more than " +
                             std::to_string(kMaxNesting) + " levels deep",
                         kHintRewrite);
        if (event == Json::parse_event_t::object_start) {
          Frame f;
          if (!frames_.empty()) f.parent = frames_.back().last_key;
          frames_.push_back(std::move(f));
        }
        break;
      case Json::parse_event_t::object_end:
        if (frames_.size() == 1) top_keys_ = std::move(frames_.back().keys);
        frames_.pop_back();
        break;
      case Json::parse_event_t::key: {
        Frame& f = frames_.back();
        f.last_key = parsed.get<std::string>();
        const std::size_t index = f.keys.size();
        if (!f.keys.emplace(f.last_key, index).second) {
          if (frames_.size() == 1)
            SHARDOPT_THROW(checkpoint,
                           "checkpoint header: " +
                               (f.last_key == kMetadataKey ? std::string("\"__metadata__\"")
                                                           : tensor_label(f.last_key)) +
                               " appears twice",
                           "every tensor name must be unique; " + std::string(kHintRewrite));
          SHARDOPT_THROW(checkpoint,
                         "checkpoint header: key " + quote(f.last_key) + " appears twice in " +
                             (frames_.size() == 2 && f.parent != kMetadataKey
                                  ? "the entry of " + tensor_label(f.parent)
                                  : "the object under " + quote(f.parent)),
                         kHintRewrite);
        }
        break;
      }
      default:
        break;
    }
    return true;
  }

  // Position of each top-level key in the file.
  const std::unordered_map<std::string, std::size_t>& top_keys() const noexcept {
    return top_keys_;
  }

 private:
  struct Frame {
    std::string parent;  // the key this object is the value of
    std::string last_key;
    std::unordered_map<std::string, std::size_t> keys;
  };
  std::vector<Frame> frames_;
  std::unordered_map<std::string, std::size_t> top_keys_;
};

// "0x7b": one byte, for messages.
std::string byte_text(char c) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto b = static_cast<unsigned char>(c);
  return std::string("0x") + kDigits[b >> 4] + kDigits[b & 0xf];
}

// Why a header that does not start with '{' is rejected: valid JSON of
// another kind, an object after whitespace, or not JSON at all.
std::string bad_start_message(std::string_view json) {
  if (json.empty()) return "checkpoint header is empty (length 0)";
  // accept() validates without building values, so this costs little even
  // for a large or deeply nested header.
  if (Json::accept(json.begin(), json.end(), /*ignore_comments=*/false)) {
    const char c = json[json.find_first_not_of(" \t\r\n")];
    if (c == '{')
      return "checkpoint header has whitespace before its '{' (first byte " +
             byte_text(json.front()) + "); a header must start with '{'";
    const char* kind = c == '['                 ? "an array"
                       : c == '"'               ? "a string"
                       : c == 'n'               ? "null"
                       : (c == 't' || c == 'f') ? "a boolean"
                                                : "a number";
    return std::string("checkpoint header is ") + kind + ", not a JSON object";
  }
  return "checkpoint header does not start with '{' (first byte " + byte_text(json.front()) +
         ") and is not JSON";
}

TensorInfo parse_tensor(const std::string& name, const Json& entry) {
  const std::string label = tensor_label(name);
  if (!entry.is_object())
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header: the entry of " + label + " is a JSON " + entry.type_name() +
                       ", not an object with dtype, shape and data_offsets",
                   kHintRewrite);
  for (const char* field : {kFieldDtype, kFieldShape, kFieldOffsets})
    if (!entry.contains(field))
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: the entry of " + label + " has no \"" + field + "\" field",
                     "each tensor needs \"dtype\", \"shape\" and \"data_offsets\"; " +
                         std::string(kHintRewrite));
  for (const auto& item : entry.items())
    if (item.key() != kFieldDtype && item.key() != kFieldShape && item.key() != kFieldOffsets)
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: the entry of " + label + " has an unknown field " +
                         quote(item.key()) + " (only dtype, shape and data_offsets are allowed)",
                     kHintRewrite);

  TensorInfo t;
  t.name = name;
  const Json& dtype = entry[kFieldDtype];
  if (!dtype.is_string())
    SHARDOPT_THROW(
        checkpoint,
        "checkpoint header: the dtype of " + label + " is " + json_text(dtype) + ", not a string",
        kHintRewrite);
  t.dtype = dtype.get<std::string>();
  const std::size_t elem = dtype_bytes(t.dtype);
  if (elem == 0)
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header: " + label + " has unknown dtype " + quote(t.dtype),
                   "known dtypes: BOOL U8 I8 F8_E4M3 F8_E5M2 I16 U16 F16 BF16 I32 U32 F32 I64 U64 "
                   "F64; " +
                       std::string(kHintRewrite));

  const Json& shape = entry[kFieldShape];
  if (!shape.is_array())
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header: the shape of " + label + " is " + json_text(shape) +
                       ", not an array of dimensions",
                   kHintRewrite);
  std::uint64_t numel = 1;
  bool numel_overflow = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::uint64_t d = 0;
    if (!as_u64(shape[i], d))
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: dimension " + std::to_string(i) + " of the shape of " +
                         label + " is " + json_text(shape[i]) +
                         ", not a non-negative integer (shape " + json_text(shape) + ")",
                     kHintRewrite);
    t.shape.push_back(d);
    if (!numel_overflow && !mul_u64(numel, d, numel)) numel_overflow = true;
  }
  std::uint64_t nbytes = 0;
  // A zero dimension makes the product 0 whatever the others are.
  if (std::find(t.shape.begin(), t.shape.end(), std::uint64_t{0}) != t.shape.end()) {
    numel = 0;
    numel_overflow = false;
  }
  if (numel_overflow || !mul_u64(numel, elem, nbytes))
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header: " + label + " of shape " + shape_text(t.shape) +
                       " and dtype " + t.dtype + " has more than 2^64 bytes",
                   kHintRewrite);

  const Json& offsets = entry[kFieldOffsets];
  std::uint64_t begin = 0, end = 0;
  if (!offsets.is_array() || offsets.size() != 2 || !as_u64(offsets[0], begin) ||
      !as_u64(offsets[1], end))
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header: the data_offsets of " + label + " are " +
                       json_text(offsets) + ", not two non-negative integers [begin, end]",
                   kHintRewrite);
  if (begin > end)
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header: the data_offsets of " + label + " are [" +
                       std::to_string(begin) + ", " + std::to_string(end) + "]: begin is after end",
                   kHintRewrite);
  t.begin = begin;
  t.end = end;
  if (end - begin != nbytes)
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header: " + label + " has data_offsets [" + std::to_string(begin) +
                       ", " + std::to_string(end) + "] (" + std::to_string(end - begin) +
                       " bytes) but shape " + shape_text(t.shape) + " and dtype " + t.dtype +
                       " need " + std::to_string(nbytes) + " bytes",
                   kHintRewrite);
  return t;
}

// Decodes a tensor's checksum string into t.chunks.
void decode_chunks(TensorInfo& t, const std::string& key, const std::string& value,
                   std::uint64_t chunk_bytes) {
  const std::uint64_t n = detail::chunk_count(t.bytes(), chunk_bytes);
  if (value.size() % 16 != 0 || value.size() / 16 != n)
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header: metadata " + quote(key) + " has " +
                       std::to_string(value.size()) + " characters; " + tensor_label(t.name) +
                       " of " + std::to_string(t.bytes()) + " bytes has " + count_text(n, "chunk") +
                       " of at most " + std::to_string(chunk_bytes) +
                       " bytes, so 16 hex digits per chunk are expected",
                   kHintRewrite);
  t.chunks.resize(n);
  for (std::uint64_t k = 0; k < n; ++k)
    if (!detail::parse_checksum_hex(std::string_view(value).substr(k * 16, 16), t.chunks[k]))
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: metadata " + quote(key) + ": the checksum of chunk " +
                         std::to_string(k) + " is " + quote(value.substr(k * 16, 16)) +
                         ", not 16 lowercase hex digits",
                     kHintRewrite);
}

void check_metadata(Header& h) {
  const auto& md = h.metadata;
  const std::string prefix = detail::kKeyChunksPrefix;

  if (auto it = md.find(detail::kKeyFormatVersion); it != md.end()) {
    std::uint64_t v = 0;
    if (!detail::parse_decimal(it->second, v) ||
        v > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
      SHARDOPT_THROW(checkpoint,
                     std::string("checkpoint header: metadata \"") + detail::kKeyFormatVersion +
                         "\" is " + quote(it->second) + ", not a decimal integer",
                     kHintRewrite);
    if (v > static_cast<std::uint64_t>(kFormatVersion))
      SHARDOPT_THROW(checkpoint,
                     "written by a newer shardopt: format version " + std::to_string(v) +
                         ", this build reads up to " + std::to_string(kFormatVersion),
                     "use a newer shardopt to read this file");
    h.format_version = static_cast<int>(v);
  }

  std::uint64_t chunk_bytes = 0;
  const auto cb = md.find(detail::kKeyChunkBytes);
  if (cb != md.end() && (!detail::parse_decimal(cb->second, chunk_bytes) || chunk_bytes == 0))
    SHARDOPT_THROW(checkpoint,
                   std::string("checkpoint header: metadata \"") + detail::kKeyChunkBytes +
                       "\" is " + quote(cb->second) + ", not a positive decimal integer",
                   kHintRewrite);

  const auto cs = md.find(detail::kKeyChecksum);
  if (cs != md.end()) {
    if (cs->second != detail::kChecksumName)
      SHARDOPT_THROW(checkpoint,
                     std::string("checkpoint header: metadata \"") + detail::kKeyChecksum +
                         "\" is " + quote(cs->second) + "; this build knows only \"" +
                         detail::kChecksumName + "\"",
                     "use a newer shardopt, or the file is damaged: write it again");
    if (cb == md.end())
      SHARDOPT_THROW(checkpoint,
                     std::string("checkpoint header: metadata \"") + detail::kKeyChecksum +
                         "\" is present but \"" + detail::kKeyChunkBytes + "\" is missing",
                     kHintRewrite);
    h.chunk_bytes = chunk_bytes;
  }

  // Every checksum key names an existing tensor; without "shardopt.checksum"
  // there must be none.
  std::unordered_map<std::string_view, TensorInfo*> by_name;
  by_name.reserve(h.tensors.size());
  for (auto& t : h.tensors) by_name.emplace(t.name, &t);
  for (auto it = md.lower_bound(prefix); it != md.end() && it->first.starts_with(prefix); ++it) {
    const std::string_view name = std::string_view(it->first).substr(prefix.size());
    if (!by_name.contains(name))
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: metadata " + quote(it->first) +
                         " holds checksums of a tensor the file does not have",
                     kHintRewrite);
    if (cs == md.end())
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: metadata " + quote(it->first) + " is present but \"" +
                         detail::kKeyChecksum + "\" is missing",
                     kHintRewrite);
  }
  if (cs == md.end()) return;
  for (auto& t : h.tensors) {
    const std::string key = prefix + t.name;
    const auto it = md.find(key);
    if (it == md.end())
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: the file has checksums but no metadata " + quote(key) +
                         " for " + tensor_label(t.name),
                     kHintRewrite);
    decode_chunks(t, key, it->second, h.chunk_bytes);
  }
}

}  // namespace

std::size_t dtype_bytes(std::string_view dtype) noexcept {
  for (const auto& d : kDtypes)
    if (dtype == d.name) return d.bytes;
  return 0;
}

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
  }
  return "?";
}

std::uint64_t checksum(const void* data, std::size_t bytes) noexcept {
  return XXH3_64bits(data, bytes);
}

const TensorInfo* Header::find(std::string_view name) const noexcept {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parse_header(std::string_view json, std::uint64_t file_bytes) {
  Header h;
  h.header_bytes = json.size();
  h.data_start = 8 + static_cast<std::uint64_t>(json.size());
  h.file_bytes = file_bytes;
  if (h.header_bytes > kMaxHeaderBytes)
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header of " + std::to_string(h.header_bytes) +
                       " bytes is larger than the limit of " + std::to_string(kMaxHeaderBytes) +
                       " bytes",
                   "the length at the start of the file is damaged, or the file is not a "
                   "safetensors file; write it again or restore a good copy");
  if (file_bytes < h.data_start)
    SHARDOPT_THROW(checkpoint,
                   "checkpoint header runs past the end of the file: 8 + " +
                       std::to_string(h.header_bytes) + " = " + std::to_string(h.data_start) +
                       " bytes, but the file has " + std::to_string(file_bytes) + " bytes",
                   "the file is truncated (an interrupted copy?) or not a safetensors file; "
                   "write it again or restore a good copy");
  if (json.empty() || json.front() != '{')
    SHARDOPT_THROW(checkpoint, bad_start_message(json),
                   "this is not a safetensors file, or its start is damaged; write it again or "
                   "restore a good copy");

  // nlohmann's lexer takes a NUL byte for the end of the input, so that
  // "{}\0anything" would parse; no valid header has one.
  if (const auto nul = json.find('\0'); nul != std::string_view::npos)
    SHARDOPT_THROW(
        checkpoint,
        "checkpoint header is not valid JSON: a NUL byte at offset " + std::to_string(nul),
        kHintRewrite);

  KeyTracker keys;
  Json root;
  try {
    root = Json::parse(
        json.begin(), json.end(),
        [&keys](int depth, Json::parse_event_t event, Json& parsed) {
          return keys.on_event(depth, event, parsed);
        },
        /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    SHARDOPT_THROW(checkpoint, std::string("checkpoint header is not valid JSON: ") + e.what(),
                   kHintRewrite);
  }
  if (!root.is_object())
    SHARDOPT_THROW(
        checkpoint,
        std::string("checkpoint header is a JSON ") + root.type_name() + ", not an object",
        kHintRewrite);

  for (const auto& item : root.items()) {
    if (item.key() == kMetadataKey) {
      const Json& md = item.value();
      if (!md.is_object())
        SHARDOPT_THROW(checkpoint,
                       std::string("checkpoint header: \"__metadata__\" is a JSON ") +
                           md.type_name() + ", not an object of strings",
                       kHintRewrite);
      for (const auto& kv : md.items()) {
        if (!kv.value().is_string())
          SHARDOPT_THROW(checkpoint,
                         "checkpoint header: metadata " + quote(kv.key()) + " is " +
                             json_text(kv.value()) + ", a JSON " + kv.value().type_name() +
                             "; every metadata value must be a string",
                         kHintRewrite);
        h.metadata.emplace(kv.key(), kv.value().get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(item.key(), item.value()));
  }

  // File order: by offset; tensors of 0 bytes at the same offset keep their
  // order in the JSON.
  const auto& order = keys.top_keys();
  auto pos = [&order](const TensorInfo& t) {
    const auto it = order.find(t.name);
    return it == order.end() ? std::size_t{0} : it->second;
  };
  std::sort(h.tensors.begin(), h.tensors.end(), [&](const TensorInfo& a, const TensorInfo& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return pos(a) < pos(b);
  });

  const std::uint64_t data_bytes = file_bytes - h.data_start;
  std::uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.end > data_bytes)
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: " + tensor_label(t.name) + " has data_offsets [" +
                         std::to_string(t.begin) + ", " + std::to_string(t.end) +
                         "] past the end of the data section (" + std::to_string(data_bytes) +
                         " bytes: the file has " + std::to_string(file_bytes) +
                         " bytes, the data starts at byte " + std::to_string(h.data_start) + ")",
                     "the file is truncated (an interrupted copy?) or damaged; write it again or "
                     "restore a good copy");
    if (t.begin < cursor)
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: " + tensor_label(prev->name) + " [" +
                         std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ") and " +
                         tensor_label(t.name) + " [" + std::to_string(t.begin) + ", " +
                         std::to_string(t.end) + ") overlap",
                     kHintRewrite);
    if (t.begin > cursor)
      SHARDOPT_THROW(checkpoint,
                     "checkpoint header: a gap of " + count_text(t.begin - cursor, "byte") + " [" +
                         std::to_string(cursor) + ", " + std::to_string(t.begin) + ") " +
                         (prev ? "between " + tensor_label(prev->name) + " and "
                               : std::string("before the first tensor, ")) +
                         tensor_label(t.name) + " in the data section",
                     kHintRewrite);
    cursor = t.end;
    prev = &t;
  }
  if (cursor != data_bytes)
    SHARDOPT_THROW(
        checkpoint,
        "checkpoint header: " + count_text(data_bytes - cursor, "trailing byte") + " [" +
            std::to_string(cursor) + ", " + std::to_string(data_bytes) + ") after " +
            (prev ? "the last tensor, " + tensor_label(prev->name) + "," + " in the data section"
                  : std::string("the header, and the file has no tensors")),
        "the file was appended to or damaged; write it again or restore a good copy");

  check_metadata(h);
  return h;
}

}  // namespace shardopt::ckpt
