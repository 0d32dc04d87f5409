// shardopt: reading checkpoint files in parallel with MPI-IO (the writer is
// io.cpp).
//
// Reading. A range is read straight into the caller's buffer where it
// covers whole chunks; the chunks it covers only partly are read whole into
// a scratch buffer, so that every chunk touched can be checked. Reads go a
// chunk at a time, each chunk hashed right after its read, still in cache.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/format.hpp"
#include "ckpt/mpi_io.hpp"
#include "comm/agree.hpp"
#include "common/check.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt::ckpt {
using namespace mpi_io;

// ---------------------------------------------------------------------------
// Reader

struct Reader::Impl {
  Communicator* comm = nullptr;
  std::string path;
  Header header;
  MPI_File fh = MPI_FILE_NULL;
};

namespace {

// Rank 0: the file's size and header text, or an error.
std::string read_header_text(const std::string& path, std::uint64_t& file_bytes,
                             std::string& error) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    error = "cannot read '" + path + "': it is a directory, not a checkpoint file";
    return {};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open '" + path + "': " + errno_text(errno);
    return {};
  }
  in.seekg(0, std::ios::end);
  file_bytes = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char len[8];
  if (file_bytes < 8 || !in.read(reinterpret_cast<char*>(len), 8)) {
    error = "'" + path + "' is " + std::to_string(file_bytes) +
            " bytes long, too short for a safetensors file (it starts with an 8-byte header "
            "length)";
    return {};
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > kMaxHeaderBytes) {
    error = "'" + path + "' declares a header of " + std::to_string(n) +
            " bytes, over the limit of " + std::to_string(kMaxHeaderBytes) +
            " (not a safetensors file, or a corrupted first 8 bytes)";
    return {};
  }
  if (8 + n > file_bytes) {
    error = "'" + path + "' declares a header of " + std::to_string(n) + " bytes but the file is " +
            std::to_string(file_bytes) + " bytes long (truncated, or not a safetensors file)";
    return {};
  }
  std::string text(static_cast<std::size_t>(n), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(n))) {
    error = "cannot read the header of '" + path + "': " + errno_text(errno);
    return {};
  }
  return text;
}

// A rank other than 0: "" if the file at path is `file_bytes` long and
// starts with rank 0's 8-byte length and header text, else what this rank
// finds there. Two files with the same header hold the same checksums, so
// they are the same checkpoint, whatever their copies.
std::string check_same_header(const std::string& path, const std::string& text,
                              std::uint64_t file_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open it: " + errno_text(errno);
  in.seekg(0, std::ios::end);
  const auto bytes = static_cast<std::uint64_t>(in.tellg());
  if (bytes != file_bytes) return "finds a file of " + std::to_string(bytes) + " bytes there";
  in.seekg(0);
  std::string got(8 + text.size(), '\0');
  if (!in.read(got.data(), static_cast<std::streamsize>(got.size())))
    return "cannot read it: " + errno_text(errno);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(got[i]);
  if (n != text.size() || got.compare(8, std::string::npos, text) != 0)
    return "finds another file there (its header differs)";
  return {};
}

// Rank 0: a small file beside path holding token, for the other ranks to
// read back; "" where none can be created (a read-only directory: then the
// headers alone are compared).
std::string create_probe(const std::string& path, const std::string& token) {
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".probe-%08x", static_cast<unsigned>(rd()));
    const std::string probe = path + suffix;
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return {};
    }
    const bool written =
        ::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
    ::close(fd);
    if (written) return probe;
    ::unlink(probe.c_str());
    return {};
  }
  return {};
}

}  // namespace

Header read_header(const std::string& path) {
  std::string error;
  std::uint64_t file_bytes = 0;
  const std::string text = read_header_text(path, file_bytes, error);
  if (!error.empty()) {
    const bool io = error.rfind("cannot", 0) == 0;
    throw_error(io ? ErrorCode::io : ErrorCode::checkpoint, error,
                io ? "check the path and that this process can read it"
                   : "pass a checkpoint written by shardopt (or another safetensors file)",
                __FILE__, __LINE__);
  }
  return parse_header(text, file_bytes);
}

Reader::Reader(Communicator& comm, const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->comm = &comm;
  impl_->path = path;
  agree_on_path(comm, path);
  std::string error, text;
  std::uint64_t file_bytes = 0;
  ErrorCode code = ErrorCode::checkpoint;
  if (comm.rank() == 0) {
    text = read_header_text(path, file_bytes, error);
    if (!error.empty() && error.rfind("cannot", 0) == 0) code = ErrorCode::io;
  }
  // Rank 0's verdict, on every rank.
  std::int64_t info[2] = {static_cast<std::int64_t>(file_bytes), static_cast<std::int64_t>(code)};
  comm.broadcast(info, 2, DType::i64, 0);
  error = broadcast_string(comm, error);
  if (!error.empty())
    throw_error(static_cast<ErrorCode>(info[1]), error,
                static_cast<ErrorCode>(info[1]) == ErrorCode::io
                    ? "check the path and that the job can read it"
                    : "pass a checkpoint written by shardopt (or another safetensors file)",
                __FILE__, __LINE__);
  text = broadcast_string(comm, std::move(text));
  // Every rank parses the same bytes: the same header or the same error.
  impl_->header = parse_header(text, static_cast<std::uint64_t>(info[0]));
  // Every rank must see the file rank 0 read before the collective open:
  // ranks that see none, or another one (a node-local directory), would
  // hang in it or read other data. The same header is not enough: a copy on
  // each node holds it too, and Open MPI's MPI_File_open hangs on copies
  // (its shared file pointer lives in a file beside the one opened, which
  // every rank must see); so rank 0 also writes a token in a file beside
  // it, where it can, for the others to read back.
  std::string token = comm.rank() == 0 ? random_token(kTokenBytes) : std::string(kTokenBytes, '\0');
  std::string probe =
      comm.rank() == 0 && comm.size() > 1 ? create_probe(path, token) : std::string();
  probe = broadcast_string(comm, token + probe);
  token = probe.substr(0, kTokenBytes);
  probe.erase(0, kTokenBytes);
  std::string local;
  if (comm.rank() != 0) {
    local = check_same_header(path, text, static_cast<std::uint64_t>(info[0]));
    if (local.empty() && !probe.empty()) local = check_token(probe, token);
  }
  error = same_file_verdict(comm, path, local,
                            "read a checkpoint of " + std::to_string(info[0]) + " bytes there" +
                                (probe.empty() ? "" : " and wrote '" + probe + "' beside it"));
  if (comm.rank() == 0 && !probe.empty()) ::unlink(probe.c_str());
  if (!error.empty())
    throw_error(ErrorCode::io, error,
                std::string(kSharedFileSystemHint) +
                    " (a copy on each node does not do: every rank opens the one file)",
                __FILE__, __LINE__);
  // An absolute name: Open MPI 4.1 fails to open some short relative ones
  // (a one-character file name).
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(path, ec).string();
  int rc = MPI_File_open(comm.mpi_comm(), ec ? path.c_str() : abs.c_str(), MPI_MODE_RDONLY,
                         MPI_INFO_NULL, &impl_->fh);
  error = rc == MPI_SUCCESS ? std::string() : "cannot open '" + path + "': " + mpi_text(rc);
  std::int64_t failed = error.empty() ? 0 : 1;
  comm.allreduce(&failed, &failed, 1, DType::i64, ReduceOp::max);
  if (failed != 0) {
    if (impl_->fh != MPI_FILE_NULL) MPI_File_close(&impl_->fh);
    agree_or_throw(comm, error, ErrorCode::io,
                   "every rank must see the file (a shared file system)");
  }
}

Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;

Reader::~Reader() {
  if (impl_ && impl_->fh != MPI_FILE_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_File_close(&impl_->fh);
  }
}

const Header& Reader::header() const noexcept { return impl_->header; }
const std::string& Reader::path() const noexcept { return impl_->path; }

void Reader::read(const std::vector<ReadRange>& ranges, bool verify) {
  Communicator& comm = *impl_->comm;
  const Header& h = impl_->header;
  const std::uint64_t chunk = verify ? h.chunk_bytes : 0;
  std::string error;
  for (const ReadRange& r : ranges) {
    if (r.tensor >= h.tensors.size() || r.offset > h.tensors[r.tensor].bytes() ||
        r.bytes > h.tensors[r.tensor].bytes() - r.offset || (r.bytes > 0 && r.dst == nullptr)) {
      error = "read: a range (tensor " + std::to_string(r.tensor) + ", offset " +
              std::to_string(r.offset) + ", " + std::to_string(r.bytes) +
              " bytes) is outside the file's tensors or has no buffer";
      break;
    }
  }
  agree_or_throw(comm, error, ErrorCode::invalid_argument,
                 "pass ranges inside the header's tensors, each with a buffer");

  // Sorted ranges; direct blocks (whole chunks, or everything without
  // checksums) and the partly covered chunks, each read once into scratch.
  std::vector<const ReadRange*> sorted;
  for (const ReadRange& r : ranges)
    if (r.bytes > 0) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](const ReadRange* a, const ReadRange* b) {
    return a->tensor != b->tensor ? a->tensor < b->tensor : a->offset < b->offset;
  });
  struct Staged {  // a chunk read into scratch
    std::size_t tensor;
    std::uint64_t k, lo, hi;
    std::size_t at;  // in scratch
  };
  std::vector<Staged> staged;
  std::vector<Block> blocks;
  std::vector<std::pair<std::size_t, std::uint64_t>> first_chunk;  // per block: tensor, chunk
  std::size_t scratch_bytes = 0;
  const auto stage = [&](std::size_t t, std::uint64_t k) {
    if (!staged.empty() && staged.back().tensor == t && staged.back().k == k) return;
    const std::uint64_t lo = k * chunk, hi = std::min(lo + chunk, h.tensors[t].bytes());
    staged.push_back({t, k, lo, hi, scratch_bytes});
    scratch_bytes += hi - lo;
  };
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const ReadRange& r = *sorted[i];
    if (i > 0 && sorted[i - 1]->tensor == r.tensor &&
        sorted[i - 1]->offset + sorted[i - 1]->bytes > r.offset)
      error = "read: two ranges of tensor '" + h.tensors[r.tensor].name + "' overlap";
    const std::uint64_t end = r.offset + r.bytes, tbytes = h.tensors[r.tensor].bytes();
    if (chunk == 0) {
      blocks.push_back({h.data_start + h.tensors[r.tensor].begin + r.offset,
                        static_cast<std::byte*>(r.dst), r.bytes});
      continue;
    }
    // Whole chunks inside [offset, end): [a, b) in tensor bytes (the last
    // chunk of a tensor may be short). They are read straight into dst; the
    // other chunks the range touches are staged.
    const std::uint64_t a = (r.offset + chunk - 1) / chunk * chunk;
    const std::uint64_t b = end == tbytes ? end : end / chunk * chunk;
    if (a < b) {
      blocks.push_back({h.data_start + h.tensors[r.tensor].begin + a,
                        static_cast<std::byte*>(r.dst) + (a - r.offset), b - a});
      first_chunk.emplace_back(r.tensor, a / chunk);
    }
    for (std::uint64_t k = r.offset / chunk; k <= (end - 1) / chunk; ++k)
      if (!(a < b && k * chunk >= a && k * chunk < b)) stage(r.tensor, k);
  }
  std::vector<std::byte> scratch(scratch_bytes);
  // Two ranges may share a chunk: stage it once.
  std::sort(staged.begin(), staged.end(), [](const Staged& x, const Staged& y) {
    return x.tensor != y.tensor ? x.tensor < y.tensor : x.k < y.k;
  });
  staged.erase(std::unique(staged.begin(), staged.end(),
                           [](const Staged& x, const Staged& y) {
                             return x.tensor == y.tensor && x.k == y.k;
                           }),
               staged.end());
  for (const Staged& s : staged) {
    blocks.push_back(
        {h.data_start + h.tensors[s.tensor].begin + s.lo, scratch.data() + s.at, s.hi - s.lo});
    first_chunk.emplace_back(s.tensor, s.k);
  }
  // Every chunk touched is hashed right after its read, while it is in
  // cache: the direct blocks start on a chunk and are read a chunk at a time.
  bool corrupt = false;
  const auto verify_piece = [&](std::size_t i, std::uint64_t off, std::uint64_t n) -> std::string {
    if (chunk == 0) return {};
    const TensorInfo& ti = h.tensors[first_chunk[i].first];
    const std::uint64_t k = first_chunk[i].second + off / chunk;
    const std::uint64_t got = XXH3_64bits(blocks[i].mem + off, n);
    if (got == ti.chunks[k]) return {};
    corrupt = true;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%016llx, expected %016llx",
                  static_cast<unsigned long long>(got),
                  static_cast<unsigned long long>(ti.chunks[k]));
    return "checksum mismatch in tensor '" + ti.name + "', chunk " + std::to_string(k) +
           " (its bytes " + std::to_string(k * chunk) + " to " + std::to_string(k * chunk + n) +
           ", file offset " + std::to_string(h.data_start + ti.begin + k * chunk) +
           "): the data is corrupted (XXH3 " + buf + ")";
  };
  agree_or_throw(comm, error, ErrorCode::invalid_argument, "pass ranges that do not overlap");
  error = read_blocks(impl_->fh, blocks, chunk ? chunk : kMaxBlock, verify_piece);
  // Two agreed verdicts, each with one code and hint on every rank: the
  // I/O errors first (a rank that met corrupted data stopped reading).
  agree_or_throw(
      comm, corrupt || error.empty() ? std::string() : "reading '" + impl_->path + "': " + error,
      ErrorCode::io, "check that the file is complete and readable");
  agree_or_throw(comm, corrupt ? error : std::string(), ErrorCode::checkpoint,
                 "the file is corrupted: restore it from a copy, or load an older checkpoint "
                 "(path.1, ... with keep_last)");
  if (chunk == 0) return;

  // Copy the staged parts of the partly covered chunks into the buffers.
  for (const ReadRange* r : sorted) {
    const std::uint64_t end = r->offset + r->bytes, tbytes = h.tensors[r->tensor].bytes();
    const std::uint64_t a = (r->offset + chunk - 1) / chunk * chunk;
    const std::uint64_t b = end == tbytes ? end : end / chunk * chunk;
    for (const Staged& s : staged) {
      if (s.tensor != r->tensor) continue;
      const std::uint64_t lo = std::max(s.lo, r->offset), hi = std::min(s.hi, end);
      if (lo >= hi) continue;
      if (lo >= a && hi <= b) continue;  // read directly
      std::memcpy(static_cast<std::byte*>(r->dst) + (lo - r->offset),
                  scratch.data() + s.at + (lo - s.lo), hi - lo);
    }
  }
}

}  // namespace shardopt::ckpt
