// shardopt-train: the --save-params file and the checks that a run's files
// can be written (files.hpp).
#include "files.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "shardopt/checkpoint.hpp"

namespace train {
namespace {

// The file's layout (docs/train.md): a 64-byte header, a 64-byte record per
// tensor, then every tensor's values in order, all little-endian.
constexpr char kMagic[8] = {'S', 'O', 'P', 'A', 'R', 'A', 'M', 'S'};
constexpr std::uint32_t kFormatVersion = 1;
constexpr std::size_t kHeaderBytes = 64;
constexpr std::size_t kRecordBytes = 64;
constexpr std::size_t kNameBytes = 40;

template <class T>
void put_le(std::vector<std::byte>& out, std::size_t at, T value) {
  for (std::size_t k = 0; k < sizeof(T); ++k) {
    out[at + k] = static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * k)) & 0xffu);
  }
}

std::vector<std::byte> params_file_head(const ModelTensors& m, std::int64_t steps) {
  const std::size_t t = m.count();
  std::vector<std::byte> out(kHeaderBytes + kRecordBytes * t, std::byte{0});
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  put_le<std::uint32_t>(out, 8, kFormatVersion);
  put_le<std::uint32_t>(out, 12, static_cast<std::uint32_t>(m.dtype()));
  put_le<std::uint32_t>(out, 16, static_cast<std::uint32_t>(shardopt::dtype_size(m.dtype())));
  put_le<std::uint32_t>(out, 20, static_cast<std::uint32_t>(t));
  put_le<std::uint64_t>(out, 24, static_cast<std::uint64_t>(m.numel()));
  put_le<std::uint64_t>(out, 32, static_cast<std::uint64_t>(steps));
  put_le<std::uint64_t>(out, 40, static_cast<std::uint64_t>(out.size()));
  for (std::size_t i = 0; i < t; ++i) {
    const std::size_t r = kHeaderBytes + kRecordBytes * i;
    const std::string& name = m.name(i);
    std::memcpy(out.data() + r, name.data(), std::min(name.size(), kNameBytes - 1));
    const auto dims = m.dims(i);
    put_le<std::uint32_t>(out, r + 40, dims[1] == 0 ? 1u : 2u);
    put_le<std::uint32_t>(out, r + 44, dims[0]);
    put_le<std::uint32_t>(out, r + 48, dims[1]);
    put_le<std::uint64_t>(out, r + 56, static_cast<std::uint64_t>(m.offset(i)));
  }
  return out;
}

bool host_is_little_endian() {
  const std::uint16_t one = 1;
  std::uint8_t first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

}  // namespace

std::string save_params(const std::string& path, const ModelTensors& m, std::int64_t steps) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return "cannot write '" + tmp + "': " + std::strerror(errno);
  }
  const std::vector<std::byte> head = params_file_head(m, steps);
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  const std::size_t esize = shardopt::dtype_size(m.dtype());
  std::vector<std::byte> swapped;
  for (std::size_t i = 0; ok && i < m.count(); ++i) {
    const auto* p = static_cast<const std::byte*>(m.host_param(i));
    const std::size_t bytes = m.numel(i) * esize;
    if (!host_is_little_endian()) {
      swapped.assign(p, p + bytes);
      for (std::size_t k = 0; k < bytes; k += esize) std::reverse(&swapped[k], &swapped[k + esize]);
      p = swapped.data();
    }
    ok = std::fwrite(p, 1, bytes, f) == bytes;
  }
  const int saved_errno = errno;
  if (std::fclose(f) != 0 || !ok) {
    const std::string why = std::strerror(ok ? errno : saved_errno);
    std::remove(tmp.c_str());
    return "cannot write '" + tmp + "': " + why;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return "cannot rename '" + tmp + "' to '" + path + "': " + why;
  }
  return {};
}

std::string check_writable(const std::string& path) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return "cannot write '" + tmp + "': " + std::strerror(errno);
  std::fclose(f);
  std::remove(tmp.c_str());
  return {};
}

std::string check_directory(const std::string& option, const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return option + " " + path + ": cannot create files in '" + dir.string() +
           "': " + std::strerror(errno);
  }
  return {};
}

std::string overwrite_refusal(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st) || std::filesystem::is_directory(st)) return {};
  std::string holds;
  try {
    const shardopt::ckpt::Header h = shardopt::ckpt::read_header(path);
    const auto content = h.metadata.find("shardopt.content");
    const auto step = h.metadata.find("shardopt.step");
    if (content != h.metadata.end() && content->second == "checkpoint" && step != h.metadata.end())
      holds = "a checkpoint at step " + step->second;
    else
      holds = "a safetensors file that is not a shardopt checkpoint";
  } catch (const shardopt::Error& e) {
    holds = "a file that is not a readable checkpoint (" + e.message() + ")";
  }
  return "--checkpoint " + path + " exists and holds " + holds +
         "; this run, without --resume, would replace it: go on from it with --resume " + path +
         ", or replace it with --overwrite";
}

}  // namespace train
