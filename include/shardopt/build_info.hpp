// shardopt: what this build of the library contains and what it finds at
// run time. Useful at the top of a job's log.
#pragma once

#include <string>

#include "shardopt/export.h"

namespace shardopt {

struct BuildInfo {
  std::string version;           // the library's version
  bool cuda = false;             // CUDA support compiled in
  bool nccl = false;             // NCCL support compiled in
  int cuda_runtime_version = 0;  // e.g. 13000; 0 without CUDA
  int cuda_devices = 0;          // devices visible to this process; 0 without CUDA
  int nccl_version = 0;          // e.g. 22703; 0 without NCCL
  std::string mpi_library;       // MPI_Get_library_version, first line
  bool mpi_cuda_aware = false;   // MPIX_Query_cuda_support(), when MPI is running
};

// Local; callable before MPI_Init (then mpi_cuda_aware is false). Never throws.
SHARDOPT_API BuildInfo build_info() noexcept;

// One line: "shardopt 0.1.0 (cuda 13.0, 1 device; nccl 2.27.3; Open MPI v4.1.4)".
SHARDOPT_API std::string build_info_string();

}  // namespace shardopt
