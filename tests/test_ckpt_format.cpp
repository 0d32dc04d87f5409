// The checkpoint file format: dtypes, checksums, the header writer, and the
// parser's error for each kind of malformed header.
#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ckpt/format.hpp"
#include "mpi_test.hpp"
#include "shardopt/checkpoint.hpp"

using namespace shardopt;
using shardopt::ckpt::Header;
using shardopt::ckpt::TensorInfo;
using shardopt::test::throws_error;

namespace {

const char* const kAllDtypes[] = {"BOOL", "U8",  "I8",  "F8_E4M3", "F8_E5M2", "I16", "U16", "F16",
                                  "BF16", "I32", "U32", "F32",     "I64",     "U64", "F64"};

// Parses `json` as the header of a file whose data section has data_bytes bytes.
Header parse(const std::string& json, std::uint64_t data_bytes) {
  return ckpt::parse_header(json, 8 + json.size() + data_bytes);
}

// Whether parsing `json` (with data_bytes of data) throws a CheckpointError
// whose message contains every needle.
bool rejects(const std::string& json, std::uint64_t data_bytes,
             std::initializer_list<std::string_view> needles) {
  bool ok = true;
  for (const auto needle : needles)
    ok = throws_error<CheckpointError>([&] { parse(json, data_bytes); }, ErrorCode::checkpoint,
                                       needle) &&
         ok;
  return ok;
}

// A tensor entry of a header written by hand.
std::string entry(const std::string& dtype, const std::string& shape, std::uint64_t begin,
                  std::uint64_t end) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// The little-endian u64 at the start of `file`.
std::uint64_t length_prefix(const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

// A built file's JSON part.
std::string json_of(const std::string& file) { return file.substr(8); }

std::uint64_t total_bytes(const std::vector<TensorInfo>& tensors) {
  return tensors.empty() ? 0 : tensors.back().end;
}

// A checksummed header of tensors "a" (F32 [2], 8 bytes) and "b" (U8 [3]),
// with chunks of 4 bytes, then edited by `edit` before parsing.
std::string checksummed_json(const std::map<std::string, std::string>& extra = {}) {
  std::vector<TensorInfo> t(2);
  t[0].name = "a";
  t[0].dtype = "F32";
  t[0].shape = {2};
  t[0].chunks = {0x0123456789abcdefull, 2};
  t[1].name = "b";
  t[1].dtype = "U8";
  t[1].shape = {3};
  t[1].chunks = {3};
  return json_of(ckpt::detail::build_header(t, extra, 4));
}

// `json` with the first `from` replaced by `to`.
std::string replaced(std::string json, const std::string& from, const std::string& to) {
  const auto pos = json.find(from);
  REQUIRE(pos != std::string::npos);
  return json.replace(pos, from.size(), to);
}

}  // namespace

TEST_CASE("ckpt: dtype names and sizes", "[ckpt]") {
  const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  for (const auto& [name, bytes] : sizes) {
    INFO(name);
    CHECK(ckpt::dtype_bytes(name) == bytes);
  }
  for (const char* bad : {"", "f32", "F128", "F32 ", "BFLOAT16", "F8"}) {
    INFO(bad);
    CHECK(ckpt::dtype_bytes(bad) == 0);
  }
  const std::map<DType, std::string> names = {{DType::f32, "F32"},   {DType::f64, "F64"},
                                              {DType::bf16, "BF16"}, {DType::f16, "F16"},
                                              {DType::i32, "I32"},   {DType::i64, "I64"}};
  for (const auto& [t, name] : names) {
    INFO(name);
    CHECK(ckpt::dtype_name(t) == name);
    CHECK(ckpt::dtype_bytes(ckpt::dtype_name(t)) == dtype_size(t));
  }
  CHECK(std::string(ckpt::dtype_name(static_cast<DType>(99))) == "?");
}

TEST_CASE("ckpt: checksums are XXH3-64 with seed 0", "[ckpt]") {
  // The published value for empty input.
  CHECK(XXH3_64bits("", 0) == 0x2d06800538d394c2ull);
  CHECK(ckpt::checksum("", 0) == 0x2d06800538d394c2ull);
  CHECK(ckpt::checksum(nullptr, 0) == 0x2d06800538d394c2ull);

  // Every length class of XXH3 (0-16, 17-128, 129-240, long) against the
  // reference implementation called directly.
  std::mt19937_64 rng(test::data_key(0xc4ec));
  std::vector<unsigned char> data(3 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (std::size_t n :
       {std::size_t{1}, std::size_t{3}, std::size_t{8}, std::size_t{16}, std::size_t{17},
        std::size_t{100}, std::size_t{128}, std::size_t{129}, std::size_t{240}, std::size_t{241},
        std::size_t{1000}, std::size_t{1} << 20, data.size()}) {
    INFO(n);
    CHECK(ckpt::checksum(data.data(), n) == XXH3_64bits(data.data(), n));
    CHECK(ckpt::checksum(data.data() + 1, n - 1) == XXH3_64bits(data.data() + 1, n - 1));
  }
  // Not the seeded or 128-bit variants.
  CHECK(ckpt::checksum(data.data(), 64) != XXH3_64bits_withSeed(data.data(), 64, 1));

  CHECK(ckpt::detail::checksum_hex(0x2d06800538d394c2ull) == "2d06800538d394c2");
  CHECK(ckpt::detail::checksum_hex(0) == "0000000000000000");
  CHECK(ckpt::detail::checksum_hex(~0ull) == "ffffffffffffffff");
  std::uint64_t v = 0;
  CHECK(ckpt::detail::parse_checksum_hex("00000000000000ff", v));
  CHECK(v == 0xff);
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t x = rng();
    CHECK(ckpt::detail::parse_checksum_hex(ckpt::detail::checksum_hex(x), v));
    CHECK(v == x);
  }
  CHECK_FALSE(ckpt::detail::parse_checksum_hex("00000000000000FF", v));
  CHECK_FALSE(ckpt::detail::parse_checksum_hex("00000000000000f", v));
  CHECK_FALSE(ckpt::detail::parse_checksum_hex("00000000000000fff", v));
  CHECK_FALSE(ckpt::detail::parse_checksum_hex("000000000000000g", v));
  CHECK_FALSE(ckpt::detail::parse_checksum_hex("0x00000000000000", v));

  CHECK(ckpt::detail::chunk_count(0, 4) == 0);
  CHECK(ckpt::detail::chunk_count(4, 4) == 1);
  CHECK(ckpt::detail::chunk_count(5, 4) == 2);
  CHECK(ckpt::detail::chunk_count(5, 0) == 0);
  CHECK(ckpt::detail::chunk_count(2, ~0ull) == 1);
  CHECK(ckpt::detail::chunk_count(~0ull, 1) == ~0ull);
}

TEST_CASE("ckpt: decimal metadata values", "[ckpt]") {
  std::uint64_t v = 0;
  CHECK(ckpt::detail::parse_decimal("0", v));
  CHECK(v == 0);
  CHECK(ckpt::detail::parse_decimal("1048576", v));
  CHECK(v == 1048576);
  CHECK(ckpt::detail::parse_decimal("18446744073709551615", v));
  CHECK(v == ~0ull);
  for (const char* bad : {"", "18446744073709551616", "-1", "+1", " 1", "1 ", "1.0", "0x10"}) {
    INFO(bad);
    CHECK_FALSE(ckpt::detail::parse_decimal(bad, v));
  }
}

TEST_CASE("ckpt: build_header then parse_header round-trips random headers", "[ckpt]") {
  std::mt19937_64 rng(test::data_key(0x4e4d));
  auto pick = [&](std::uint64_t n) { return rng() % n; };
  const char* const name_parts[] = {"layer", "w",  "bias", ".", "/", "exp_avg", "é",
                                    "\"q\"", "\\", "\t",   " ", "0", "Ω",       "__x"};
  for (int round = 0; round < 200; ++round) {
    INFO("round " << round);
    std::vector<TensorInfo> tensors(pick(8));
    std::uint64_t chunk_bytes = 0;
    switch (pick(5)) {
      case 1:
        chunk_bytes = 1;
        break;
      case 2:
        chunk_bytes = 3;
        break;
      case 3:
        chunk_bytes = 64;
        break;
      case 4:
        chunk_bytes = ckpt::kDefaultChunkBytes;
        break;
      default:
        break;
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      auto& t = tensors[i];
      t.name = std::to_string(i);  // unique
      for (std::uint64_t k = pick(4); k > 0; --k) t.name += name_parts[pick(std::size(name_parts))];
      t.dtype = kAllDtypes[pick(std::size(kAllDtypes))];
      t.shape.resize(pick(5));
      for (auto& d : t.shape) d = pick(6);
      std::uint64_t nbytes = ckpt::dtype_bytes(t.dtype);
      for (const auto d : t.shape) nbytes *= d;
      t.chunks.resize(ckpt::detail::chunk_count(nbytes, chunk_bytes));
      for (auto& c : t.chunks) c = rng();
      t.begin = t.end = 12345;  // overwritten
    }
    std::map<std::string, std::string> metadata;
    if (pick(2)) {
      metadata["format"] = "pt";
      metadata[ckpt::detail::kKeyFormatVersion] = std::to_string(pick(2));
      metadata[ckpt::detail::kKeyVersion] = "0.1.0";
    }
    for (std::uint64_t k = pick(4); k > 0; --k) {
      std::string key(1, 'k'), value(pick(10), 'v');
      key += std::to_string(pick(100));
      value += name_parts[pick(std::size(name_parts))];
      metadata[key] = value;
    }

    const std::string file = ckpt::detail::build_header(tensors, metadata, chunk_bytes);
    REQUIRE(file.size() >= 8);
    CHECK(file.size() % 8 == 0);
    CHECK(length_prefix(file) == file.size() - 8);
    const std::string json = json_of(file);
    CHECK(json.front() == '{');
    CHECK(json[json.find_last_not_of(' ')] == '}');
    // Back to back in the order given.
    std::uint64_t cursor = 0;
    for (const auto& t : tensors) {
      CHECK(t.begin == cursor);
      cursor = t.end;
    }

    const Header h = ckpt::parse_header(json, file.size() + total_bytes(tensors));
    CHECK(h.header_bytes == json.size());
    CHECK(h.data_start == file.size());
    CHECK(h.file_bytes == file.size() + total_bytes(tensors));
    CHECK(h.chunk_bytes == chunk_bytes);
    CHECK(h.format_version == (metadata.count(ckpt::detail::kKeyFormatVersion)
                                   ? std::stoi(metadata[ckpt::detail::kKeyFormatVersion])
                                   : 0));
    REQUIRE(h.tensors.size() == tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      INFO("tensor " << i);
      CHECK(h.tensors[i].name == tensors[i].name);
      CHECK(h.tensors[i].dtype == tensors[i].dtype);
      CHECK(h.tensors[i].shape == tensors[i].shape);
      CHECK(h.tensors[i].begin == tensors[i].begin);
      CHECK(h.tensors[i].end == tensors[i].end);
      CHECK(h.tensors[i].chunks ==
            (chunk_bytes ? tensors[i].chunks : std::vector<std::uint64_t>{}));
      CHECK(h.find(tensors[i].name) == &h.tensors[i]);
    }
    CHECK(h.find("no such tensor") == nullptr);
    for (const auto& [k, v] : metadata) CHECK(h.metadata.at(k) == v);
    CHECK(h.metadata.size() ==
          metadata.size() + (chunk_bytes ? 2 + tensors.size() : std::size_t{0}));

    // The length does not depend on the checksums' values.
    for (auto& t : tensors)
      for (auto& c : t.chunks) c = 0;
    CHECK(ckpt::detail::build_header(tensors, metadata, chunk_bytes).size() == file.size());
  }
}

TEST_CASE("ckpt: empty tensors at one offset keep their file order", "[ckpt]") {
  std::vector<TensorInfo> t(4);
  const char* names[] = {"z", "a", "m", "b"};
  for (int i = 0; i < 4; ++i) {
    t[i].name = names[i];
    t[i].dtype = "F32";
    t[i].shape = {i == 1 ? 2u : 0u};
  }
  const std::string file = ckpt::detail::build_header(t, {}, 0);
  const Header h = ckpt::parse_header(json_of(file), file.size() + 8);
  REQUIRE(h.tensors.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(h.tensors[i].name == names[i]);
  CHECK(h.tensors[1].begin == 0);
  CHECK(h.tensors[2].begin == 8);
  CHECK(h.tensors[3].begin == 8);
}

TEST_CASE("ckpt: a header from another safetensors writer", "[ckpt]") {
  // Keys in any order, no metadata, no padding, a scalar.
  const std::string json =
      "{\"x\":" + entry("F64", "[]", 8, 16) + ",\"w\":" + entry("BF16", "[2,2]", 0, 8) + "}";
  const Header h = parse(json, 16);
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].name == "w");
  CHECK(h.tensors[1].name == "x");
  CHECK(h.tensors[1].shape.empty());
  CHECK(h.format_version == 0);
  CHECK(h.chunk_bytes == 0);
  CHECK(h.metadata.empty());
  CHECK(parse("{}", 0).tensors.empty());
  CHECK(parse("{\"__metadata__\":{}}   ", 0).tensors.empty());
}

TEST_CASE("ckpt: build_header rejects what safetensors cannot express", "[ckpt]") {
  auto one = [](const std::string& name, const std::string& dtype,
                std::vector<std::uint64_t> shape) {
    std::vector<TensorInfo> t(1);
    t[0].name = name;
    t[0].dtype = dtype;
    t[0].shape = std::move(shape);
    return t;
  };
  auto bad = [](std::vector<TensorInfo> t, const std::map<std::string, std::string>& md,
                std::uint64_t chunk_bytes, std::string_view needle) {
    return throws_error<InvalidArgument>([&] { ckpt::detail::build_header(t, md, chunk_bytes); },
                                         ErrorCode::invalid_argument, needle);
  };
  CHECK(bad(one("w", "F128", {1}), {}, 0, "tensor 'w' has unknown dtype 'F128'"));
  CHECK(bad(one("w", "F32", {1ull << 62, 8}), {}, 0, "more than 2^64 bytes"));
  CHECK(bad(one("w", "F32", {3}), {}, 4, "tensor 'w' has 0 checksums, but its 12 bytes make 3"));
  CHECK(bad(one("__metadata__", "F32", {1}), {}, 0, "\"__metadata__\""));
  CHECK(bad(one("w\xff", "F32", {1}), {}, 0, "not valid UTF-8"));
  CHECK(bad(one("w", "F32", {1}), {{"k", "\xc3"}}, 0, "not valid UTF-8"));
  CHECK(bad(one("w", "F32", {1}), {{"shardopt.chunk_bytes", "8"}}, 0, "reserved"));
  CHECK(bad(one("w", "F32", {1}), {{"shardopt.xxh3.w", ""}}, 0, "reserved"));
  auto two = one("w", "F32", {1});
  two.push_back(two[0]);
  CHECK(bad(two, {}, 0, "tensor 'w' is given twice"));
}

// --- one test per kind of malformed file ------------------------------------

TEST_CASE("ckpt: a header longer than the file", "[ckpt]") {
  const std::string json = "{\"a\":" + entry("U8", "[4]", 0, 4) + "}";
  REQUIRE_NOTHROW(ckpt::parse_header(json, 8 + json.size() + 4));
  CHECK(throws_error<CheckpointError>(
      [&] { ckpt::parse_header(json, 8 + json.size() - 1); }, ErrorCode::checkpoint,
      "runs past the end of the file: 8 + " + std::to_string(json.size())));
  CHECK(throws_error<CheckpointError>([&] { ckpt::parse_header(json, 3); }, ErrorCode::checkpoint,
                                      "the file has 3 bytes"));
  // The data cut short instead: the tensor runs past the end.
  CHECK(rejects(json, 3, {"tensor 'a' has data_offsets [0, 4] past the end of the data section"}));
}

TEST_CASE("ckpt: a header too large", "[ckpt]") {
  const std::string json(ckpt::kMaxHeaderBytes + 1, ' ');
  CHECK(throws_error<CheckpointError>(
      [&] { ckpt::parse_header(json, 8 + json.size()); }, ErrorCode::checkpoint,
      "header of 100000001 bytes is larger than the limit of 100000000 bytes"));
}

TEST_CASE("ckpt: garbage bytes", "[ckpt]") {
  CHECK(rejects(std::string("\x89PNG\r\n\x1a\n\0\0", 10), 0,
                {"does not start with '{' (first byte 0x89)"}));
  CHECK(rejects("", 0, {"header is empty"}));
  CHECK(rejects(std::string("{\"a\":\0}", 7), 0, {"not valid JSON"}));
  CHECK(rejects("{\"k\xff\":1}", 0, {"not valid JSON"}));
}

TEST_CASE("ckpt: malformed JSON", "[ckpt]") {
  CHECK(rejects("{\"a\":{\"dtype\":\"F32\",", 0, {"not valid JSON"}));
  CHECK(rejects("{\"a\":1,}", 0, {"not valid JSON"}));
  CHECK(rejects("{} x", 0, {"not valid JSON"}));
  // nlohmann takes a NUL byte for the end of the input.
  CHECK(rejects(std::string("{}\0\0", 4), 0, {"not valid JSON: a NUL byte at offset 2"}));
  CHECK(rejects(std::string("{}  \0garbage", 12), 0, {"not valid JSON: a NUL byte at offset 4"}));
  CHECK(rejects("{/* c */}", 0, {"not valid JSON"}));
  CHECK(rejects("{\"a\":[1e999]}", 0, {"not valid JSON"}));
  CHECK(rejects("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", 0,
                {"nested more than 64 levels"}));
}

TEST_CASE("ckpt: a header that is not an object", "[ckpt]") {
  CHECK(rejects("[1, 2]", 0, {"header is an array, not a JSON object"}));
  CHECK(rejects("\"text\"", 0, {"header is a string, not a JSON object"}));
  CHECK(rejects("42", 0, {"header is a number, not a JSON object"}));
  CHECK(rejects("null", 0, {"header is null, not a JSON object"}));
  CHECK(rejects(" {}", 0, {"whitespace before its '{'"}));
}

TEST_CASE("ckpt: a tensor entry with a missing, extra or mistyped field", "[ckpt]") {
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1,
                {"the entry of tensor 'a' has no \"data_offsets\" field"}));
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1,
                {"the entry of tensor 'a' has no \"shape\" field"}));
  CHECK(rejects("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                {"the entry of tensor 'a' has no \"dtype\" field"}));
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":0}}", 1,
                {"tensor 'a' has an unknown field 'x'"}));
  CHECK(rejects("{\"a\":[0,1]}", 1, {"the entry of tensor 'a' is a JSON array, not an object"}));
  CHECK(rejects("{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                {"the dtype of tensor 'a' is 4, not a string"}));
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1,
                {"the shape of tensor 'a' is 1, not an array"}));
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1,
                {"the data_offsets of tensor 'a' are [0,1,2], not two non-negative integers"}));
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":\"0-1\"}}", 1,
                {"the data_offsets of tensor 'a' are \"0-1\""}));
}

TEST_CASE("ckpt: an unknown dtype", "[ckpt]") {
  CHECK(rejects("{\"a\":" + entry("F128", "[1]", 0, 16) + "}", 16,
                {"tensor 'a' has unknown dtype 'F128'"}));
  CHECK(rejects("{\"a\":" + entry("f32", "[1]", 0, 4) + "}", 4,
                {"tensor 'a' has unknown dtype 'f32'"}));
}

TEST_CASE("ckpt: a negative or non-integer dimension", "[ckpt]") {
  CHECK(rejects("{\"a\":" + entry("U8", "[2,-1]", 0, 0) + "}", 0,
                {"dimension 1 of the shape of tensor 'a' is -1, not a non-negative integer"}));
  CHECK(rejects("{\"a\":" + entry("U8", "[1.5]", 0, 0) + "}", 0,
                {"dimension 0 of the shape of tensor 'a' is 1.5"}));
  CHECK(rejects("{\"a\":" + entry("U8", "[2.0]", 0, 2) + "}", 2,
                {"dimension 0 of the shape of tensor 'a' is 2.0"}));
  CHECK(rejects("{\"a\":" + entry("U8", "[\"2\"]", 0, 2) + "}", 2,
                {"dimension 0 of the shape of tensor 'a' is \"2\""}));
  CHECK(rejects("{\"a\":" + entry("U8", "[18446744073709551616]", 0, 2) + "}", 2,
                {"dimension 0 of the shape of tensor 'a'"}));
  CHECK(rejects("{\"a\":" + entry("F32", "[4294967296,4294967296]", 0, 2) + "}", 2,
                {"tensor 'a' of shape [4294967296, 4294967296] and dtype F32 has more than 2^64"}));
  // A zero dimension makes the tensor empty, whatever the others are.
  CHECK(
      parse("{\"a\":" + entry("F32", "[4294967296,4294967296,0]", 0, 0) + "}", 0).tensors.size() ==
      1);
}

TEST_CASE("ckpt: data_offsets that disagree with the shape", "[ckpt]") {
  CHECK(rejects("{\"a\":" + entry("F32", "[2]", 0, 4) + "}", 4,
                {"tensor 'a' has data_offsets [0, 4] (4 bytes) but shape [2] and dtype F32 need "
                 "8 bytes"}));
  CHECK(rejects("{\"a\":" + entry("F64", "[]", 0, 4) + "}", 4, {"need 8 bytes"}));
}

TEST_CASE("ckpt: data_offsets out of range", "[ckpt]") {
  CHECK(rejects("{\"a\":" + entry("U8", "[8]", 0, 8) + "}", 4,
                {"tensor 'a' has data_offsets [0, 8] past the end of the data section (4 bytes"}));
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
                {"the data_offsets of tensor 'a' are [4, 0]: begin is after end"}));
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1,
                {"the data_offsets of tensor 'a' are [-1,0]"}));
}

TEST_CASE("ckpt: overlapping tensors", "[ckpt]") {
  CHECK(rejects("{\"b\":" + entry("U8", "[8]", 4, 12) + ",\"a\":" + entry("U8", "[8]", 0, 8) + "}",
                12, {"tensor 'a' [0, 8) and tensor 'b' [4, 12) overlap"}));
  // The same bytes twice.
  CHECK(rejects("{\"a\":" + entry("U8", "[8]", 0, 8) + ",\"b\":" + entry("U8", "[8]", 0, 8) + "}",
                8, {"tensor 'a' [0, 8) and tensor 'b' [0, 8) overlap"}));
  // An empty tensor inside another one.
  CHECK(rejects("{\"a\":" + entry("U8", "[8]", 0, 8) + ",\"e\":" + entry("U8", "[0]", 4, 4) + "}",
                8, {"tensor 'a' [0, 8) and tensor 'e' [4, 4) overlap"}));
}

TEST_CASE("ckpt: a gap between tensors", "[ckpt]") {
  CHECK(rejects("{\"a\":" + entry("U8", "[4]", 0, 4) + ",\"b\":" + entry("U8", "[4]", 8, 12) + "}",
                12, {"a gap of 4 bytes [4, 8) between tensor 'a' and tensor 'b'"}));
  CHECK(rejects("{\"b\":" + entry("U8", "[4]", 2, 6) + "}", 6,
                {"a gap of 2 bytes [0, 2) before the first tensor, tensor 'b'"}));
  CHECK(rejects("{\"a\":" + entry("U8", "[4]", 0, 4) + ",\"b\":" + entry("U8", "[4]", 5, 9) + "}",
                9, {"a gap of 1 byte [4, 5)"}));
}

TEST_CASE("ckpt: trailing bytes after the last tensor", "[ckpt]") {
  CHECK(rejects("{\"a\":" + entry("U8", "[4]", 0, 4) + "}", 8,
                {"4 trailing bytes [4, 8) after the last tensor, tensor 'a'"}));
  CHECK(
      rejects("{}", 3, {"3 trailing bytes [0, 3) after the header, and the file has no tensors"}));
}

TEST_CASE("ckpt: duplicate names and keys", "[ckpt]") {
  CHECK(rejects("{\"a\":" + entry("U8", "[4]", 0, 4) + ",\"a\":" + entry("U8", "[4]", 4, 8) + "}",
                8, {"tensor 'a' appears twice"}));
  CHECK(rejects("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
                0, {"key 'dtype' appears twice in the entry of tensor 'a'"}));
  CHECK(rejects("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                {"key 'k' appears twice in the object under '__metadata__'"}));
  CHECK(
      rejects("{\"__metadata__\":{},\"__metadata__\":{}}", 0, {"\"__metadata__\" appears twice"}));
}

TEST_CASE("ckpt: a metadata value that is not a string", "[ckpt]") {
  CHECK(rejects("{\"__metadata__\":{\"step\":10}}", 0,
                {"metadata 'step' is 10, a JSON number; every metadata value must be a string"}));
  CHECK(
      rejects("{\"__metadata__\":{\"x\":[\"a\"]}}", 0, {"metadata 'x' is [\"a\"], a JSON array"}));
  CHECK(rejects("{\"__metadata__\":[]}", 0, {"\"__metadata__\" is a JSON array, not an object"}));
}

TEST_CASE("ckpt: a newer or malformed format version", "[ckpt]") {
  const auto md = [](const std::string& v) {
    return "{\"__metadata__\":{\"shardopt.format_version\":\"" + v + "\"}}";
  };
  CHECK(parse(md("1"), 0).format_version == 1);
  CHECK(throws_error<CheckpointError>(
      [&] { parse(md("2"), 0); }, ErrorCode::checkpoint,
      "written by a newer shardopt: format version 2, this build reads up to 1"));
  try {
    parse(md("2"), 0);
  } catch (const CheckpointError& e) {
    CHECK(e.hint().find("newer shardopt") != std::string::npos);
  }
  CHECK(rejects(md("99999999999"), 0, {"\"shardopt.format_version\" is '99999999999'"}));
  for (const char* bad : {"", "1.0", "v1", "-1", " 1"})
    CHECK(rejects(
        md(bad), 0,
        {"\"shardopt.format_version\" is '" + std::string(bad) + "', not a decimal integer"}));
}

TEST_CASE("ckpt: a bad chunk size", "[ckpt]") {
  const std::string json = checksummed_json();
  REQUIRE(parse(json, 11).chunk_bytes == 4);
  for (const char* bad : {"0", "-4", "4.0", "", "0x4", "18446744073709551616"})
    CHECK(rejects(replaced(json, "\"shardopt.chunk_bytes\":\"4\"",
                           "\"shardopt.chunk_bytes\":\"" + std::string(bad) + "\""),
                  11,
                  {"\"shardopt.chunk_bytes\" is '" + std::string(bad) +
                   "', not a positive decimal integer"}));
  CHECK(rejects(replaced(json, "\"shardopt.chunk_bytes\":\"4\",", ""), 11,
                {"\"shardopt.checksum\" is present but \"shardopt.chunk_bytes\" is missing"}));
  CHECK(rejects(replaced(json, "\"xxh3-64\"", "\"sha256\""), 11,
                {"\"shardopt.checksum\" is 'sha256'; this build knows only \"xxh3-64\""}));
}

TEST_CASE("ckpt: a checksum string of the wrong length or not hex", "[ckpt]") {
  const std::string json = checksummed_json();
  const Header h = parse(json, 11);
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].chunks == std::vector<std::uint64_t>{0x0123456789abcdefull, 2});
  CHECK(h.tensors[1].chunks == std::vector<std::uint64_t>{3});

  CHECK(rejects(replaced(json, "0123456789abcdef", "0123456789abcde"), 11,
                {"metadata 'shardopt.xxh3.a' has 31 characters; tensor 'a' of 8 bytes has 2 "
                 "chunks of at most 4 bytes"}));
  CHECK(rejects(replaced(json, "0000000000000003", ""), 11,
                {"metadata 'shardopt.xxh3.b' has 0 characters; tensor 'b' of 3 bytes has 1 "
                 "chunk of at most 4 bytes"}));
  CHECK(rejects(replaced(json, "0123456789abcdef", "0123456789ABCDEF"), 11,
                {"metadata 'shardopt.xxh3.a': the checksum of chunk 0 is '0123456789ABCDEF', "
                 "not 16 lowercase hex digits"}));
  CHECK(rejects(replaced(json, "0000000000000002", "000000000000000z"), 11,
                {"the checksum of chunk 1 is '000000000000000z'"}));
  CHECK(rejects(replaced(json, ",\"shardopt.xxh3.b\":\"0000000000000003\"", ""), 11,
                {"no metadata 'shardopt.xxh3.b' for tensor 'b'"}));
}

TEST_CASE("ckpt: a checksum key for a missing tensor", "[ckpt]") {
  const std::string json = checksummed_json({{"shardopt.xxh3x", "not a checksum key"}});
  REQUIRE_NOTHROW(parse(json, 11));
  CHECK(rejects(replaced(json, "\"shardopt.xxh3x\"", "\"shardopt.xxh3.c\""), 11,
                {"metadata 'shardopt.xxh3.c' holds checksums of a tensor the file does not have"}));
  // Checksum keys without "shardopt.checksum".
  CHECK(rejects(replaced(json, "\"shardopt.checksum\":\"xxh3-64\",", ""), 11,
                {"metadata 'shardopt.xxh3.a' is present but \"shardopt.checksum\" is missing"}));
}
