// The error hierarchy: codes, subclasses, messages, and the C status names.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <string>

#include "common/check.hpp"
#include "shardopt/error.hpp"
#include "shardopt/status.h"

using namespace shardopt;

namespace {

template <class Expected>
bool throws_as(ErrorCode code) {
  try {
    detail::throw_error(code, "the message", "the hint", "../lib/x/y.cpp", 42);
  } catch (const Expected& e) {
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const std::string what = e.what();
    return e.code() == code && e.message() == "the message" && e.hint() == "the hint" &&
           std::string(e.file()) == "lib/x/y.cpp" && e.line() == 42 && e.rank() == rank &&
           what.find(error_code_name(code)) != std::string::npos &&
           what.find("the message") != std::string::npos &&
           what.find("fix: the hint") != std::string::npos &&
           what.find("lib/x/y.cpp:42") != std::string::npos &&
           what.find("rank " + std::to_string(rank)) != std::string::npos;
  } catch (...) {
  }
  return false;
}

}  // namespace

TEST_CASE("errors: each code throws its subclass with every field set", "[errors]") {
  CHECK(throws_as<InvalidArgument>(ErrorCode::invalid_argument));
  CHECK(throws_as<ConfigError>(ErrorCode::invalid_config));
  CHECK(throws_as<MpiStateError>(ErrorCode::mpi_not_initialized));
  CHECK(throws_as<MpiStateError>(ErrorCode::mpi_finalized));
  CHECK(throws_as<CommError>(ErrorCode::mpi));
  CHECK(throws_as<CommError>(ErrorCode::cuda));
  CHECK(throws_as<CommError>(ErrorCode::nccl));
  CHECK(throws_as<NotCompiledError>(ErrorCode::not_compiled));
  CHECK(throws_as<UnsupportedError>(ErrorCode::unsupported));
  CHECK(throws_as<DeviceError>(ErrorCode::wrong_device));
  CHECK(throws_as<StateError>(ErrorCode::invalid_state));
  CHECK(throws_as<Error>(ErrorCode::checkpoint));
  CHECK(throws_as<Error>(ErrorCode::internal));
}

TEST_CASE("errors: MPI failures carry the MPI error text", "[errors]") {
  try {
    detail::throw_mpi_error(MPI_ERR_TRUNCATE, "MPI_Allreduce(...)", "allreduce", __FILE__,
                            __LINE__);
    FAIL("no throw");
  } catch (const CommError& e) {
    CHECK(e.code() == ErrorCode::mpi);
    CHECK(e.message().find("MPI_Allreduce") != std::string::npos);
    CHECK(e.message().find(detail::mpi_error_string(MPI_ERR_TRUNCATE)) != std::string::npos);
    CHECK_FALSE(e.hint().empty());
  }
}

TEST_CASE("errors: status names and descriptions for every code", "[errors]") {
  for (int c = SHARDOPT_SUCCESS; c <= SHARDOPT_ERR_INTERNAL; ++c) {
    const auto s = static_cast<shardopt_status_t>(c);
    const std::string name = shardopt_status_name(s);
    INFO(c);
    CHECK(name.rfind("SHARDOPT_", 0) == 0);
    CHECK(name != "SHARDOPT_ERR_UNKNOWN");
    CHECK(std::string(shardopt_status_description(s)) != "unknown status code");
    if (c != SHARDOPT_SUCCESS) CHECK(name == error_code_name(static_cast<ErrorCode>(c)));
  }
  CHECK(std::string(shardopt_status_name(static_cast<shardopt_status_t>(999))) ==
        "SHARDOPT_ERR_UNKNOWN");
  CHECK(std::string(shardopt_status_name(SHARDOPT_ERR_MPI)) == "SHARDOPT_ERR_MPI");
}

#include "device/cuda_check.hpp"

#if SHARDOPT_HAVE_CUDA
namespace {
bool no_cuda_error() {
  SHARDOPT_CHECK_CUDA(cudaSuccess, "nothing");
  return true;
}
}  // namespace

TEST_CASE("errors: a failing CUDA call becomes a CommError with CUDA's own text", "[errors]") {
  // Device 100000 never exists, with or without a GPU in the machine.
  try {
    SHARDOPT_CHECK_CUDA(cudaSetDevice(100000), "selecting a device");
    FAIL("no throw");
  } catch (const CommError& e) {
    CHECK(e.code() == ErrorCode::cuda);
    CHECK(e.message().find("selecting a device: cudaSetDevice(100000) failed: cuda") !=
          std::string::npos);
    CHECK_FALSE(e.hint().empty());
  }
  CHECK(no_cuda_error());
}
#endif

#if SHARDOPT_HAVE_NCCL
TEST_CASE("errors: a failing NCCL call becomes a CommError with NCCL's own text", "[errors]") {
  try {
    SHARDOPT_CHECK_NCCL(ncclGetVersion(nullptr), "asking NCCL for its version");
    FAIL("no throw");
  } catch (const CommError& e) {
    CHECK(e.code() == ErrorCode::nccl);
    CHECK(e.message().find(ncclGetErrorString(ncclInvalidArgument)) != std::string::npos);
    CHECK(e.message().find("ncclGetVersion(nullptr)") != std::string::npos);
  }
}
#endif
