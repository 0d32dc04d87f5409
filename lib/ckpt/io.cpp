// shardopt: writing checkpoint files in parallel with MPI-IO (the reader is
// reader.cpp).
//
// Writing. Every rank knows the whole map of pieces (which rank holds which
// bytes of which tensor), so every rank computes the same header, the same
// file offsets and the same checksum plan without asking the others. A
// chunk is checksummed by the rank holding its first byte; the bytes of it
// that other ranks hold (only where a chunk straddles two ranks' pieces)
// are sent to that rank with one alltoallv. The checksums are summed onto
// rank 0, which puts them in the header; then every rank writes its pieces
// (rank 0 also the header) with one collective write through a file view,
// straight from the caller's buffers.
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

namespace {

// Collective over the file's communicator: one collective write of the
// blocks through a file view. Returns "" or what went wrong on this rank.
std::string write_all(MPI_File fh, std::vector<Block> blocks) {
  std::sort(blocks.begin(), blocks.end(),
            [](const Block& a, const Block& b) { return a.file < b.file; });
  blocks.erase(
      std::remove_if(blocks.begin(), blocks.end(), [](const Block& b) { return b.bytes == 0; }),
      blocks.end());
  const std::uint64_t expected = total_bytes(blocks);
  BlockTypes types(blocks);
  int rc = MPI_File_set_view(fh, 0, MPI_BYTE, types.file, "native", MPI_INFO_NULL);
  if (rc != MPI_SUCCESS) return "MPI_File_set_view failed: " + mpi_text(rc);
  MPI_Status status;
  rc = MPI_File_write_all(fh, MPI_BOTTOM, 1, types.mem, &status);
  std::string error;
  if (rc != MPI_SUCCESS) {
    error = "MPI_File_write_all failed: " + mpi_text(rc);
  } else {
    MPI_Count done = 0;
    MPI_Get_elements_x(&status, MPI_BYTE, &done);
    if (expected > 0 && static_cast<std::uint64_t>(done) != expected)
      error = "wrote " + std::to_string(done) + " of " + std::to_string(expected) +
              " bytes (is the file system full?)";
  }
  // Back to the plain byte view (collective too).
  rc = MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL);
  if (rc != MPI_SUCCESS && error.empty()) error = "MPI_File_set_view failed: " + mpi_text(rc);
  return error;
}

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Rank 0: a fresh temporary name in path's directory, created with its
// space reserved (so that a directory that cannot be written to, or a full
// disk, is reported with its errno) and `token` at its start.
std::string create_temporary(const std::string& path, std::uint64_t bytes, const std::string& token,
                             std::string& error) {
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".tmp-%08x", static_cast<unsigned>(rd()));
    const std::string tmp = path + suffix;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      // Reserve the space now: a full disk or a file size limit is then
      // reported here, plainly, rather than by writes in the middle of the
      // collective one (which some MPI-IO implementations only print).
      // File systems without fallocate (some parallel ones) skip this.
      if (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP &&
          errno != ENOSYS) {
        error = "cannot reserve " + std::to_string(bytes) + " bytes for '" + tmp +
                "': " + errno_text(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        return {};
      }
      if (::pwrite(fd, token.data(), token.size(), 0) != static_cast<ssize_t>(token.size())) {
        error = "cannot write to '" + tmp + "': " + errno_text(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        return {};
      }
      ::close(fd);
      return tmp;
    }
    if (errno != EEXIST) {
      error =
          "cannot create '" + tmp + "' in directory '" + dir_of(path) + "': " + errno_text(errno);
      return {};
    }
  }
  error = "cannot find a free temporary name beside '" + path + "'";
  return {};
}

// Whether the file at p is a checkpoint worth keeping in the rotation: its
// header reads and its tensors reach its last byte (not truncated, not some
// other file). Its data is not read.
bool readable_checkpoint(const std::string& p) {
  try {
    (void)read_header(p);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Rank 0: the atomic rename of tmp to `path`, with the rotation of
// WriteOptions::keep_last, then a sync of the directory. "" or the error.
//
// Nothing that exists is removed before the new file is at `path`: the
// current file first gets a second name (a hard link, so that a valid
// checkpoint stays at `path` throughout), tmp is renamed over `path`, and
// only then do the older ones move down (the oldest dropping out) and the
// second name become path.1. A failure before the rename leaves every file
// as it was. A file at `path` that is not a readable checkpoint is replaced
// without entering the rotation, so that path.1, ... keep the valid ones.
std::string publish(const std::string& tmp, const std::string& path, int keep_last) {
  const auto exists = [](const std::string& p) { return ::access(p.c_str(), F_OK) == 0; };
  const auto sync_dir = [&] {
    const int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  };
  if (keep_last <= 1 || !exists(path) || !readable_checkpoint(path)) {
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      return "cannot rename '" + tmp + "' to '" + path + "': " + errno_text(errno);
    sync_dir();
    return {};
  }
  // The current file's second name, beside tmp (whose name is this save's own).
  const std::string previous = tmp + ".previous";
  ::unlink(previous.c_str());
  bool moved = false;  // no hard links here: the current file moved instead
  if (::link(path.c_str(), previous.c_str()) != 0) {
    const int link_errno = errno;
    if (std::rename(path.c_str(), previous.c_str()) != 0)
      return "cannot link '" + path + "' to '" + previous + "': " + errno_text(link_errno);
    moved = true;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text(errno);
    if (moved)
      std::rename(previous.c_str(), path.c_str());
    else
      ::unlink(previous.c_str());
    return "cannot rename '" + tmp + "' to '" + path + "': " + why;
  }
  // The new checkpoint is at `path`: the older ones move down a place.
  for (int i = keep_last - 1; i >= 2; --i) {
    const std::string from = path + "." + std::to_string(i - 1);
    const std::string to = path + "." + std::to_string(i);
    if (exists(from) && std::rename(from.c_str(), to.c_str()) != 0)
      return "the checkpoint is at '" + path +
             "', but the older ones could not rotate: cannot "
             "rename '" +
             from + "' to '" + to + "': " + errno_text(errno) +
             "; the previous checkpoint is at '" + previous + "'";
  }
  const std::string one = path + ".1";
  if (std::rename(previous.c_str(), one.c_str()) != 0)
    return "the checkpoint is at '" + path + "', but cannot rename the previous one, '" + previous +
           "', to '" + one + "': " + errno_text(errno);
  sync_dir();
  return {};
}

// The pieces of each tensor sorted by offset; throws InvalidArgument unless
// they cover every tensor exactly.
std::vector<std::vector<const Piece*>> pieces_by_tensor(const std::vector<WriteTensor>& tensors,
                                                        const std::vector<std::uint64_t>& sizes,
                                                        const std::vector<Piece>& pieces,
                                                        int nranks, int rank) {
  std::vector<std::vector<const Piece*>> by(tensors.size());
  for (const Piece& p : pieces) {
    if (p.tensor >= tensors.size())
      SHARDOPT_THROW(invalid_argument,
                     "write_file: a piece names tensor " + std::to_string(p.tensor) + " of " +
                         std::to_string(tensors.size()),
                     "pass pieces whose tensor indices are below the number of tensors");
    if (p.owner < 0 || p.owner >= nranks)
      SHARDOPT_THROW(invalid_argument,
                     "write_file: a piece of tensor '" + tensors[p.tensor].name + "' has owner " +
                         std::to_string(p.owner),
                     "owners are ranks of the communicator, 0 to size() - 1");
    if (p.owner == rank && p.bytes > 0 && p.data == nullptr)
      SHARDOPT_THROW(
          invalid_argument,
          "write_file: this rank's piece of tensor '" + tensors[p.tensor].name + "' has no data",
          "set Piece::data on the pieces the calling rank owns");
    if (p.bytes > 0) by[p.tensor].push_back(&p);
  }
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    auto& v = by[t];
    std::sort(v.begin(), v.end(),
              [](const Piece* a, const Piece* b) { return a->offset < b->offset; });
    std::uint64_t at = 0;
    for (const Piece* p : v) {
      if (p->offset != at) break;
      at += p->bytes;
    }
    if (at != sizes[t] || (!v.empty() && v.back()->offset + v.back()->bytes != sizes[t]))
      SHARDOPT_THROW(invalid_argument,
                     "write_file: the pieces of tensor '" + tensors[t].name +
                         "' do not cover its " + std::to_string(sizes[t]) +
                         " bytes exactly (a gap or an overlap near byte " + std::to_string(at) +
                         ")",
                     "give every byte of every tensor to exactly one piece");
  }
  return by;
}

}  // namespace

// ---------------------------------------------------------------------------
// write_file

void write_file(Communicator& comm, const std::string& path,
                const std::vector<WriteTensor>& tensors, const std::vector<Piece>& pieces,
                const std::map<std::string, std::string>& metadata, const WriteOptions& options) {
  agree_on_path(comm, path);
  const int rank = comm.rank(), nranks = comm.size();
  const std::uint64_t chunk = options.chunk_bytes;
  // Arguments are checked on every rank and the verdict agreed, so that a
  // bad argument on one rank stops them all instead of leaving them waiting.
  std::string error;
  std::vector<TensorInfo> infos(tensors.size());
  std::vector<std::uint64_t> sizes(tensors.size());
  std::vector<std::vector<const Piece*>> by;
  std::uint64_t data_start = 0;
  try {
    if (path.empty())
      SHARDOPT_THROW(invalid_argument, "write_file: the path is empty", "pass a file path");
    if (chunk == 0 || chunk > kMaxBlock)
      SHARDOPT_THROW(invalid_argument, "write_file: chunk_bytes is " + std::to_string(chunk),
                     "use a checksum chunk size between 1 byte and 1 GiB (default 1 MiB)");
    if (options.keep_last < 1)
      SHARDOPT_THROW(invalid_argument, "keep_last is " + std::to_string(options.keep_last),
                     "keep at least 1 checkpoint (1: replace the file)");
    // The header, with placeholder checksums (as long as the real ones).
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      infos[t].name = tensors[t].name;
      infos[t].dtype = tensors[t].dtype;
      infos[t].shape = tensors[t].shape;
      std::uint64_t n = dtype_bytes(tensors[t].dtype);
      for (std::uint64_t d : tensors[t].shape) n *= d;
      sizes[t] = n;
      infos[t].chunks.assign(detail::chunk_count(n, chunk), 0);
    }
    data_start = detail::build_header(infos, metadata, chunk).size();
    by = pieces_by_tensor(tensors, sizes, pieces, nranks, rank);
  } catch (const Error& e) {
    error = e.message() + " (" + e.hint() + ")";
  }
  agree_or_throw(comm, error, ErrorCode::invalid_argument,
                 "fix the argument named on the rank(s) named");
  if (!shardopt::detail::all_equal(
          comm, {static_cast<std::int64_t>(chunk), options.keep_last,
                 static_cast<std::int64_t>(tensors.size()),
                 static_cast<std::int64_t>(pieces.size()), static_cast<std::int64_t>(data_start)}))
    agree_or_throw(comm, "the ranks passed different tensors, pieces or options",
                   ErrorCode::invalid_argument,
                   "pass the same tensors, pieces (the whole map) and options on every rank");

  // The checksum plan, walked in the same order by every rank: tensor by
  // tensor, piece by piece, chunk by chunk. Chunk (t, k) is checksummed by
  // the owner of its first byte.
  const auto assignee = [&](std::size_t t, std::uint64_t k) {
    const std::uint64_t at = k * chunk;
    const auto& v = by[t];
    auto it = std::upper_bound(v.begin(), v.end(), at,
                               [](std::uint64_t x, const Piece* p) { return x < p->offset; });
    return (*(it - 1))->owner;
  };
  struct Part {  // the part of piece p inside chunk k
    std::size_t t;
    std::uint64_t k, lo, hi;  // tensor bytes [lo, hi)
    const Piece* p;
    int to;
  };
  std::vector<Part> plan;
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (const Piece* p : by[t])
      for (std::uint64_t k = p->offset / chunk; k * chunk < p->offset + p->bytes; ++k) {
        const std::uint64_t lo = std::max(p->offset, k * chunk);
        const std::uint64_t hi = std::min(p->offset + p->bytes, (k + 1) * chunk);
        plan.push_back({t, k, lo, hi, p, assignee(t, k)});
      }
  std::vector<std::int64_t> sendc(nranks, 0), recvc(nranks, 0);
  for (const Part& x : plan) {
    if (x.p->owner == x.to) continue;
    if (x.p->owner == rank) sendc[x.to] += static_cast<std::int64_t>(x.hi - x.lo);
    if (x.to == rank) recvc[x.p->owner] += static_cast<std::int64_t>(x.hi - x.lo);
  }
  std::vector<int> sc(nranks), rc(nranks), sd(nranks), rd(nranks);
  std::int64_t stotal = 0, rtotal = 0;
  for (int r = 0; r < nranks; ++r) {
    if (stotal + sendc[r] > INT_MAX || rtotal + recvc[r] > INT_MAX)
      SHARDOPT_THROW(unsupported, "write_file: over 2 GiB of chunk boundaries to exchange",
                     "use a smaller chunk_bytes");
    sd[r] = static_cast<int>(stotal);
    rd[r] = static_cast<int>(rtotal);
    sc[r] = static_cast<int>(sendc[r]);
    rc[r] = static_cast<int>(recvc[r]);
    stotal += sendc[r];
    rtotal += recvc[r];
  }
  std::vector<std::byte> sendbuf(static_cast<std::size_t>(stotal)),
      recvbuf(static_cast<std::size_t>(rtotal));
  {
    std::vector<int> at = sd;
    for (const Part& x : plan)
      if (x.p->owner == rank && x.to != rank) {
        std::memcpy(sendbuf.data() + at[x.to],
                    static_cast<const std::byte*>(x.p->data) + (x.lo - x.p->offset), x.hi - x.lo);
        at[x.to] += static_cast<int>(x.hi - x.lo);
      }
  }
  SHARDOPT_CHECK_MPI(MPI_Alltoallv(sendbuf.data(), sc.data(), sd.data(), MPI_BYTE, recvbuf.data(),
                                   rc.data(), rd.data(), MPI_BYTE, comm.mpi_comm()),
                     "exchanging the bytes of checksum chunks that straddle ranks");

  // This rank's chunks, streamed in order, then summed onto every rank
  // (each chunk has one non-zero contributor).
  std::vector<std::uint64_t> first_chunk(tensors.size() + 1, 0);
  for (std::size_t t = 0; t < tensors.size(); ++t)
    first_chunk[t + 1] = first_chunk[t] + infos[t].chunks.size();
  std::vector<std::int64_t> sums(first_chunk.back(), 0);
  {
    XXH3_state_t* st = XXH3_createState();
    std::vector<int> at = rd;
    bool open = false;
    std::uint64_t index = 0;
    for (const Part& x : plan) {
      if (x.to != rank) continue;
      const std::uint64_t id = first_chunk[x.t] + x.k;
      if (!open || id != index) {
        if (open) sums[index] = static_cast<std::int64_t>(XXH3_64bits_digest(st));
        XXH3_64bits_reset(st);
        open = true;
        index = id;
      }
      if (x.p->owner == rank) {
        XXH3_64bits_update(st, static_cast<const std::byte*>(x.p->data) + (x.lo - x.p->offset),
                           x.hi - x.lo);
      } else {
        XXH3_64bits_update(st, recvbuf.data() + at[x.p->owner], x.hi - x.lo);
        at[x.p->owner] += static_cast<int>(x.hi - x.lo);
      }
    }
    if (open) sums[index] = static_cast<std::int64_t>(XXH3_64bits_digest(st));
    XXH3_freeState(st);
  }
  if (!sums.empty())
    comm.allreduce(sums.data(), sums.data(), sums.size(), DType::i64, ReduceOp::sum);
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (std::size_t k = 0; k < infos[t].chunks.size(); ++k)
      infos[t].chunks[k] = static_cast<std::uint64_t>(sums[first_chunk[t] + k]);
  std::string header;
  if (rank == 0) {
    header = detail::build_header(infos, metadata, chunk);
    if (header.size() != data_start)
      SHARDOPT_THROW(internal, "write_file: the header changed length with its checksums",
                     "report this as a bug in shardopt");
  }

  // The temporary file, created by rank 0 and agreed on.
  std::uint64_t file_bytes = data_start;
  for (std::uint64_t n : sizes) file_bytes += n;
  // A random token at its start, which every rank reads back before any
  // collective MPI-IO call: ranks that do not see the file rank 0 created
  // (a node-local directory) are found here instead of hanging in
  // MPI_File_open. The header overwrites it.
  const auto token_bytes =
      static_cast<std::size_t>(std::min<std::uint64_t>(kTokenBytes, file_bytes));
  std::string token = rank == 0 ? random_token(token_bytes) : std::string(token_bytes, '\0');
  std::string tmp = rank == 0 ? create_temporary(path, file_bytes, token, error) : std::string();
  agree_or_throw(comm, error, ErrorCode::io,
                 "check that the checkpoint's directory exists and is writable by the job, "
                 "and that its file system has room for the checkpoint (and the job's file size "
                 "limit, ulimit -f, allows it); the previous checkpoint is untouched");
  tmp = broadcast_string(comm, token + tmp);
  token = tmp.substr(0, token.size());
  tmp.erase(0, token.size());
  const auto remove_tmp = [&] {
    if (rank == 0) ::unlink(tmp.c_str());
  };
  error = same_file_verdict(comm, path, rank == 0 ? std::string() : check_token(tmp, token),
                            "created the temporary file '" + tmp + "' there");
  if (!error.empty()) {
    remove_tmp();
    throw_error(ErrorCode::io, error,
                std::string(kSharedFileSystemHint) + "; the previous checkpoint is untouched",
                __FILE__, __LINE__);
  }

  MPI_File fh = MPI_FILE_NULL;
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(tmp, ec).string();
  int mrc = MPI_File_open(comm.mpi_comm(), ec ? tmp.c_str() : abs.c_str(), MPI_MODE_WRONLY,
                          MPI_INFO_NULL, &fh);
  if (mrc != MPI_SUCCESS) error = "cannot open '" + tmp + "' for writing: " + mpi_text(mrc);
  std::int64_t failed = error.empty() ? 0 : 1;
  comm.allreduce(&failed, &failed, 1, DType::i64, ReduceOp::max);
  if (failed != 0) {
    // The ranks that opened it must close it (collectively) before the error.
    if (fh != MPI_FILE_NULL) MPI_File_close(&fh);
    remove_tmp();
    agree_or_throw(comm, error.empty() ? std::string() : error, ErrorCode::io,
                   "every rank must see the checkpoint's directory (a shared file system)");
  }

  std::vector<Block> blocks;
  if (rank == 0) blocks.push_back({0, reinterpret_cast<std::byte*>(header.data()), header.size()});
  std::vector<std::uint64_t> begin(tensors.size(), 0);
  for (std::size_t t = 0; t < tensors.size(); ++t) begin[t] = infos[t].begin;
  for (const Piece& p : pieces)
    if (p.owner == rank && p.bytes > 0)
      blocks.push_back({data_start + begin[p.tensor] + p.offset,
                        static_cast<std::byte*>(const_cast<void*>(p.data)), p.bytes});
  error = write_all(fh, std::move(blocks));
  if (error.empty()) {
    mrc = MPI_File_sync(fh);
    if (mrc != MPI_SUCCESS) error = "MPI_File_sync failed: " + mpi_text(mrc);
  } else {
    MPI_File_sync(fh);  // collective: the other ranks call it
  }
  mrc = MPI_File_close(&fh);
  if (mrc != MPI_SUCCESS && error.empty()) error = "MPI_File_close failed: " + mpi_text(mrc);
  if (!error.empty()) error = "writing '" + tmp + "': " + error;
  failed = error.empty() ? 0 : 1;
  comm.allreduce(&failed, &failed, 1, DType::i64, ReduceOp::max);
  if (failed != 0) {
    remove_tmp();
    agree_or_throw(comm, error, ErrorCode::io,
                   "free space on the checkpoint's file system (or raise the job's file size "
                   "limit) and save again; the previous checkpoint is untouched");
  }

  // Every rank's data is on disk: rank 0 renames, everybody learns how it went.
  if (rank == 0) {
    error = publish(tmp, path, options.keep_last);
    if (!error.empty()) remove_tmp();
  }
  error = broadcast_string(comm, error);
  if (!error.empty())
    agree_or_throw(comm, rank == 0 ? error : std::string(), ErrorCode::io,
                   "check the permissions of the checkpoint's directory; the previous "
                   "checkpoint is untouched");
}

}  // namespace shardopt::ckpt
