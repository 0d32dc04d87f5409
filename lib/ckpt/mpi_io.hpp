// shardopt: what the checkpoint writer (io.cpp) and reader (reader.cpp)
// share: MPI-IO block transfers, error texts and the path and header
// agreements (internal to lib/ckpt).
#pragma once

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/agree.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt::ckpt::mpi_io {

using shardopt::detail::throw_error;

// Blocks of a file view are at most this long (MPI counts are ints).
constexpr std::uint64_t kMaxBlock = std::uint64_t{1} << 30;

inline std::string errno_text(int e) { return std::string(std::strerror(e)); }

inline std::string mpi_text(int rc) { return shardopt::detail::mpi_error_string(rc); }

// One contiguous transfer: `bytes` bytes at file offset `file` from or to
// memory `mem`.
struct Block {
  std::uint64_t file = 0;
  std::byte* mem = nullptr;
  std::uint64_t bytes = 0;
};

// An MPI datatype pair describing blocks (sorted by file offset, not
// overlapping): the file view type (displacements from offset 0) and the
// memory type (absolute addresses, used with MPI_BOTTOM).
struct BlockTypes {
  MPI_Datatype file = MPI_DATATYPE_NULL;
  MPI_Datatype mem = MPI_DATATYPE_NULL;
  BlockTypes(const BlockTypes&) = delete;
  BlockTypes& operator=(const BlockTypes&) = delete;
  explicit BlockTypes(const std::vector<Block>& blocks) {
    std::vector<int> lens;
    std::vector<MPI_Aint> fdisp, mdisp;
    for (const Block& b : blocks) {
      for (std::uint64_t done = 0; done < b.bytes;) {
        const std::uint64_t n = std::min(kMaxBlock, b.bytes - done);
        lens.push_back(static_cast<int>(n));
        fdisp.push_back(static_cast<MPI_Aint>(b.file + done));
        MPI_Aint a = 0;
        MPI_Get_address(b.mem + done, &a);
        mdisp.push_back(a);
        done += n;
      }
    }
    if (lens.empty()) {  // a rank with nothing to transfer still takes part
      lens.push_back(0);
      fdisp.push_back(0);
      mdisp.push_back(0);
    }
    const int n = static_cast<int>(lens.size());
    MPI_Type_create_hindexed(n, lens.data(), fdisp.data(), MPI_BYTE, &file);
    MPI_Type_commit(&file);
    MPI_Type_create_hindexed(n, lens.data(), mdisp.data(), MPI_BYTE, &mem);
    MPI_Type_commit(&mem);
  }
  ~BlockTypes() {
    if (file != MPI_DATATYPE_NULL) MPI_Type_free(&file);
    if (mem != MPI_DATATYPE_NULL) MPI_Type_free(&mem);
  }
};

inline std::uint64_t total_bytes(const std::vector<Block>& blocks) {
  std::uint64_t t = 0;
  for (const Block& b : blocks) t += b.bytes;
  return t;
}

// Local: reads the blocks, each with its own independent calls of at most
// `piece` bytes, and hands every piece to after(block, offset in block,
// bytes) while it is still in cache; stops at the first error after()
// returns. Reads are independent rather than collective because the default
// collective read component of Open MPI 4.1 (ompio's vulcan and dynamic)
// returns wrong data for some sets of ranges (open-mpi/ompi#10546), which
// the checksums catch but cannot repair. Returns "" or what went wrong.
template <class After>
std::string read_blocks(MPI_File fh, const std::vector<Block>& blocks, std::uint64_t piece,
                        After&& after) {
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    for (std::uint64_t done = 0; done < b.bytes;) {
      const std::uint64_t n = std::min(piece, b.bytes - done);
      MPI_Status status;
      const int rc = MPI_File_read_at(fh, static_cast<MPI_Offset>(b.file + done), b.mem + done,
                                      static_cast<int>(n), MPI_BYTE, &status);
      if (rc != MPI_SUCCESS) return "MPI_File_read_at failed: " + mpi_text(rc);
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      if (static_cast<std::uint64_t>(got) != n)
        return "read " + std::to_string(got) + " of " + std::to_string(n) + " bytes at offset " +
               std::to_string(b.file + done) + " (is the file truncated?)";
      std::string error = after(i, done, n);
      if (!error.empty()) return error;
      done += n;
    }
  }
  return {};
}

// Collective: throws on every rank unless every rank passed the same path.
inline void agree_on_path(Communicator& comm, const std::string& path) {
  if (shardopt::detail::all_equal(comm, {shardopt::detail::fingerprint(path)})) return;
  agree_or_throw(comm, shardopt::detail::first_difference(comm, "path=" + path, "the file"),
                 ErrorCode::invalid_argument,
                 "pass the same path on every rank: a checkpoint is one file shared by the ranks");
}

// The length of the random tokens below.
inline constexpr std::size_t kTokenBytes = 16;

// Local: n random bytes.
inline std::string random_token(std::size_t n) {
  std::random_device rd;
  std::string token(n, '\0');
  for (char& c : token) c = static_cast<char>(rd());
  return token;
}

// Local, on a rank other than 0: "" if `file` starts with `token`, as the
// file rank 0 wrote it in does, else what this rank finds there.
inline std::string check_token(const std::string& file, const std::string& token) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return "cannot open '" + file + "': " + errno_text(errno);
  std::string got(token.size(), '\0');
  const ssize_t n = ::pread(fd, got.data(), got.size(), 0);
  const int e = errno;
  ::close(fd);
  if (n < 0) return "cannot read '" + file + "': " + errno_text(e);
  if (static_cast<std::size_t>(n) != token.size() || got != token)
    return "finds another file at '" + file + "' (not the one rank 0 wrote)";
  return {};
}

// The hint of the error below.
inline constexpr const char* kSharedFileSystemHint =
    "put checkpoints in a directory on a file system that every node mounts (a shared or "
    "parallel file system), not in /tmp or node-local scratch";

// Collective: every rank's verdict on whether it sees the file rank 0 sees
// at `path`: "" where it does, else what it finds instead ("cannot open
// it: ..."); `rank0` says what rank 0 did there. Returns "" when every rank
// sees it, else the same message on every rank, naming the first rank that
// does not and its host. A checkpoint is one file that every rank writes or
// reads, so the ranks must share its file system; a node-local directory
// (/tmp, local scratch) at the same path is another file on each node, and
// MPI_File_open on ranks that do not agree on the file can hang (Open MPI's
// ompio goes on with collective calls on the ranks where it opened). One
// allreduce of a flag when every rank sees it.
inline std::string same_file_verdict(Communicator& comm, const std::string& path,
                                     const std::string& local, const std::string& rank0) {
  std::int64_t count = local.empty() ? 0 : 1;
  comm.allreduce(&count, &count, 1, DType::i64, ReduceOp::sum);
  if (count == 0) return {};
  const std::vector<std::string> hosts =
      shardopt::detail::allgather_strings(comm, shardopt::detail::host_name());
  const std::vector<std::string> why = shardopt::detail::allgather_strings(comm, local);
  const auto first = static_cast<std::size_t>(
      std::find_if(why.begin(), why.end(), [](const std::string& w) { return !w.empty(); }) -
      why.begin());
  std::string message = "the ranks do not see the same file at '" + path + "': rank 0 (host " +
                        hosts[0] + ") " + rank0 + ", but rank " + std::to_string(first) +
                        " (host " + hosts[first] + ") " + why[first];
  if (count > 1)
    message += " (" + std::to_string(count) + " of " + std::to_string(comm.size()) +
               " ranks do not see it)";
  return message;
}

// Every rank's copy of rank 0's string.
inline std::string broadcast_string(Communicator& comm, std::string s) {
  std::int64_t n = static_cast<std::int64_t>(s.size());
  comm.broadcast(&n, 1, DType::i64, 0);
  s.resize(static_cast<std::size_t>(n));
  for (std::int64_t done = 0; done < n;) {
    const int c = static_cast<int>(std::min<std::int64_t>(n - done, INT_MAX / 2));
    SHARDOPT_CHECK_MPI(MPI_Bcast(s.data() + done, c, MPI_BYTE, 0, comm.mpi_comm()),
                       "broadcasting a checkpoint header");
    done += c;
  }
  return s;
}

}  // namespace shardopt::ckpt::mpi_io
