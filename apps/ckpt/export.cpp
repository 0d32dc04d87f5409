// shardopt-ckpt export: the parameters of a checkpoint (its fp32 master
// tensors) as a plain export file, in f32, bf16 or f16.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "common.hpp"

namespace ckpt_tool {
namespace {

// Whether a and b name the same existing file. Local.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void export_file(shardopt::Communicator& comm, const World& w, const std::string& in,
                 const std::string& out, const ExportOptions& o) {
  ck::Reader r = open_file(comm, w, in);
  const ck::Header& h = r.header();
  const std::string content = meta(h, kKeyContent);
  if (h.format_version == 0 || content != "checkpoint") {
    throw Failure(
        in + ": " +
            (h.format_version == 0
                 ? std::string("a plain safetensors file, not a shardopt checkpoint")
                 : "a shardopt " + content + " file, not a checkpoint (no optimizer state)"),
        "export reads a checkpoint written by ZeroRedundancyOptimizer::save (shardopt.content "
        "\"checkpoint\"); 'shardopt-ckpt info " +
            in + "' shows what the file is");
  }
  int same = 0;
  if (w.rank == 0) same = same_file(in, out) ? 1 : 0;
  MPI_Bcast(&same, 1, MPI_INT, 0, w.comm);
  if (same) {
    throw Failure("OUT " + out + " is the checkpoint itself", "write the export to another path");
  }
  std::vector<ParamEntry> params;
  local(w, [&] { params = params_of(h); });
  if (params.empty()) {
    throw Failure(in + ": lists no parameters (shardopt.params is missing or empty)",
                  "the file is damaged or was not written by shardopt");
  }
  // The source tensors, their shapes kept.
  const TensorIndex index(h);
  std::vector<std::size_t> src;
  std::vector<ck::WriteTensor> tensors;
  std::vector<u64> numel, cost, align;
  const char* out_name = ck::dtype_name(o.dtype);
  const u64 out_es = shardopt::dtype_size(o.dtype);
  u64 total = 0;
  for (const ParamEntry& p : params) {
    const ck::TensorInfo* t = index.find(p.name);
    if (t == nullptr || t->dtype != "F32") {
      throw Failure(in + ": parameter '" + p.name + "' " +
                        (t == nullptr ? std::string("has no tensor")
                                      : "is " + t->dtype + ", not F32 (master values)"),
                    "the file is damaged or was not written by shardopt");
    }
    src.push_back(static_cast<std::size_t>(t - h.tensors.data()));
    tensors.push_back({p.name, out_name, t->shape});
    numel.push_back(t->bytes() / 4);
    cost.push_back(4);
    align.push_back(h.chunk_bytes % 4 == 0 ? h.chunk_bytes / 4 : 1);
    total += t->bytes();
  }
  // Each rank holds the output of its windows (its share, about 1/ranks)
  // and reads one window at a time.
  const std::vector<Window> windows = plan_windows(numel, cost, align, total, w, o.window);
  const std::size_t rounds = rounds_of(windows.size(), w.size);
  u64 mine = 0, staging = 0;
  for_each_my_window(windows, w, [&](const Window& win) {
    u64 n = 0;
    for (const Unit& u : win) n += u.count;
    mine += n * out_es;
    staging = std::max(staging, n * 4);
  });
  shardopt::HostBuffer held;
  Scratch scratch;
  unsigned char* stage = nullptr;
  local(w, [&] {
    held = shardopt::HostBuffer(static_cast<std::size_t>(std::max<u64>(mine, 1)));
    if (o.dtype != DType::f32) stage = scratch.get(std::max<u64>(staging, 1));
  });
  std::vector<ck::Piece> pieces;
  u64 at = 0;  // where this rank's next unit goes in `held`
  for (std::size_t k = 0; k < rounds; ++k) {
    std::vector<ck::ReadRange> ranges;
    std::vector<std::pair<const Unit*, unsigned char*>> casts;
    for (int owner = 0; owner < w.size; ++owner) {
      const std::size_t i = k * static_cast<std::size_t>(w.size) + static_cast<std::size_t>(owner);
      if (i >= windows.size()) break;
      u64 staged = 0;
      for (const Unit& u : windows[i]) {
        ck::Piece p;
        p.tensor = u.item;
        p.offset = u.first * out_es;
        p.bytes = u.count * out_es;
        p.owner = owner;
        if (owner == w.rank) {
          unsigned char* dst = held.as<unsigned char>() + at;
          p.data = dst;
          at += p.bytes;
          if (o.dtype == DType::f32) {
            ranges.push_back({src[u.item], u.first * 4, u.count * 4, dst});
          } else {
            ranges.push_back({src[u.item], u.first * 4, u.count * 4, stage + staged});
            casts.emplace_back(&u, dst);
            staged += u.count * 4;
          }
        }
        pieces.push_back(p);
      }
    }
    r.read(ranges, /*verify=*/true);
    if (o.dtype != DType::f32) {
      local(w, [&] {
        for (std::size_t c = 0; c < casts.size(); ++c) {
          shardopt::cast(ranges[c].dst, DType::f32, casts[c].second, o.dtype,
                         static_cast<std::size_t>(casts[c].first->count));
        }
      });
    }
  }
  std::map<std::string, std::string> md;
  md[kKeyFormat] = "pt";
  md[kKeyFormatVersion] = std::to_string(ck::kFormatVersion);
  md[kKeyVersion] = shardopt::build_info().version;
  md[kKeyContent] = "export";
  md[kKeyDtype] = meta(h, kKeyDtype, "f32");  // the model's, as export_params() writes it
  md[kKeyStep] = meta(h, kKeyStep, "0");
  ck::WriteOptions wo;
  wo.chunk_bytes = o.chunk_bytes;
  ck::write_file(comm, out, tensors, pieces, md, wo);
  if (w.rank == 0) {
    u64 elements = 0;
    for (u64 n : numel) elements += n;
    std::printf("%s: %zu parameters (%llu elements, %s, %s) of %s at step %s\n", out.c_str(),
                tensors.size(), static_cast<unsigned long long>(elements),
                shardopt::dtype_name(o.dtype), bytes_text(double(elements * out_es)).c_str(),
                in.c_str(), meta(h, kKeyStep, "0").c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int run_export(shardopt::Communicator& comm, const World& w, const std::string& in,
               const std::string& out, const ExportOptions& o) {
  return guarded(w, "export", [&] { export_file(comm, w, in, out, o); }) ? 0 : 1;
}

}  // namespace ckpt_tool
