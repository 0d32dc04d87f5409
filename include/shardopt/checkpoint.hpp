// shardopt: checkpoint files. One safetensors file per checkpoint, written
// and read in parallel with collective MPI-IO, every rank writing and
// reading only the byte ranges of its own shard; checksummed per fixed-size
// chunk (XXH3-64) so that each rank verifies just the chunks it reads.
// docs/checkpoint-format.md specifies the format; docs/checkpoint.md shows
// how to use it. ZeroRedundancyOptimizer::save/load/export_params are built
// on the writer and the reader below, which also serve tools (shardopt-ckpt)
// and user codes that read checkpoints themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"
#include "shardopt/export.h"
#include "shardopt/types.hpp"

namespace shardopt {

namespace ckpt {

// The newest format version this build writes and reads.
inline constexpr int kFormatVersion = 1;
// Checksum chunk size written by default (bytes of each tensor's data).
inline constexpr std::uint64_t kDefaultChunkBytes = std::uint64_t{1} << 20;
// Headers larger than this are rejected (as the safetensors reference does).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// Bytes per element of a safetensors dtype name ("F32" 4, "BF16" 2, "U8" 1,
// ...), 0 for a name safetensors does not define. Local.
SHARDOPT_API std::size_t dtype_bytes(std::string_view dtype) noexcept;
// The safetensors name of a DType: "F32", "F64", "BF16", "F16", "I32",
// "I64", ... Local.
SHARDOPT_API const char* dtype_name(DType t) noexcept;

// XXH3-64 of `bytes` (seed 0): the checksum of one chunk. Local.
SHARDOPT_API std::uint64_t checksum(const void* data, std::size_t bytes) noexcept;

// One tensor of a file.
struct TensorInfo {
  std::string name;
  std::string dtype;                  // safetensors name: "F32", "BF16", ...
  std::vector<std::uint64_t> shape;   // [] for a scalar
  std::uint64_t begin = 0, end = 0;   // byte offsets in the data section
  std::vector<std::uint64_t> chunks;  // checksum of each chunk; empty without checksums
  std::uint64_t bytes() const noexcept { return end - begin; }
};

// A parsed and validated header.
struct Header {
  std::uint64_t header_bytes = 0;  // N, the little-endian u64 that starts the file
  std::uint64_t data_start = 0;    // 8 + N: where the data section starts
  std::uint64_t file_bytes = 0;
  std::vector<TensorInfo> tensors;              // in file order
  std::map<std::string, std::string> metadata;  // "__metadata__", every key
  int format_version = 0;                       // 0: no shardopt metadata (a plain file)
  std::uint64_t chunk_bytes = 0;                // 0: no checksums
  // The tensor called `name`, or null.
  SHARDOPT_API const TensorInfo* find(std::string_view name) const noexcept;
};

// Parses the N header bytes that follow the 8-byte length of a file of
// file_bytes bytes, and validates them: a JSON object; every tensor with a
// known dtype, a shape and data_offsets that agree, the tensors covering the
// data section exactly (no gap, no overlap, ending at the end of the file);
// string metadata; the shardopt keys well formed (docs/checkpoint-format.md)
// and a format version this build reads. Throws CheckpointError naming the
// problem. Local.
SHARDOPT_API Header parse_header(std::string_view json, std::uint64_t file_bytes);

// Reads and validates the header of the file at `path` (as Reader does,
// without MPI): its 8-byte length, the header, and that the tensors cover
// the file to its last byte, so that a truncated file is an error. The
// tensors' data is not read, so checksums are not verified. Throws IoError
// for a file that cannot be read, CheckpointError for one that is not a
// valid safetensors file. Local: for tools, and for checks one rank makes
// before a job starts (the step a checkpoint holds, its optimizer).
SHARDOPT_API Header read_header(const std::string& path);

// A tensor to write: its data is given by Pieces.
struct WriteTensor {
  std::string name;
  std::string dtype;  // safetensors name
  std::vector<std::uint64_t> shape;
};

// A run of one tensor's bytes held by one rank. The pieces of a tensor must
// cover it exactly, without overlap.
struct Piece {
  std::size_t tensor = 0;    // index into the tensors
  std::uint64_t offset = 0;  // first byte within the tensor
  std::uint64_t bytes = 0;
  int owner = 0;               // the rank that writes it
  const void* data = nullptr;  // on the owner: the bytes; elsewhere ignored
};

struct WriteOptions {
  std::uint64_t chunk_bytes = kDefaultChunkBytes;  // checksum chunk, > 0
  // Rotation: keep this many checkpoints, the newest at `path`, the older
  // ones at path.1 (newest) ... path.<keep_last-1>. 1: replace `path`.
  int keep_last = 1;
};

// Collective: writes a safetensors file at `path`, atomically. Every rank
// passes the same tensors, pieces (the whole map, so that every rank knows
// who writes what) and metadata; each rank writes its own pieces with one
// collective MPI-IO call and checksums the chunks that start in them (the
// few bytes of a chunk held by other ranks are sent to the rank that
// checksums it). The file is written under a temporary name in the same
// directory, synced, and renamed to `path` only after every rank's write
// succeeded. Before any data, every rank checks that it sees the file rank
// 0 created (a token rank 0 wrote in it): ranks on nodes that do not share
// the directory get an IoError "the ranks do not see the same file", not a
// hang. On any failure on any rank, every rank throws the same IoError (or
// InvalidArgument for a bad argument), the temporary file is removed, and
// whatever was at `path` is untouched.
SHARDOPT_API void write_file(Communicator& comm, const std::string& path,
                             const std::vector<WriteTensor>& tensors,
                             const std::vector<Piece>& pieces,
                             const std::map<std::string, std::string>& metadata,
                             const WriteOptions& options = {});

// A range of a tensor's bytes to read.
struct ReadRange {
  std::size_t tensor = 0;  // index into header().tensors
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  void* dst = nullptr;  // `bytes` bytes
};

// An open file, for collective reads.
class SHARDOPT_API Reader {
 public:
  // Collective: opens `path` read-only and parses its header (read once,
  // broadcast), so that every rank gets the same header or the same error
  // (IoError for a file that cannot be opened, CheckpointError for a bad
  // header). Every rank checks that it sees rank 0's file: the same size and
  // header, and, at more than one rank, a small file `path.probe-<hex>` that
  // rank 0 writes beside it and removes at once (skipped where the
  // directory is read-only); otherwise IoError "the ranks do not see the
  // same file" on every rank. The communicator must outlive the reader.
  Reader(Communicator& comm, const std::string& path);
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;
  ~Reader();

  const Header& header() const noexcept;
  const std::string& path() const noexcept;

  // Collective: each rank reads its own ranges (any number, none included)
  // with one collective MPI-IO call. With `verify` and a file that has
  // checksums, every chunk a range touches is read whole and its checksum
  // checked. If anything fails on any rank, every rank throws the same
  // error (CheckpointError naming the tensor and chunk whose checksum
  // differs, IoError for a failed read); the ranges' buffers may then hold
  // partial data.
  void read(const std::vector<ReadRange>& ranges, bool verify = true);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
}  // namespace shardopt
