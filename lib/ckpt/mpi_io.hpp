// shardopt: what the checkpoint writer (io.cpp) and reader (reader.cpp)
// share: MPI-IO block transfers, error texts and the path and header
// agreements (internal to lib/ckpt).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/agree.hpp"
#include "common/check.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt::ckpt::mpi_io {

using shardopt::detail::throw_error;

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
