/* shardopt: the C API (C11 and C++; docs/c-api.md).
 *
 * The ZeRO optimizer and the communicator of the C++ API behind opaque
 * handles, for C codes and for the Fortran module (module shardopt, built on
 * these functions). Every function returns a shardopt_status_t: on success
 * SHARDOPT_SUCCESS, otherwise the code of the failure, whose message and
 * hint (how to fix it) this thread can read with shardopt_last_error() and
 * shardopt_last_error_hint() until its next failing call. No C++ exception
 * ever leaves a function of this header.
 *
 * Collective functions are marked so: every rank of the communicator calls
 * them, in the same order. Their errors are raised on every rank where the
 * C++ API raises them on every rank (bad layouts, checkpoints, ...); a bad
 * handle or pointer is found locally, before anything is communicated.
 *
 * Handles: a destroyed handle is set to NULL by its destroy function, and a
 * copy of it kept elsewhere is recognised as destroyed
 * (SHARDOPT_ERR_INVALID_STATE), never dereferenced. A handle of one kind
 * passed as another kind, or a value that was never a handle, is
 * SHARDOPT_ERR_INVALID_ARGUMENT.
 *
 * Counts are size_t. A count past PTRDIFF_MAX (a negative number passed
 * from Fortran, whose integers are signed) is SHARDOPT_ERR_INVALID_ARGUMENT
 * naming the negative value.
 *
 * Device buffers (CUDA device memory) pass through as the C++ API takes
 * them: the collectives and the optimizer accept them, and streams are
 * cudaStream_t values passed as void*. */
#ifndef SHARDOPT_H
#define SHARDOPT_H

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "shardopt/export.h"
#include "shardopt/status.h"
#include "shardopt/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Version and errors (local, thread-safe). */

/* The library's version at run time ("0.4.0"), and its parts; any of the
 * pointers may be NULL. Compare with SHARDOPT_VERSION_* (the headers'). */
SHARDOPT_API const char* shardopt_version_string(void);
SHARDOPT_API shardopt_status_t shardopt_version(int* major, int* minor, int* patch);

/* The message of this thread's last failing call ("" if none failed yet):
 * what went wrong, naming the argument or object. Valid until this thread's
 * next failing call. */
SHARDOPT_API const char* shardopt_last_error(void);
/* How to fix it ("" if there is no hint). Valid as shardopt_last_error(). */
SHARDOPT_API const char* shardopt_last_error_hint(void);
/* The status of this thread's last failing call (SHARDOPT_SUCCESS if none). */
SHARDOPT_API shardopt_status_t shardopt_last_status(void);
/* 1 if this rank is the one to print the last error, so that a job prints
 * each error once: an error of this rank alone, or, for an error the ranks
 * agreed on (every rank of the communicator failed with the same message),
 * the lowest rank that found it; every rank with SHARDOPT_DEBUG=INFO or
 * DEBUG. 0 otherwise (the other ranks of an agreed error). */
SHARDOPT_API int shardopt_reports_last_error(void);
/* Forgets the last error of this thread. */
SHARDOPT_API void shardopt_clear_error(void);

/* The language the caller's code is written in, which messages and hints
 * speak: they name the functions, struct fields and constants of that
 * language's API (shardopt_zero_options_t.bucket_mb, shardopt_load's
 * strict = 0, SHARDOPT_AVG in C; bucket_mb= of shardopt_optimizer_create,
 * strict=.false., shardopt_zero_options_t%init_scale in Fortran) rather
 * than the C++ API's, and number parameters and groups as it does (from 0
 * in C, from 1 in Fortran). */
typedef int shardopt_language_t;
enum { SHARDOPT_LANGUAGE_C = 0, SHARDOPT_LANGUAGE_FORTRAN = 1 };

/* Local, process-wide: makes messages speak `language` from now on (the
 * default is SHARDOPT_LANGUAGE_C). A binding built on this API calls it
 * once, before its first other call (the Fortran module does); a C code
 * never needs to. Errors that the C++ API, called directly in that process,
 * throws number parameters the same way. A value that is not a
 * shardopt_language_t is SHARDOPT_ERR_INVALID_ARGUMENT (nothing changes). */
SHARDOPT_API shardopt_status_t shardopt_set_language(shardopt_language_t language);

/* ------------------------------------------------------------------------
 * Element types and reductions: the values of shardopt::DType and
 * shardopt::ReduceOp. The types are int, so that any value a caller (or a
 * Fortran binding) passes is a valid one to pass; a value outside these is
 * SHARDOPT_ERR_INVALID_ARGUMENT. */

typedef int shardopt_dtype_t;
enum {
  SHARDOPT_F32 = 0,
  SHARDOPT_F64 = 1,
  SHARDOPT_BF16 = 2,
  SHARDOPT_F16 = 3,
  SHARDOPT_I32 = 4,
  SHARDOPT_I64 = 5
};

typedef int shardopt_op_t;
enum { SHARDOPT_SUM = 0, SHARDOPT_AVG = 1, SHARDOPT_MAX = 2, SHARDOPT_MIN = 3 };
/* shardopt_zero_options_t.non_finite (shardopt::NonFinite): automatic skips
 * with a loss scaler and ignores without one. */
enum {
  SHARDOPT_NON_FINITE_AUTO = 0,
  SHARDOPT_NON_FINITE_SKIP = 1,
  SHARDOPT_NON_FINITE_ERROR = 2,
  SHARDOPT_NON_FINITE_IGNORE = 3
};

/* ------------------------------------------------------------------------
 * Devices (local). */

/* Devices this process sees (0 without CUDA, or without a device). */
SHARDOPT_API shardopt_status_t shardopt_device_count(int* count);
/* Makes `device` this thread's current CUDA device (shardopt::set_device). */
SHARDOPT_API shardopt_status_t shardopt_set_device(int device);

/* ------------------------------------------------------------------------
 * The communicator (shardopt::Communicator): a duplicate of the caller's
 * MPI communicator, which it never frees. */

typedef struct shardopt_comm_s* shardopt_comm_t;
typedef struct shardopt_request_s* shardopt_request_t;

typedef struct shardopt_comm_options_t {
  /* Largest element count per MPI call; 0: SHARDOPT_COMM_MAX_CHUNK. */
  size_t max_chunk_elements;
  /* 1: agree on every operation's arguments first (a collective per call);
   * 0: do not; -1: SHARDOPT_CHECK_ARGS decides. */
  int check_arguments;
  /* The cudaStream_t device operations are ordered on; NULL: default. */
  void* stream;
  /* How device buffers move: "auto", "nccl", "staged" or "mpi"; NULL:
   * SHARDOPT_DEVICE_COMM decides. */
  const char* device_comm;
  /* How host buffers move: "auto", "mpi", "shm" or "hier"; NULL:
   * SHARDOPT_HOST_COMM decides. */
  const char* host_comm;
} shardopt_comm_options_t;

/* Fills *options with the defaults above (0, -1, NULL, NULL, NULL). */
SHARDOPT_API shardopt_status_t shardopt_comm_options_init(shardopt_comm_options_t* options);

/* Collective over comm: duplicates it. options may be NULL (the defaults). */
SHARDOPT_API shardopt_status_t shardopt_comm_create(MPI_Comm comm,
                                                    const shardopt_comm_options_t* options,
                                                    shardopt_comm_t* out);
/* The same from a Fortran handle (an `integer` of `use mpi`, or the
 * MPI_VAL of mpi_f08's type(MPI_Comm)). */
SHARDOPT_API shardopt_status_t shardopt_comm_create_f(MPI_Fint comm,
                                                      const shardopt_comm_options_t* options,
                                                      shardopt_comm_t* out);
/* Collective: frees the duplicate and the handle, and sets *comm to NULL.
 * A NULL *comm is accepted (nothing to do). Optimizers made on it must be
 * destroyed first (SHARDOPT_ERR_INVALID_STATE otherwise, nothing freed). */
SHARDOPT_API shardopt_status_t shardopt_comm_destroy(shardopt_comm_t* comm);

SHARDOPT_API shardopt_status_t shardopt_comm_rank(shardopt_comm_t comm, int* rank);
SHARDOPT_API shardopt_status_t shardopt_comm_size(shardopt_comm_t comm, int* size);
/* The duplicated MPI communicator (owned by the handle), in C and Fortran form. */
SHARDOPT_API shardopt_status_t shardopt_comm_mpi(shardopt_comm_t comm, MPI_Comm* out);
SHARDOPT_API shardopt_status_t shardopt_comm_mpi_f(shardopt_comm_t comm, MPI_Fint* out);
/* The backends in use: host ("mpi-host") and device ("nccl", "staged",
 * "mpi", "none"). Static strings. */
SHARDOPT_API shardopt_status_t shardopt_comm_backends(shardopt_comm_t comm, const char** host,
                                                      const char** device);
/* Which ranks share a node (shardopt::Communicator::nodes(), found at
 * creation; local): this rank's node (nodes numbered in the order of their
 * lowest rank), the number of nodes, this rank's place among its node's
 * ranks (in rank order) and how many ranks its node holds. Any pointer but
 * not all may be NULL. */
SHARDOPT_API shardopt_status_t shardopt_comm_node(shardopt_comm_t comm, int* node, int* nodes,
                                                  int* local_rank, int* local_ranks);
/* The stream of device operations (shardopt_comm_options_t::stream). */
SHARDOPT_API shardopt_status_t shardopt_comm_set_stream(shardopt_comm_t comm, void* stream);

/* Collectives, with the semantics and in-place forms of the C++ API
 * (shardopt/communicator.hpp): count is the element count per rank. */
SHARDOPT_API shardopt_status_t shardopt_allreduce(shardopt_comm_t comm, const void* send,
                                                  void* recv, size_t count, shardopt_dtype_t dtype,
                                                  shardopt_op_t op);
SHARDOPT_API shardopt_status_t shardopt_reduce_scatter(shardopt_comm_t comm, const void* send,
                                                       void* recv, size_t count,
                                                       shardopt_dtype_t dtype, shardopt_op_t op);
SHARDOPT_API shardopt_status_t shardopt_allgather(shardopt_comm_t comm, const void* send,
                                                  void* recv, size_t count, shardopt_dtype_t dtype);
SHARDOPT_API shardopt_status_t shardopt_broadcast(shardopt_comm_t comm, void* buf, size_t count,
                                                  shardopt_dtype_t dtype, int root);
SHARDOPT_API shardopt_status_t shardopt_barrier(shardopt_comm_t comm);

/* Non-blocking forms: *request is completed by shardopt_wait() or
 * shardopt_test(), which free it and set it to NULL. */
SHARDOPT_API shardopt_status_t shardopt_iallreduce(shardopt_comm_t comm, const void* send,
                                                   void* recv, size_t count, shardopt_dtype_t dtype,
                                                   shardopt_op_t op, shardopt_request_t* request);
SHARDOPT_API shardopt_status_t shardopt_ireduce_scatter(shardopt_comm_t comm, const void* send,
                                                        void* recv, size_t count,
                                                        shardopt_dtype_t dtype, shardopt_op_t op,
                                                        shardopt_request_t* request);
SHARDOPT_API shardopt_status_t shardopt_iallgather(shardopt_comm_t comm, const void* send,
                                                   void* recv, size_t count, shardopt_dtype_t dtype,
                                                   shardopt_request_t* request);
SHARDOPT_API shardopt_status_t shardopt_ibroadcast(shardopt_comm_t comm, void* buf, size_t count,
                                                   shardopt_dtype_t dtype, int root,
                                                   shardopt_request_t* request);
/* Local: blocks until the operation is done; frees *request, sets it NULL.
 * A NULL *request returns at once. */
SHARDOPT_API shardopt_status_t shardopt_wait(shardopt_request_t* request);
/* Local, never blocks: *done = 1 (and *request freed, set NULL) once the
 * operation is complete, 0 otherwise. */
SHARDOPT_API shardopt_status_t shardopt_test(shardopt_request_t* request, int* done);

/* ------------------------------------------------------------------------
 * Optimizers and their hyper-parameters.
 *
 * An optimizer is given as a spec string: its key, then name=value pairs
 * separated by spaces, with the names and defaults of torch.optim
 * (shardopt/optimizers.hpp, docs/optimizers.md):
 *
 *   "adamw lr=1e-3 betas=0.9,0.999 eps=1e-8 weight_decay=0.01 amsgrad=false"
 *
 * keys: sgd adam adamw adagrad rmsprop lion lamb nadam radam. A pair takes
 * "a,b"; a flag true/false (or 1/0). Unset fields keep torch's defaults. An
 * unknown key or name, a malformed value, or a value out of its range (as
 * torch checks them) is SHARDOPT_ERR_INVALID_ARGUMENT naming it and listing
 * what the optimizer accepts. */

/* ------------------------------------------------------------------------
 * The ZeRO optimizer (shardopt::ZeroRedundancyOptimizer). */

typedef struct shardopt_optimizer_s* shardopt_optimizer_t;

/* One parameter: the user's buffers, which must outlive the optimizer. */
typedef struct shardopt_param_t {
  const char* name;       /* unique among the parameters */
  void* data;             /* count elements of dtype */
  size_t count;           /* 0 is allowed */
  shardopt_dtype_t dtype; /* SHARDOPT_F32, _BF16 or _F16; one for every parameter */
  void* grad;             /* count elements of dtype; NULL: the optimizer owns one */
  int group;              /* index into the groups (0-based) */
  const size_t* shape;    /* ndim sizes whose product is count; NULL: one dimension */
  int ndim;
  /* ZeRO stage 3's unit (docs/zero.md): consecutive parameters with the
   * same number, from 1, form a unit; 0 (a zeroed struct): a unit of its
   * own. Units end gradient buckets at every stage when any is set. */
  int unit;
} shardopt_param_t;

/* shardopt::ZeroOptions. */
typedef struct shardopt_zero_options_t {
  int stage;               /* 0, 1, 2 or 3 (default 1) */
  double bucket_mb;        /* 0: SHARDOPT_BUCKET_MB (default 25) */
  int reduce_sum;          /* 0: gradients averaged over ranks (default); 1: summed */
  double predivide_factor; /* default 1 */
  int reduce_in_fp32;      /* 16-bit gradients reduced in fp32 (default 0) */
  int param_remainders;    /* bf16: 16-bit remainders as the fp32 master (default 0) */
  int stream_grads;        /* stage 2: no gradient buffers (default 0) */
  int check_sync_every;    /* 0: SHARDOPT_CHECK_SYNC; -1 never; N: every N-th step */
  /* Non-finite gradients: SHARDOPT_NON_FINITE_* (default automatic). */
  int non_finite;
  void* stream; /* device parameters: the cudaStream_t of the engine (NULL: default) */
  /* Dynamic loss scaling (torch.amp.GradScaler's defaults): on when
   * loss_scaler is 1. */
  int loss_scaler;
  double init_scale;     /* 65536 */
  double growth_factor;  /* 2 */
  double backoff_factor; /* 0.5 */
  int growth_interval;   /* 2000 */
  int hysteresis;        /* 1 */
  double min_scale;      /* 1 */
  /* Stage 3 (docs/zero.md, "Stage 3"): the pool of gathered units (0:
   * automatic), prefetch in the recorded order, keeping a released unit
   * gathered again in the step, units of fewer bytes kept whole. */
  size_t gather_limit_bytes;  /* 0 */
  int prefetch;               /* 1 */
  int reshard_after_forward;  /* 1 */
  size_t persist_below_bytes; /* 65536 */
} shardopt_zero_options_t;

/* Fills *options with the defaults above. */
SHARDOPT_API shardopt_status_t shardopt_zero_options_init(shardopt_zero_options_t* options);

/* shardopt::StepInfo. */
typedef struct shardopt_step_info_t {
  int applied;      /* 0: skipped (non-finite gradients) */
  int grads_finite; /* agreed across ranks */
  int pending;      /* device: the verdict is still on the device */
  double grad_norm; /* clip_grad_norm's norm this step; -1 if not called */
  double loss_scale;
  int64_t step; /* steps applied so far */
  double reduce_seconds, update_seconds, gather_seconds;
  uint64_t reduce_bytes, gather_bytes;
  double reduce_span_seconds, exposed_comm_seconds;
  double reduce_busbw_gbps, gather_busbw_gbps;
  int64_t gathers, gathers_ahead; /* stage 3: the step's gathers, those prefetched or kept */
} shardopt_step_info_t;

/* shardopt::MemoryReport, in bytes. */
typedef struct shardopt_memory_report_t {
  size_t master_params, optimizer_state, grad_shard, reduced_grads, owned_grads, buckets;
  size_t user_params, user_grads;
  size_t device_bytes, host_bytes;
  size_t allocated;   /* everything shardopt allocated */
  size_t node_shared; /* of allocated: this rank's part of memory its node's ranks share */
  size_t param_shard, gather_pool, persistent_params; /* stage 3 */
} shardopt_memory_report_t;

/* Collective over comm: registers num_params parameters (the same on every
 * rank, in the same order) with num_groups optimizer specs (group g's
 * optimizer is groups[g]; one kind for all groups), and agrees on the
 * layout. options may be NULL (the defaults). stage 0 is torch's
 * DistributedOptimizer. Errors on every rank name the first difference
 * between ranks or the bad argument. comm must outlive the optimizer. */
SHARDOPT_API shardopt_status_t shardopt_optimizer_create(shardopt_comm_t comm,
                                                         const shardopt_param_t* params,
                                                         size_t num_params,
                                                         const char* const* groups, int num_groups,
                                                         const shardopt_zero_options_t* options,
                                                         shardopt_optimizer_t* out);
/* Local (waits for communication in flight): frees the optimizer and sets
 * *opt to NULL. A NULL *opt is accepted. */
SHARDOPT_API shardopt_status_t shardopt_optimizer_destroy(shardopt_optimizer_t* opt);

/* Local: zeroes the gradients and forgets what was marked ready. */
SHARDOPT_API shardopt_status_t shardopt_zero_grad(shardopt_optimizer_t opt);
/* Local (communication may start): parameter `index`'s gradient is
 * complete. grad NULL: it is in the registered (or owned) buffer; else it
 * is copied from grad (count elements of the parameter's dtype). */
SHARDOPT_API shardopt_status_t shardopt_grad_ready(shardopt_optimizer_t opt, size_t index,
                                                   const void* grad);
/* Device parameters: as shardopt_grad_ready for a gradient written on
 * `stream` (a cudaStream_t; NULL: the default stream). */
SHARDOPT_API shardopt_status_t shardopt_grad_ready_on(shardopt_optimizer_t opt, void* stream,
                                                      size_t index, const void* grad);
/* Collective: ends a micro-batch (stage 2 reduces into the gradient shard). */
SHARDOPT_API shardopt_status_t shardopt_reduce_gradients(shardopt_optimizer_t opt);
/* Stage 3 (docs/zero.md, "Stage 3"; units numbered from 0 here, in
 * registration order). Local: the number of units into *count. */
SHARDOPT_API shardopt_status_t shardopt_num_units(shardopt_optimizer_t opt, size_t* count);
/* Collective: gathers unit `unit`'s parameters into the optimizer's pool
 * (shardopt_igather_unit: returns once the allgathers are issued); every
 * rank names the same unit, or every rank gets the error naming each
 * rank's. */
SHARDOPT_API shardopt_status_t shardopt_gather_unit(shardopt_optimizer_t opt, size_t unit);
SHARDOPT_API shardopt_status_t shardopt_igather_unit(shardopt_optimizer_t opt, size_t unit);
/* Collective: the unit's parameters are no longer used. */
SHARDOPT_API shardopt_status_t shardopt_release_unit(shardopt_optimizer_t opt, size_t unit);
/* Local: parameter `index`'s whole values (count elements of its dtype)
 * into *data: the registered buffer at stages 0-2; at stage 3 inside its
 * gathered unit (waiting for an igather), NULL while it is not gathered. */
SHARDOPT_API shardopt_status_t shardopt_param_data(shardopt_optimizer_t opt, size_t index,
                                                   const void** data);
/* Collective: the global gradient norm into *norm (may be NULL); the next
 * step clips to max_norm. */
SHARDOPT_API shardopt_status_t shardopt_clip_grad_norm(shardopt_optimizer_t opt, double max_norm,
                                                       double* norm);
/* Collective: one step; *info (may be NULL) says what it did. */
SHARDOPT_API shardopt_status_t shardopt_step(shardopt_optimizer_t opt, shardopt_step_info_t* info);

/* Local queries. */
SHARDOPT_API shardopt_status_t shardopt_loss_scale(shardopt_optimizer_t opt, double* scale);
SHARDOPT_API shardopt_status_t shardopt_steps(shardopt_optimizer_t opt, int64_t* steps,
                                              int64_t* skipped);
SHARDOPT_API shardopt_status_t shardopt_num_params(shardopt_optimizer_t opt, size_t* count);
/* Parameter index's element count and dtype (either pointer may be NULL). */
SHARDOPT_API shardopt_status_t shardopt_param_info(shardopt_optimizer_t opt, size_t index,
                                                   size_t* count, shardopt_dtype_t* dtype);
/* Parameter index's gradient buffer (NULL for a streamed one). */
SHARDOPT_API shardopt_status_t shardopt_param_grad(shardopt_optimizer_t opt, size_t index,
                                                   void** grad);

/* Local: the learning rate of group g (-1: every group), between steps. */
SHARDOPT_API shardopt_status_t shardopt_set_lr(shardopt_optimizer_t opt, double lr, int group);
/* Local: sets hyper-parameters of group g (-1: every group) from
 * "name=value ..." pairs of the group's optimizer ("lr=1e-4 weight_decay=0"),
 * checked as at creation; on an error nothing changes. The same on every rank. */
SHARDOPT_API shardopt_status_t shardopt_set_hparams(shardopt_optimizer_t opt, int group,
                                                    const char* pairs);
/* Local: hyper-parameter `name` of group g; for a pair, its first value
 * (name "betas") or either one ("betas.0", "betas.1"); a flag as 0 or 1. */
SHARDOPT_API shardopt_status_t shardopt_get_hparam(shardopt_optimizer_t opt, int group,
                                                   const char* name, double* value);

/* Local. */
SHARDOPT_API shardopt_status_t shardopt_memory_report(shardopt_optimizer_t opt,
                                                      shardopt_memory_report_t* report);
/* Collective: state `name` ("master", "exp_avg", ...) of parameter index,
 * gathered from the shards into out (count elements: the parameter's). */
SHARDOPT_API shardopt_status_t shardopt_gather_state(shardopt_optimizer_t opt, const char* name,
                                                     size_t index, float* out, size_t count);

/* Collective: whether every rank's parameters hold the same bytes. *in_sync
 * is 1 or 0; when 0, shardopt_last_error()'s buffer is untouched and the
 * description is written to message (at most message_size bytes, with its
 * NUL; message may be NULL). */
SHARDOPT_API shardopt_status_t shardopt_check_sync(shardopt_optimizer_t opt, int* in_sync,
                                                   char* message, size_t message_size);

/* Checkpoints (docs/checkpoint.md). Collective. save: keep_last >= 1 files
 * (1: replace), num_metadata key/value pairs stored as "user.<key>" (may be
 * 0 with NULL arrays). */
SHARDOPT_API shardopt_status_t shardopt_save(shardopt_optimizer_t opt, const char* path,
                                             int keep_last, const char* const* metadata_keys,
                                             const char* const* metadata_values,
                                             size_t num_metadata);

/* What shardopt_load did (the same on every rank). */
typedef struct shardopt_load_report_t {
  int64_t step;                                   /* the step count restored */
  int saved_ranks;                                /* the rank count of the save */
  int hyper_parameters;                           /* 1 if the groups' values were restored */
  size_t loaded, missing, unexpected, mismatched; /* tensor counts */
} shardopt_load_report_t;

/* strict: any difference between the file and the optimizer is an error
 * and nothing changes (1), or the matching tensors load (0);
 * hyper_parameters: take the groups' values from the file (1). report may
 * be NULL. */
SHARDOPT_API shardopt_status_t shardopt_load(shardopt_optimizer_t opt, const char* path, int strict,
                                             int hyper_parameters, shardopt_load_report_t* report);
/* The value of metadata key (as saved, without "user.") of the last
 * successful shardopt_load on this optimizer, into value (at most
 * value_size bytes with its NUL). A key the file did not have:
 * SHARDOPT_ERR_INVALID_ARGUMENT. Local. */
SHARDOPT_API shardopt_status_t shardopt_load_metadata(shardopt_optimizer_t opt, const char* key,
                                                      char* value, size_t value_size);
/* The parameters alone as a safetensors file; fp32 1: the fp32 master
 * values, 0: the model's dtype. */
SHARDOPT_API shardopt_status_t shardopt_export(shardopt_optimizer_t opt, const char* path,
                                               int fp32);

/* ------------------------------------------------------------------------
 * Functional optimizers (shardopt/optim.hpp): one step of the optimizer of
 * `spec` over caller-owned buffers, host or one device. Local. */

typedef struct shardopt_step_options_t {
  double grad_mul;                  /* multiplies every gradient first (default 1) */
  void* param_out;                  /* optional bf16/f16 copy of the new parameters */
  shardopt_dtype_t param_out_dtype; /* default SHARDOPT_BF16 */
  void* stream;                     /* device buffers: the cudaStream_t (NULL: default) */
  int skip_nonfinite;               /* skip the step when a gradient is not finite */
  /* bf16 parameters with 16-bit remainders (param_dtype SHARDOPT_BF16):
   * count remainders; NULL for fp32 parameters. */
  uint16_t* remainders;
} shardopt_step_options_t;

SHARDOPT_API shardopt_status_t shardopt_step_options_init(shardopt_step_options_t* options);

/* params: count elements of param_dtype (SHARDOPT_F32, or SHARDOPT_BF16
 * with options->remainders); grads: count elements of grad_dtype (f32,
 * bf16, f16); states: num_states buffers of count floats, one per state
 * slot of the optimizer in its order (adam: exp_avg, exp_avg_sq,
 * max_exp_avg_sq), NULL for a slot its options do not use; lamb takes a
 * third buffer, its update scratch. step counts steps including this one.
 * options may be NULL. *applied and *grads_finite (either may be NULL)
 * report as shardopt::functional::StepResult. */
SHARDOPT_API shardopt_status_t shardopt_functional_step(
    const char* spec, void* params, shardopt_dtype_t param_dtype, const void* grads,
    shardopt_dtype_t grad_dtype, size_t count, float* const* states, int num_states, int64_t step,
    const shardopt_step_options_t* options, int* applied, int* grads_finite);
/* The number of state buffers shardopt_functional_step takes for spec, and
 * the name of slot k into name (at most name_size bytes; may be NULL). */
SHARDOPT_API shardopt_status_t shardopt_functional_slots(const char* spec, int* num_states, int k,
                                                         char* name, size_t name_size);
/* Whether slot k (0-based) of spec's optimizer is used by its options
 * (*used = 1: pass a buffer) or not (*used = 0: pass NULL; adam's
 * max_exp_avg_sq without amsgrad, sgd's momentum_buffer with momentum 0). */
SHARDOPT_API shardopt_status_t shardopt_functional_slot_used(const char* spec, int k, int* used);

#ifdef __cplusplus
}
#endif

#endif /* SHARDOPT_H */
