#include "shardopt/build_info.hpp"

#include <mpi.h>

#include <sstream>

#include "build_config.hpp"
#include "device/device.hpp"
#include "shardopt/config.hpp"
#include "shardopt/environment.hpp"

#if SHARDOPT_HAVE_MPIX_CUDA
#include <mpi-ext.h>
#endif

namespace shardopt {

namespace detail {

bool mpi_library_cuda_aware() noexcept {
  if (!mpi_is_initialized() || mpi_is_finalized()) return false;
#if SHARDOPT_HAVE_MPIX_CUDA
  return MPIX_Query_cuda_support() == 1;
#elif SHARDOPT_HAVE_MPIX_GPU_QUERY
  int supported = 0;
  return MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) == MPI_SUCCESS && supported != 0;
#else
  return false;
#endif
}

bool mpi_takes_device_buffers() {
  switch (settings().cuda_aware_mpi) {
    case CudaAwareMpi::yes:
      return true;
    case CudaAwareMpi::no:
      return false;
    case CudaAwareMpi::ask:
      break;
  }
  return mpi_library_cuda_aware();
}

}  // namespace detail

BuildInfo build_info() noexcept {
  BuildInfo info;
  try {
    info.version = SHARDOPT_VERSION;
    info.cuda = SHARDOPT_HAVE_CUDA;
    info.nccl = SHARDOPT_HAVE_NCCL;
    info.cuda_runtime_version = detail::cuda_runtime_version();
    info.cuda_devices = detail::cuda_device_count();
    info.nccl_version = detail::nccl_version();
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    if (MPI_Get_library_version(lib, &len) == MPI_SUCCESS) {
      std::string s(lib, static_cast<std::size_t>(len));
      const auto cut = s.find_first_of(",\n");
      info.mpi_library = s.substr(0, cut);
    }
    info.mpi_cuda_aware = detail::mpi_library_cuda_aware();
  } catch (...) {
  }
  return info;
}

std::string build_info_string() {
  const BuildInfo b = build_info();
  std::ostringstream os;
  os << "shardopt " << b.version << " (";
  if (b.cuda) {
    os << "cuda " << b.cuda_runtime_version / 1000 << "." << (b.cuda_runtime_version % 1000) / 10
       << ", " << b.cuda_devices << (b.cuda_devices == 1 ? " device" : " devices");
  } else {
    os << "no cuda";
  }
  os << "; ";
  if (b.nccl) {
    os << "nccl " << b.nccl_version / 10000 << "." << (b.nccl_version / 100) % 100 << "."
       << b.nccl_version % 100;
  } else {
    os << "no nccl";
  }
  os << "; " << (b.mpi_library.empty() ? "unknown MPI" : b.mpi_library);
  if (b.mpi_cuda_aware) os << ", CUDA-aware";
  os << ")";
  return os.str();
}

}  // namespace shardopt
