// libFuzzer target of the checkpoint header parser (tests/fuzz/run.sh builds
// and runs it). The input is a whole file: the little-endian u64 length N,
// then N bytes of header, then the data section. A header parse_header
// accepts must also satisfy the format's invariants and survive a
// build_header / parse_header round trip; a rejected one must be rejected
// with a shardopt::Error. Anything else (a crash, another exception, a
// sanitizer report, a broken invariant) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/format.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/error.hpp"

namespace {

using shardopt::ckpt::Header;
using shardopt::ckpt::TensorInfo;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_header: invariant broken: %s\n", what);
  std::abort();
}

void check_invariants(const Header& h) {
  namespace d = shardopt::ckpt::detail;
  if (h.data_start != 8 + h.header_bytes || h.data_start > h.file_bytes)
    fail("header_bytes/data_start/file_bytes");
  std::uint64_t cursor = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != cursor || t.end < t.begin) fail("tensors do not tile the data section");
    std::uint64_t n = shardopt::ckpt::dtype_bytes(t.dtype);
    if (n == 0) fail("unknown dtype accepted");
    for (const auto dim : t.shape) n *= dim;
    if (n != t.bytes()) fail("shape and offsets disagree");
    if (h.chunk_bytes > 0 ? t.chunks.size() != d::chunk_count(t.bytes(), h.chunk_bytes)
                          : !t.chunks.empty())
      fail("wrong number of chunk checksums");
    if (h.find(t.name) != &t) fail("find() does not return the tensor");
    cursor = t.end;
  }
  if (cursor != h.file_bytes - h.data_start) fail("tensors do not end at the end of the file");
  if (h.format_version < 0 || h.format_version > shardopt::ckpt::kFormatVersion)
    fail("format version out of range");

  // Write the same header again and read it back: the same tensors, in the
  // same order, and the same metadata.
  std::vector<TensorInfo> tensors = h.tensors;
  std::map<std::string, std::string> metadata;
  for (const auto& [k, v] : h.metadata)
    if (!d::is_reserved_key(k)) metadata.emplace(k, v);
  std::string file;
  try {
    file = d::build_header(tensors, metadata, h.chunk_bytes);
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("build_header rejects a header that parse_header accepted");
  }
  const Header r =
      shardopt::ckpt::parse_header(std::string_view(file).substr(8), file.size() + cursor);
  if (r.tensors.size() != h.tensors.size() || r.chunk_bytes != h.chunk_bytes ||
      r.format_version != h.format_version)
    fail("round trip changed the header");
  for (std::size_t i = 0; i < r.tensors.size(); ++i) {
    const auto &a = r.tensors[i], &b = h.tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin ||
        a.end != b.end || a.chunks != b.chunks)
      fail("round trip changed a tensor");
  }
  std::size_t kept = 0;
  for (const auto& [k, v] : r.metadata) {
    if (d::is_reserved_key(k)) continue;
    const auto it = metadata.find(k);
    if (it == metadata.end() || it->second != v) fail("round trip changed the metadata");
    ++kept;
  }
  if (kept != metadata.size()) fail("round trip lost metadata");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 8) return 0;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  const std::uint64_t file_bytes = size;
  if (n > file_bytes - 8) {
    // A length past the end of the file: the parser must say so from the
    // bytes that are there.
    try {
      shardopt::ckpt::parse_header(
          std::string_view(reinterpret_cast<const char*>(data) + 8, size - 8), file_bytes - 1);
      fail("a header longer than the file was accepted");
    } catch (const shardopt::Error&) {
    }
    return 0;
  }
  Header h;
  try {
    h = shardopt::ckpt::parse_header(
        std::string_view(reinterpret_cast<const char*>(data) + 8, static_cast<std::size_t>(n)),
        file_bytes);
  } catch (const shardopt::Error&) {
    return 0;  // a rejected header
  }
  check_invariants(h);
  return 0;
}
