// shardopt-ckpt verify: reads every byte of every tensor of each file and
// checks every chunk's checksum.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common.hpp"

namespace ckpt_tool {
namespace {

// Collective: reads every byte of `path`'s tensors, checksums verified;
// throws what the library throws (the same on every rank).
void verify_file(shardopt::Communicator& comm, const World& w, const std::string& path,
                 const VerifyOptions& o) {
  ck::Reader r = open_file(comm, w, path);
  const ck::Header& h = r.header();
  if (h.chunk_bytes == 0 && !o.allow_unchecksummed) {
    throw Failure(
        "has no checksums (" +
            std::string(h.format_version == 0 ? "a plain safetensors file"
                                              : "written without shardopt.checksum") +
            "): nothing to verify",
        "pass --allow-unchecksummed to read it through anyway (checks that every byte can be "
        "read, not the values)");
  }
  std::vector<u64> numel, cost, align;
  u64 total = 0, chunks = 0;
  for (const ck::TensorInfo& t : h.tensors) {
    numel.push_back(t.bytes());
    cost.push_back(1);
    align.push_back(h.chunk_bytes);
    total += t.bytes();
    chunks += chunks_of(h, t);
  }
  const std::vector<Window> windows = plan_windows(numel, cost, align, total, w, o.window);
  Scratch scratch;
  u64 biggest = 0;
  for_each_my_window(windows, w, [&](const Window& win) {
    u64 b = 0;
    for (const Unit& u : win) b += u.count;
    biggest = std::max(biggest, b);
  });
  unsigned char* buf = nullptr;
  local(w, [&] { buf = scratch.get(std::max<u64>(biggest, 1)); });
  for (std::size_t k = 0; k < rounds_of(windows.size(), w.size); ++k) {
    std::vector<ck::ReadRange> ranges;
    if (const Window* win = my_window(windows, k, w)) {
      u64 at = 0;
      for (const Unit& u : *win) {
        ranges.push_back({u.item, u.first, u.count, buf + at});
        at += u.count;
      }
    }
    r.read(ranges, /*verify=*/true);
  }
  if (w.rank == 0) {
    if (h.chunk_bytes == 0) {
      std::printf("%s: ok (%zu tensors, %llu bytes read; no checksums, values not verified)\n",
                  path.c_str(), h.tensors.size(), static_cast<unsigned long long>(total));
    } else {
      std::printf("%s: ok (%zu tensors, %llu bytes, %llu chunks verified)\n", path.c_str(),
                  h.tensors.size(), static_cast<unsigned long long>(total),
                  static_cast<unsigned long long>(chunks));
    }
    std::fflush(stdout);
  }
}

}  // namespace

int run_verify(shardopt::Communicator& comm, const World& w, const std::vector<std::string>& files,
               const VerifyOptions& o) {
  int failed = 0;
  for (const std::string& f : files) {
    if (!guarded(w, f, [&] { verify_file(comm, w, f, o); })) ++failed;
  }
  if (files.size() > 1 && w.rank == 0) {
    std::printf("verify: %zu of %zu files ok\n", files.size() - static_cast<std::size_t>(failed),
                files.size());
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace ckpt_tool
