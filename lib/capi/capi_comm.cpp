// shardopt: the C API's communicator and collectives (shardopt.h).
#include <optional>
#include <string>

#include "capi.hpp"
#include "common/check.hpp"

using namespace shardopt;
using namespace shardopt::capi;

namespace {

CommOptions comm_options(const shardopt_comm_options_t* o) {
  CommOptions options;
  if (!o) return options;
  options.max_chunk_elements = o->max_chunk_elements;
  check_count(o->max_chunk_elements, "options->max_chunk_elements");
  if (o->check_arguments == 0 || o->check_arguments == 1)
    options.check_arguments = o->check_arguments == 1;
  else if (o->check_arguments != -1)
    SHARDOPT_THROW(invalid_argument,
                   "options->check_arguments is " + std::to_string(o->check_arguments),
                   "use 1 (agree on arguments), 0 (do not) or -1 (SHARDOPT_CHECK_ARGS decides)");
  options.stream = o->stream;
  if (o->device_comm) {
    const std::string d = o->device_comm;
    if (d == "auto")
      options.device_comm = DeviceComm::automatic;
    else if (d == "nccl")
      options.device_comm = DeviceComm::nccl;
    else if (d == "staged")
      options.device_comm = DeviceComm::staged;
    else if (d == "mpi")
      options.device_comm = DeviceComm::mpi;
    else
      SHARDOPT_THROW(invalid_argument, "options->device_comm '" + d + "' is not a transport",
                     "use \"auto\", \"nccl\", \"staged\" or \"mpi\", or NULL");
  }
  if (o->host_comm) {
    const std::string h = o->host_comm;
    if (h == "auto")
      options.host_comm = HostComm::automatic;
    else if (h == "mpi")
      options.host_comm = HostComm::mpi;
    else if (h == "shm")
      options.host_comm = HostComm::shm;
    else if (h == "hier")
      options.host_comm = HostComm::hier;
    else
      SHARDOPT_THROW(invalid_argument, "options->host_comm '" + h + "' is not a transport",
                     "use \"auto\", \"mpi\", \"shm\" or \"hier\", or NULL");
  }
  return options;
}

shardopt_status_t create(const char* function, MPI_Comm comm,
                         const shardopt_comm_options_t* options, shardopt_comm_t* out) {
  return guard(function, [&] {
    check_out(out, "out");
    *out = nullptr;
    auto object = std::make_shared<CommObject>(Communicator(comm, comm_options(options)));
    *out = reinterpret_cast<shardopt_comm_t>(add_handle(Kind::comm, std::move(object)));
  });
}

// Starts a non-blocking operation (start() returns its Request) after the
// checks every non-blocking form shares, and hands out its request,
// counted on the communicator so that the communicator is not destroyed
// under it.
template <class Start>
void start_request(CommObject& c, std::size_t count, shardopt_request_t* out, Start&& start) {
  check_out(out, "request");
  *out = nullptr;
  check_count(count, "count");
  auto object = std::make_shared<RequestObject>();
  object->request = start();
  object->comm = &c;
  *out = reinterpret_cast<shardopt_request_t>(add_handle(Kind::request, std::move(object)));
  ++c.requests;
}

// Forgets a request that completed or failed (MPI frees a request whose
// operation failed, and so does shardopt), and sets the caller's handle NULL.
void end_request(RequestObject& r, shardopt_request_t* handle) noexcept {
  --r.comm->requests;
  remove_handle(reinterpret_cast<std::uintptr_t>(*handle));
  *handle = nullptr;
}

}  // namespace

extern "C" {

SHARDOPT_API shardopt_status_t shardopt_comm_options_init(shardopt_comm_options_t* options) {
  return guard("shardopt_comm_options_init", [&] {
    check_out(options, "options");
    *options = shardopt_comm_options_t{0, -1, nullptr, nullptr, nullptr};
  });
}

SHARDOPT_API shardopt_status_t shardopt_comm_create(MPI_Comm comm,
                                                    const shardopt_comm_options_t* options,
                                                    shardopt_comm_t* out) {
  return create("shardopt_comm_create", comm, options, out);
}

SHARDOPT_API shardopt_status_t shardopt_comm_create_f(MPI_Fint comm,
                                                      const shardopt_comm_options_t* options,
                                                      shardopt_comm_t* out) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // MPI_Comm_f2c needs MPI running; Communicator's own check names the problem.
  const MPI_Comm c = initialized && !finalized ? MPI_Comm_f2c(comm) : MPI_COMM_NULL;
  return create("shardopt_comm_create_f", c, options, out);
}

SHARDOPT_API shardopt_status_t shardopt_comm_destroy(shardopt_comm_t* comm) {
  return guard("shardopt_comm_destroy", [&] {
    check_out(comm, "comm");
    if (!*comm) return;
    CommObject& c = comm_of(*comm, "*comm");
    if (c.optimizers > 0)
      SHARDOPT_THROW(
          invalid_state,
          "the communicator still has " + std::to_string(c.optimizers) + " optimizer(s) made on it",
          "destroy them first with shardopt_optimizer_destroy");
    if (c.requests > 0)
      SHARDOPT_THROW(
          invalid_state,
          "the communicator still has " + std::to_string(c.requests) + " request(s) not completed",
          "complete them first with shardopt_wait");
    c.comm.free();
    remove_handle(reinterpret_cast<std::uintptr_t>(*comm));
    *comm = nullptr;
  });
}

SHARDOPT_API shardopt_status_t shardopt_comm_rank(shardopt_comm_t comm, int* rank) {
  return guard("shardopt_comm_rank", [&] {
    CommObject& c = comm_of(comm);
    check_out(rank, "rank");
    *rank = c.comm.rank();
  });
}

SHARDOPT_API shardopt_status_t shardopt_comm_size(shardopt_comm_t comm, int* size) {
  return guard("shardopt_comm_size", [&] {
    CommObject& c = comm_of(comm);
    check_out(size, "size");
    *size = c.comm.size();
  });
}

SHARDOPT_API shardopt_status_t shardopt_comm_mpi(shardopt_comm_t comm, MPI_Comm* out) {
  return guard("shardopt_comm_mpi", [&] {
    CommObject& c = comm_of(comm);
    check_out(out, "out");
    *out = c.comm.mpi_comm();
  });
}

SHARDOPT_API shardopt_status_t shardopt_comm_mpi_f(shardopt_comm_t comm, MPI_Fint* out) {
  return guard("shardopt_comm_mpi_f", [&] {
    CommObject& c = comm_of(comm);
    check_out(out, "out");
    *out = MPI_Comm_c2f(c.comm.mpi_comm());
  });
}

SHARDOPT_API shardopt_status_t shardopt_comm_backends(shardopt_comm_t comm, const char** host,
                                                      const char** device) {
  return guard("shardopt_comm_backends", [&] {
    CommObject& c = comm_of(comm);
    if (!host && !device) check_out(host, "host and device");
    if (host) *host = c.comm.backend_name();
    if (device) *device = c.comm.device_backend_name();
  });
}

SHARDOPT_API shardopt_status_t shardopt_comm_node(shardopt_comm_t comm, int* node, int* nodes,
                                                  int* local_rank, int* local_ranks) {
  return guard("shardopt_comm_node", [&] {
    const NodeLayout& n = comm_of(comm).comm.nodes();
    if (!node && !nodes && !local_rank && !local_ranks)
      check_out(node, "node, nodes, local_rank and local_ranks");
    if (node) *node = n.node;
    if (nodes) *nodes = n.nodes;
    if (local_rank) *local_rank = n.local_rank;
    if (local_ranks) *local_ranks = n.local_ranks;
  });
}

SHARDOPT_API shardopt_status_t shardopt_comm_set_stream(shardopt_comm_t comm, void* stream) {
  return guard("shardopt_comm_set_stream", [&] { comm_of(comm).comm.set_stream(stream); });
}

SHARDOPT_API shardopt_status_t shardopt_allreduce(shardopt_comm_t comm, const void* send,
                                                  void* recv, size_t count, shardopt_dtype_t dtype,
                                                  shardopt_op_t op) {
  return guard("shardopt_allreduce", [&] {
    CommObject& c = comm_of(comm);
    check_count(count, "count");
    c.comm.allreduce(send, recv, count, dtype_of_code(dtype, "dtype"), op_of_code(op));
  });
}

SHARDOPT_API shardopt_status_t shardopt_reduce_scatter(shardopt_comm_t comm, const void* send,
                                                       void* recv, size_t count,
                                                       shardopt_dtype_t dtype, shardopt_op_t op) {
  return guard("shardopt_reduce_scatter", [&] {
    CommObject& c = comm_of(comm);
    check_count(count, "count");
    c.comm.reduce_scatter(send, recv, count, dtype_of_code(dtype, "dtype"), op_of_code(op));
  });
}

SHARDOPT_API shardopt_status_t shardopt_allgather(shardopt_comm_t comm, const void* send,
                                                  void* recv, size_t count,
                                                  shardopt_dtype_t dtype) {
  return guard("shardopt_allgather", [&] {
    CommObject& c = comm_of(comm);
    check_count(count, "count");
    c.comm.allgather(send, recv, count, dtype_of_code(dtype, "dtype"));
  });
}

SHARDOPT_API shardopt_status_t shardopt_broadcast(shardopt_comm_t comm, void* buf, size_t count,
                                                  shardopt_dtype_t dtype, int root) {
  return guard("shardopt_broadcast", [&] {
    CommObject& c = comm_of(comm);
    check_count(count, "count");
    c.comm.broadcast(buf, count, dtype_of_code(dtype, "dtype"), root);
  });
}

SHARDOPT_API shardopt_status_t shardopt_barrier(shardopt_comm_t comm) {
  return guard("shardopt_barrier", [&] { comm_of(comm).comm.barrier(); });
}

SHARDOPT_API shardopt_status_t shardopt_iallreduce(shardopt_comm_t comm, const void* send,
                                                   void* recv, size_t count, shardopt_dtype_t dtype,
                                                   shardopt_op_t op, shardopt_request_t* request) {
  return guard("shardopt_iallreduce", [&] {
    CommObject& c = comm_of(comm);
    start_request(c, count, request, [&] {
      return c.comm.iallreduce(send, recv, count, dtype_of_code(dtype, "dtype"), op_of_code(op));
    });
  });
}

SHARDOPT_API shardopt_status_t shardopt_ireduce_scatter(shardopt_comm_t comm, const void* send,
                                                        void* recv, size_t count,
                                                        shardopt_dtype_t dtype, shardopt_op_t op,
                                                        shardopt_request_t* request) {
  return guard("shardopt_ireduce_scatter", [&] {
    CommObject& c = comm_of(comm);
    start_request(c, count, request, [&] {
      return c.comm.ireduce_scatter(send, recv, count, dtype_of_code(dtype, "dtype"),
                                    op_of_code(op));
    });
  });
}

SHARDOPT_API shardopt_status_t shardopt_iallgather(shardopt_comm_t comm, const void* send,
                                                   void* recv, size_t count, shardopt_dtype_t dtype,
                                                   shardopt_request_t* request) {
  return guard("shardopt_iallgather", [&] {
    CommObject& c = comm_of(comm);
    start_request(c, count, request, [&] {
      return c.comm.iallgather(send, recv, count, dtype_of_code(dtype, "dtype"));
    });
  });
}

SHARDOPT_API shardopt_status_t shardopt_ibroadcast(shardopt_comm_t comm, void* buf, size_t count,
                                                   shardopt_dtype_t dtype, int root,
                                                   shardopt_request_t* request) {
  return guard("shardopt_ibroadcast", [&] {
    CommObject& c = comm_of(comm);
    start_request(c, count, request, [&] {
      return c.comm.ibroadcast(buf, count, dtype_of_code(dtype, "dtype"), root);
    });
  });
}

SHARDOPT_API shardopt_status_t shardopt_wait(shardopt_request_t* request) {
  return guard("shardopt_wait", [&] {
    check_out(request, "request");
    if (!*request) return;
    RequestObject& r = request_of(*request, "*request");
    struct Done {
      RequestObject& r;
      shardopt_request_t* handle;
      ~Done() { end_request(r, handle); }
    } done{r, request};
    r.request.wait();
  });
}

SHARDOPT_API shardopt_status_t shardopt_test(shardopt_request_t* request, int* done) {
  return guard("shardopt_test", [&] {
    check_out(request, "request");
    check_out(done, "done");
    *done = 1;
    if (!*request) return;
    RequestObject& r = request_of(*request, "*request");
    bool complete = false;
    try {
      complete = r.request.test();
    } catch (...) {
      end_request(r, request);
      throw;
    }
    *done = complete ? 1 : 0;
    if (complete) end_request(r, request);
  });
}

}  // extern "C"
