// shardopt: the CUDA device's own collectives (lib/device/device_runtime.hpp,
// DeviceCollectives) through NCCL: one NCCL communicator per shardopt
// communicator, made once over its MPI communicator (rank 0's unique id
// broadcast with MPI), on the device current at construction. Each
// operation is enqueued on the caller's stream and returns; NCCL reports
// failures asynchronously, which check() raises at the next call.
#include "build_config.hpp"
#include "device/device_runtime.hpp"

#if SHARDOPT_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "common/check.hpp"
#include "common/watchdog.hpp"
#include "device/cuda_check.hpp"

namespace shardopt::detail {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  throw_error(ErrorCode::internal, "NCCL: no NCCL type for dtype " + std::to_string(int(t)),
              "report this as a shardopt bug", __FILE__, __LINE__);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  throw_error(ErrorCode::internal, "NCCL: no NCCL reduction for op " + std::to_string(int(op)),
              "report this as a shardopt bug", __FILE__, __LINE__);
}

cudaStream_t as_stream(StreamHandle s) { return static_cast<cudaStream_t>(s); }

class NcclCollectives final : public DeviceCollectives {
 public:
  // Collective over comm.
  explicit NcclCollectives(MPI_Comm comm) {
    int rank = 0, size = 0;
    SHARDOPT_CHECK_MPI(MPI_Comm_rank(comm, &rank), "NCCL setup: querying the rank");
    SHARDOPT_CHECK_MPI(MPI_Comm_size(comm, &size), "NCCL setup: querying the size");
    ncclUniqueId id{};
    // Rank 0's failure to make the id must not leave the others waiting in
    // the broadcast: it sends a zeroed id, and every rank then fails alike.
    ncclResult_t made = ncclSuccess;
    if (rank == 0) made = ncclGetUniqueId(&id);
    int ok = made == ncclSuccess ? 1 : 0;
    SHARDOPT_CHECK_MPI(MPI_Bcast(&ok, 1, MPI_INT, 0, comm), "NCCL setup: sharing the unique id");
    if (!ok) {
      if (rank == 0) SHARDOPT_CHECK_NCCL(made, "NCCL setup: making the unique id");
      throw_error(ErrorCode::nccl, "NCCL setup: rank 0 could not make the NCCL unique id",
                  "see rank 0's error; rerun with NCCL_DEBUG=WARN", __FILE__, __LINE__);
    }
    SHARDOPT_CHECK_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm),
                       "NCCL setup: sharing the unique id");
    SHARDOPT_CHECK_NCCL(
        ncclCommInitRank(&comm_, size, id, rank),
        "NCCL setup: creating the communicator of " + std::to_string(size) + " ranks");
    // A stuck operation ends the job through the watchdog (SHARDOPT_TIMEOUT):
    // the communicator is aborted first, so that the peers' NCCL calls fail
    // rather than wait for this process.
    if (watchdog_armed()) on_watchdog_exit(this, [c = comm_] { ncclCommAbort(c); });
  }
  ~NcclCollectives() override {
    // Local: what was not freed collectively is aborted (no peer waited for).
    forget_watchdog_exit(this);
    if (comm_ != nullptr) ncclCommAbort(comm_);
  }

  const char* name() const noexcept override { return "nccl"; }

  void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                 StreamHandle s) override {
    SHARDOPT_CHECK_NCCL(
        ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, as_stream(s)),
        "allreduce on device buffers");
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      StreamHandle s) override {
    SHARDOPT_CHECK_NCCL(
        ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, as_stream(s)),
        "reduce_scatter on device buffers");
  }
  void allgather(const void* send, void* recv, std::size_t count, DType dtype,
                 StreamHandle s) override {
    SHARDOPT_CHECK_NCCL(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, as_stream(s)),
                        "allgather on device buffers");
  }
  void broadcast(void* buf, std::size_t count, DType dtype, int root, StreamHandle s) override {
    SHARDOPT_CHECK_NCCL(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, as_stream(s)),
                        "broadcast on device buffers");
  }

  void check(const char* op) override {
    ncclResult_t async = ncclSuccess;
    SHARDOPT_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async),
                        std::string(op) + ": asking NCCL for earlier failures");
    if (async == ncclSuccess || async == ncclInProgress) return;
    throw_error(ErrorCode::nccl,
                std::string(op) + ": an earlier collective on device buffers failed: NCCL " +
                    ncclGetErrorString(async),
                "the communicator cannot be used for device buffers after such a failure: "
                "rerun with NCCL_DEBUG=WARN for NCCL's explanation, and restart from the last "
                "checkpoint",
                __FILE__, __LINE__);
  }

  void free() noexcept override {
    if (comm_ == nullptr) return;
    forget_watchdog_exit(this);
    // Completes what was enqueued, then releases; after a failure (nothing
    // to report it to) what is left is aborted.
    if (ncclCommFinalize(comm_) == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceCollectives> make_nccl_collectives(MPI_Comm comm) {
  return std::make_unique<NcclCollectives>(comm);
}

}  // namespace shardopt::detail

#endif
