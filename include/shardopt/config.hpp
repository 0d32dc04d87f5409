// shardopt: run-time settings from SHARDOPT_* environment variables.
//
// Every variable is declared once in the library, read once (at the first
// use of shardopt in the process) and listed in docs/env.md. A bad value is
// a ConfigError naming the variable and the values it accepts.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "shardopt/export.h"

namespace shardopt {

enum class LogLevel : int { none = 0, warn = 1, info = 2, trace = 3 };

// The widest vector unit the CPU kernels may use; each kernel uses the widest
// one the CPU has up to this cap.
enum class CpuIsa : int { baseline = 0, avx2 = 1, avx512 = 2 };

// How a Communicator moves device buffers (docs/gpu.md):
//   automatic: the device's own stream-ordered collectives (NCCL) when the
//              build has them and every rank has a device of its own, else
//              a CUDA-aware MPI when every rank's MPI says it is one, else
//              staged;
//   nccl:      the device's own collectives; an error where they are not
//              built or some rank has no device;
//   mpi:       MPI on the device buffers themselves (a CUDA-aware MPI); an
//              error where some rank's MPI is not known to be one;
//   staged:    through pinned host memory with any MPI.
enum class DeviceComm : int { automatic = 0, nccl = 1, staged = 2, mpi = 3 };

// How a communicator moves host buffers (SHARDOPT_HOST_COMM,
// CommOptions::host_comm):
//   automatic: shm when every rank is on one node (and there are several),
//              hier when several nodes each hold the same number (two or
//              more) of ranks, else mpi; on one node, the blocking
//              operations and sizes where MPI's own call was measured
//              faster (docs/design.md) go to it, with the same bits;
//   mpi:       Open MPI's (or the MPI's) own collectives;
//   shm:       shardopt's collectives through memory the node's ranks all
//              map; an error where the ranks span several nodes;
//   hier:      shm within each node, MPI across nodes among the ranks with
//              the same place in their node; an error where nodes hold
//              different numbers of ranks.
enum class HostComm : int { automatic = 0, mpi = 1, shm = 2, hier = 3 };

// Whether MPI can be given device buffers (SHARDOPT_CUDA_AWARE_MPI):
// ask asks the MPI library (Open MPI's MPIX_Query_cuda_support, MPICH's
// MPIX_GPU_query_support); yes and no answer for an MPI that cannot say.
enum class CudaAwareMpi : int { ask = 0, yes = 1, no = 2 };

struct Settings {
  LogLevel debug = LogLevel::warn;                  // SHARDOPT_DEBUG
  std::string debug_file;                           // SHARDOPT_DEBUG_FILE ("" = stderr)
  bool huge_pages = true;                           // SHARDOPT_HUGE_PAGES
  std::size_t comm_max_chunk = 2147483647;          // SHARDOPT_COMM_MAX_CHUNK
  bool check_args = false;                          // SHARDOPT_CHECK_ARGS
  CpuIsa cpu_isa = CpuIsa::avx512;                  // SHARDOPT_CPU_ISA (avx512: no cap)
  double bucket_mb = 25.0;                          // SHARDOPT_BUCKET_MB
  int check_sync = 0;                               // SHARDOPT_CHECK_SYNC (0: never)
  double timeout = 600.0;                           // SHARDOPT_TIMEOUT, seconds (0: no watchdog)
  bool desync_check = false;                        // SHARDOPT_DESYNC_CHECK
  int stats_every = 100;                            // SHARDOPT_STATS_EVERY (0: never)
  std::size_t staged_chunk_kb = 4096;               // SHARDOPT_STAGED_CHUNK_KB
  DeviceComm device_comm = DeviceComm::automatic;   // SHARDOPT_DEVICE_COMM
  CudaAwareMpi cuda_aware_mpi = CudaAwareMpi::ask;  // SHARDOPT_CUDA_AWARE_MPI
  HostComm host_comm = HostComm::automatic;         // SHARDOPT_HOST_COMM
  std::size_t shm_chunk_kb = 1024;                  // SHARDOPT_SHM_CHUNK_KB
  std::size_t shm_single_copy_kb = 16;              // SHARDOPT_SHM_SINGLE_COPY_KB (SIZE_MAX: off)
  bool fused_update = true;                         // SHARDOPT_FUSED_UPDATE
};

// The settings of this process, read from the environment at the first call.
// Local. Throws ConfigError (at every call) if a variable has a bad value.
SHARDOPT_API const Settings& settings();

// One SHARDOPT_* variable: its name, default, accepted values, meaning, and
// whether it must be the same on every rank (it changes what the ranks do
// together; a Communicator's construction checks it).
struct EnvVarInfo {
  std::string name;
  std::string default_value;
  std::string accepted;
  std::string description;
  bool same_on_every_rank = false;
};

// Every SHARDOPT_* variable the library reads.
SHARDOPT_API std::vector<EnvVarInfo> environment_variables();

}  // namespace shardopt
