// shardopt-ckpt info: the header of a checkpoint, an export or any
// safetensors file, as text or as one JSON object.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "../support/cli.hpp"
#include "commands.hpp"
#include "common.hpp"

namespace ckpt_tool {
namespace {

// A metadata value that is JSON text (groups, params, states) as JSON, or
// as a JSON string if it does not parse.
Json json_value(const std::string& text) {
  try {
    return Json::parse(text);
  } catch (const Json::exception&) {
    return Json(text);
  }
}

// A decimal metadata value as a JSON number, or the string if it is not one.
Json number_value(const std::string& text) {
  if (const auto v = cli::parse_unsigned(text)) return Json(*v);
  return Json(text);
}

void print_info_text(const ck::Reader& r) {
  const ck::Header& h = r.header();
  auto row = [](const char* key, const std::string& value) {
    std::printf("%-20s %s\n", key, value.c_str());
  };
  row("file:", r.path());
  row("size:", std::to_string(h.file_bytes) + " bytes (" + bytes_text(double(h.file_bytes)) +
                   "), header " + std::to_string(h.header_bytes) + " bytes, data at " +
                   std::to_string(h.data_start));
  if (h.format_version == 0) {
    row("format version:", "0: a plain safetensors file, no shardopt metadata");
  } else {
    row("format version:", std::to_string(h.format_version));
    row("shardopt version:", meta(h, kKeyVersion, "-"));
    row("content:", meta(h, kKeyContent, "-"));
    row("step:", meta(h, kKeyStep, "-"));
    if (meta(h, kKeyContent) == "checkpoint") {
      row("optimizer:", meta(h, kKeyOptimizer, "-"));
      row("stage:", meta(h, kKeyStage, "-"));
      row("ranks saved at:", meta(h, kKeyRanks, "-"));
    }
    row("dtype:", meta(h, kKeyDtype, "-"));
    if (has_meta(h, kKeyRemainders)) row("param remainders:", meta(h, kKeyRemainders));
    if (has_meta(h, kKeyFingerprint)) row("layout fingerprint:", meta(h, kKeyFingerprint));
  }
  row("checksums:", h.chunk_bytes == 0 ? std::string("none")
                                       : meta(h, kKeyChecksum, "?") + " per chunk of " +
                                             std::to_string(h.chunk_bytes) + " bytes (" +
                                             bytes_text(double(h.chunk_bytes)) + ")");
  if (has_meta(h, kKeyGroups)) row("groups:", meta(h, kKeyGroups));
  if (has_meta(h, kKeyParams)) {
    const std::vector<ParamEntry> ps = params_of(h);
    u64 n = 0;
    for (const ParamEntry& p : ps) n += p.numel;
    row("params:", std::to_string(ps.size()) + " tensors, " + std::to_string(n) + " elements");
  }
  if (has_meta(h, kKeyStates)) row("states:", meta(h, kKeyStates));
  // Metadata the lines above do not show (checksums excepted).
  for (const auto& [k, v] : h.metadata) {
    if (k.starts_with(kKeyChunksPrefix)) continue;
    if (k.starts_with("shardopt.") && h.format_version > 0) {
      static const char* shown[] = {kKeyFormatVersion, kKeyVersion,    kKeyContent,    kKeyChecksum,
                                    kKeyChunkBytes,    kKeyStep,       kKeyOptimizer,  kKeyGroups,
                                    kKeyParams,        kKeyStates,     kKeyStage,      kKeyRanks,
                                    kKeyDtype,         kKeyRemainders, kKeyFingerprint};
      if (std::any_of(std::begin(shown), std::end(shown),
                      [&key = k](const char* s) { return key == s; }))
        continue;
    }
    std::string value = v.size() > 200 ? v.substr(0, 200) + "..." : v;
    row("metadata:", k + " = \"" + value + "\"");
  }

  std::vector<std::string> names, dtypes, shapes;
  for (const ck::TensorInfo& t : h.tensors) {
    names.push_back(t.name);
    dtypes.push_back(t.dtype);
    shapes.push_back(shape_text(t.shape));
  }
  const int nw = static_cast<int>(text_width(names, 6, 60));
  const int sw = static_cast<int>(text_width(shapes, 5, 40));
  std::printf("\n%-*s  %-7s  %-*s  %14s  %8s\n", nw, "tensor", "dtype", sw, "shape", "bytes",
              "chunks");
  u64 bytes = 0, chunks = 0;
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const ck::TensorInfo& t = h.tensors[i];
    const u64 c = chunks_of(h, t);
    bytes += t.bytes();
    chunks += c;
    std::printf("%-*s  %-7s  %-*s  %14llu  %8s\n", nw, names[i].c_str(), dtypes[i].c_str(), sw,
                shapes[i].c_str(), static_cast<unsigned long long>(t.bytes()),
                h.chunk_bytes == 0 ? "-" : std::to_string(c).c_str());
  }
  std::printf("total: %zu tensors, %llu bytes (%s), %s\n", h.tensors.size(),
              static_cast<unsigned long long>(bytes), bytes_text(double(bytes)).c_str(),
              h.chunk_bytes == 0 ? "no checksums"
                                 : (std::to_string(chunks) + " checksummed chunks").c_str());
}

Json info_json(const ck::Reader& r) {
  const ck::Header& h = r.header();
  Json j;
  j["file"] = r.path();
  j["file_bytes"] = h.file_bytes;
  j["header_bytes"] = h.header_bytes;
  j["data_start"] = h.data_start;
  j["format_version"] = h.format_version;
  j["shardopt_metadata"] = h.format_version > 0;
  auto opt_str = [&](const char* key) { return has_meta(h, key) ? Json(meta(h, key)) : Json(); };
  auto opt_num = [&](const char* key) {
    return has_meta(h, key) ? number_value(meta(h, key)) : Json();
  };
  j["shardopt_version"] = opt_str(kKeyVersion);
  j["content"] = opt_str(kKeyContent);
  j["step"] = opt_num(kKeyStep);
  j["optimizer"] = opt_str(kKeyOptimizer);
  j["stage"] = opt_num(kKeyStage);
  j["ranks"] = opt_num(kKeyRanks);
  j["dtype"] = opt_str(kKeyDtype);
  j["param_remainders"] =
      has_meta(h, kKeyRemainders) ? Json(meta(h, kKeyRemainders) == "true") : Json();
  j["layout_fingerprint"] = opt_str(kKeyFingerprint);
  j["checksum"] = h.chunk_bytes == 0 ? Json() : Json(meta(h, kKeyChecksum));
  j["chunk_bytes"] = h.chunk_bytes;
  j["groups"] = has_meta(h, kKeyGroups) ? json_value(meta(h, kKeyGroups)) : Json();
  j["params"] = has_meta(h, kKeyParams) ? json_value(meta(h, kKeyParams)) : Json();
  j["states"] = has_meta(h, kKeyStates) ? json_value(meta(h, kKeyStates)) : Json();
  Json other = Json::object();
  for (const auto& [k, v] : h.metadata) {
    if (!k.starts_with("shardopt.")) other[k] = v;
  }
  j["other_metadata"] = other;
  Json tensors = Json::array();
  u64 bytes = 0, chunks = 0;
  for (const ck::TensorInfo& t : h.tensors) {
    Json x;
    x["name"] = t.name;
    x["dtype"] = t.dtype;
    x["shape"] = t.shape;
    x["bytes"] = t.bytes();
    x["chunks"] = chunks_of(h, t);
    x["data_offsets"] = {t.begin, t.end};
    bytes += t.bytes();
    chunks += chunks_of(h, t);
    tensors.push_back(std::move(x));
  }
  j["tensors"] = std::move(tensors);
  j["total_tensors"] = h.tensors.size();
  j["total_bytes"] = bytes;
  j["total_chunks"] = chunks;
  return j;
}

}  // namespace

int run_info(shardopt::Communicator& comm, const World& w, const std::string& path,
             const InfoOptions& o) {
  const bool ok = guarded(w, path, [&] {
    ck::Reader r = open_file(comm, w, path);
    // Every rank holds the same header: a shardopt.params that does not
    // parse fails on every rank alike, before anything is printed.
    (void)params_of(r.header());
    if (w.rank == 0) {
      if (o.json) {
        // Names that are not UTF-8 are printed with U+FFFD, not thrown on.
        std::printf("%s\n",
                    info_json(r).dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
      } else {
        print_info_text(r);
      }
      std::fflush(stdout);
    }
  });
  return ok ? 0 : 1;
}

}  // namespace ckpt_tool
