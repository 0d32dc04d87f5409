// shardopt-ckpt: the commands, their options and their entry points, one
// file each (info.cpp, verify.cpp, export.cpp, diff.cpp, bench.cpp). Each
// is collective: every rank calls it alike, rank 0 prints, and it returns
// the exit status, the same on every rank.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"

namespace ckpt_tool {

struct InfoOptions {
  bool json = false;
};

// info FILE: the header of FILE, as text or one JSON object.
int run_info(shardopt::Communicator& comm, const World& w, const std::string& path,
             const InfoOptions& o);

struct VerifyOptions {
  bool allow_unchecksummed = false;
  u64 window = kDefaultWindow;
};

// verify FILE...: every byte of every tensor read, every chunk's checksum
// checked; a line per file.
int run_verify(shardopt::Communicator& comm, const World& w, const std::vector<std::string>& files,
               const VerifyOptions& o);

struct ExportOptions {
  DType dtype = DType::f32;
  u64 window = kDefaultWindow;
  u64 chunk_bytes = ck::kDefaultChunkBytes;
};

// export CKPT OUT: the parameters of checkpoint `in` as an export file `out`.
int run_export(shardopt::Communicator& comm, const World& w, const std::string& in,
               const std::string& out, const ExportOptions& o);

struct DiffOptions {
  std::optional<double> atol, rtol;
  bool params_only = false;
  bool quiet = false;
  u64 window = kDefaultWindow;
  bool tolerant() const { return atol || rtol; }
};

// diff A B: 0 if the files are equal, 1 if they differ, 2 on an error.
int run_diff(shardopt::Communicator& comm, const World& w, const std::string& a,
             const std::string& b, const DiffOptions& o);

struct BenchOptions {
  std::vector<std::size_t> params;
  std::string dir = ".";
  int iters = 5;
  int warmup = 1;
  bool cold = false;
  bool json = false;
};

// bench: save and load beside raw I/O of the same bytes, a row per count.
int run_bench(shardopt::Communicator& comm, const World& w, const BenchOptions& o);

}  // namespace ckpt_tool
