/* shardopt: status codes shared by the C++ exceptions and the C API.
 *
 * Every shardopt::Error carries one of these codes (Error::code()); the C API
 * returns them. The numeric values are stable: they never change meaning
 * between releases, new codes are only appended. */
#ifndef SHARDOPT_STATUS_H
#define SHARDOPT_STATUS_H

#include "shardopt/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum shardopt_status_t {
  SHARDOPT_SUCCESS = 0, /* the call did what it was asked */
  SHARDOPT_ERR_INVALID_ARGUMENT =
      1, /* null pointer with a non-zero count, bad count, unknown enum value */
  SHARDOPT_ERR_INVALID_CONFIG =
      2, /* a SHARDOPT_* environment variable or an option has a bad value */
  SHARDOPT_ERR_MPI_NOT_INITIALIZED = 3, /* shardopt used before MPI_Init */
  SHARDOPT_ERR_MPI_FINALIZED = 4,       /* shardopt used after MPI_Finalize */
  SHARDOPT_ERR_MPI = 5,                 /* an MPI call returned an error */
  SHARDOPT_ERR_CUDA = 6,                /* a CUDA runtime call returned an error */
  SHARDOPT_ERR_NCCL = 7,                /* an NCCL call returned an error */
  SHARDOPT_ERR_NOT_COMPILED = 8,        /* the feature was not compiled into this build */
  SHARDOPT_ERR_UNSUPPORTED = 9,      /* a combination that makes no sense (avg of integers, ...) */
  SHARDOPT_ERR_LAYOUT_MISMATCH = 10, /* ranks registered different parameter layouts or options */
  SHARDOPT_ERR_WRONG_DEVICE = 11,    /* a buffer lives in memory the communicator cannot use */
  SHARDOPT_ERR_OUT_OF_MEMORY = 12,   /* an allocation failed */
  SHARDOPT_ERR_IO = 13,              /* a file could not be read or written */
  SHARDOPT_ERR_CHECKPOINT = 14,      /* a checkpoint is corrupt, truncated or does not match */
  SHARDOPT_ERR_NON_FINITE = 15,      /* inf or nan found where the policy forbids it */
  SHARDOPT_ERR_DESYNC = 16,          /* ranks issued different collectives */
  SHARDOPT_ERR_TIMEOUT = 17,         /* a collective did not complete in time */
  SHARDOPT_ERR_INVALID_STATE = 18,   /* an object used after it was freed or moved from */
  SHARDOPT_ERR_INTERNAL = 19         /* a bug in shardopt: please report it */
} shardopt_status_t;

/* The exit status of a process the watchdog (SHARDOPT_TIMEOUT) ends. */
#define SHARDOPT_WATCHDOG_EXIT_CODE 86

/* The code's name as a string ("SHARDOPT_ERR_MPI"), or "SHARDOPT_ERR_UNKNOWN"
 * for a value that is not a code. Local, thread-safe, never fails. */
SHARDOPT_API const char* shardopt_status_name(shardopt_status_t status);

/* A one-line description of the code. Local, thread-safe, never fails. */
SHARDOPT_API const char* shardopt_status_description(shardopt_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* SHARDOPT_STATUS_H */
