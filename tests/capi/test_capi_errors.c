/* The C API's errors, from C (compiled as C11 with -pedantic: this is also
 * the test that <shardopt/shardopt.h> is valid C). Every function of the
 * header is called with at least one bad argument (a NULL or destroyed
 * handle, a handle of another kind, a bad enum value, a count past
 * PTRDIFF_MAX, a NULL output pointer, a bad spec string or option, ...);
 * each call must return the right status, shardopt_last_error() must name
 * the problem and shardopt_last_error_hint() say how to fix it, and the
 * objects must still work afterwards. The functions that cannot fail are
 * checked for what they return. Runs at any rank count; every rank checks
 * everything, and the exit status is 1 on every rank if any check failed
 * on any rank. */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <math.h>
#include <shardopt/shardopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_rank = 0;
static int g_size = 1;
static int g_checks = 0;
static int g_failed = 0;
/* SHARDOPT_TEST_VERBOSE=1: rank 0 prints every error it provoked. */
static int g_verbose = 0;
/* What the test is doing, for the report of a call that never returns. */
static const char* volatile g_where = "MPI_Init";

/* SIGALRM: a call hung (a collective that some rank left early); says
 * where, then ends the job. Async-signal-safe calls only. */
static void on_alarm(int sig) {
  static const char what[] = ": no progress for 60 s (a call that never returned) in: ";
  char rank[16];
  int n = 0, r = g_rank;
  do rank[sizeof rank - 1 - n++] = (char)('0' + r % 10);
  while ((r /= 10) > 0 && n < 15);
  (void)sig;
  ssize_t ignored = write(2, "rank ", 5);
  ignored = write(2, rank + sizeof rank - n, (size_t)n);
  ignored = write(2, what, sizeof what - 1);
  ignored = write(2, (const char*)g_where, strlen((const char*)g_where));
  ignored = write(2, "\n", 1);
  (void)ignored;
  _exit(1);
}

/* ------------------------------------------------------------------------
 * Which functions failed as they should: every function of the header must
 * be in this list by the end. */

static const char* const k_functions[] = {
    "shardopt_set_language",
    "shardopt_device_count",
    "shardopt_set_device",
    "shardopt_comm_options_init",
    "shardopt_comm_create",
    "shardopt_comm_create_f",
    "shardopt_comm_destroy",
    "shardopt_comm_rank",
    "shardopt_comm_size",
    "shardopt_comm_mpi",
    "shardopt_comm_mpi_f",
    "shardopt_comm_backends",
    "shardopt_comm_node",
    "shardopt_comm_set_stream",
    "shardopt_allreduce",
    "shardopt_reduce_scatter",
    "shardopt_allgather",
    "shardopt_broadcast",
    "shardopt_barrier",
    "shardopt_iallreduce",
    "shardopt_ireduce_scatter",
    "shardopt_iallgather",
    "shardopt_ibroadcast",
    "shardopt_wait",
    "shardopt_test",
    "shardopt_zero_options_init",
    "shardopt_optimizer_create",
    "shardopt_optimizer_destroy",
    "shardopt_zero_grad",
    "shardopt_grad_ready",
    "shardopt_grad_ready_on",
    "shardopt_reduce_gradients",
    "shardopt_clip_grad_norm",
    "shardopt_step",
    "shardopt_loss_scale",
    "shardopt_steps",
    "shardopt_num_params",
    "shardopt_param_info",
    "shardopt_param_grad",
    "shardopt_set_lr",
    "shardopt_set_hparams",
    "shardopt_get_hparam",
    "shardopt_memory_report",
    "shardopt_gather_state",
    "shardopt_check_sync",
    "shardopt_save",
    "shardopt_load",
    "shardopt_load_metadata",
    "shardopt_export",
    "shardopt_step_options_init",
    "shardopt_functional_step",
    "shardopt_functional_slots",
    "shardopt_functional_slot_used",
};
#define NUM_FUNCTIONS (sizeof k_functions / sizeof k_functions[0])
static int g_failed_as_expected[NUM_FUNCTIONS];

/* The function a call's text starts with ("shardopt_step(opt, NULL)"). */
static void record_function(const char* call) {
  size_t n = 0;
  while (call[n] != '\0' && call[n] != '(' && !isspace((unsigned char)call[n])) ++n;
  for (size_t i = 0; i < NUM_FUNCTIONS; ++i)
    if (strlen(k_functions[i]) == n && strncmp(k_functions[i], call, n) == 0)
      g_failed_as_expected[i] = 1;
}

/* ------------------------------------------------------------------------
 * Checks. */

static void failure(int line, const char* fmt, ...) {
  va_list args;
  ++g_failed;
  fprintf(stderr, "rank %d: test_capi_errors.c:%d: ", g_rank, line);
  va_start(args, fmt);
  vfprintf(stderr, fmt, args);
  va_end(args);
  fputc('\n', stderr);
}

static int check_true(int ok, int line, const char* what) {
  ++g_checks;
  if (!ok) failure(line, "check failed: %s", what);
  return ok;
}
#define CHECK(cond) check_true((cond) ? 1 : 0, __LINE__, #cond)

/* Whether `text` contains `needle`, ignoring case. */
static int contains_nocase(const char* text, const char* needle) {
  const size_t n = strlen(needle);
  for (const char* p = text; *p != '\0'; ++p) {
    size_t k = 0;
    while (k < n && p[k] != '\0' &&
           tolower((unsigned char)p[k]) == tolower((unsigned char)needle[k]))
      ++k;
    if (k == n) return 1;
  }
  return n == 0;
}

/* Whether `text` contains one of the '|'-separated alternatives of `needles`. */
static int contains_any(const char* text, const char* needles) {
  char buf[256];
  const char* p = needles;
  for (;;) {
    const char* end = strchr(p, '|');
    const size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
    if (n < sizeof buf) {
      memcpy(buf, p, n);
      buf[n] = '\0';
      if (contains_nocase(text, buf)) return 1;
    }
    if (end == NULL) return 0;
    p = end + 1;
  }
}

static int expect_ok(shardopt_status_t st, int line, const char* call) {
  ++g_checks;
  if (st != SHARDOPT_SUCCESS) {
    failure(line, "%s returned %s: %s (hint: %s)", call, shardopt_status_name(st),
            shardopt_last_error(), shardopt_last_error_hint());
    return 0;
  }
  return 1;
}
#define EXPECT_OK(call) expect_ok((call), __LINE__, #call)

/* The call must fail with `code` (or `alt`, where the header allows either),
 * its message must contain one of `needles` and its hint must not be empty. */
static int expect_err(shardopt_status_t st, shardopt_status_t code, shardopt_status_t alt,
                      const char* needles, int line, const char* call) {
  int ok = 1;
  ++g_checks;
  if (st != code && st != alt) {
    failure(line, "%s returned %s, expected %s: %s", call, shardopt_status_name(st),
            shardopt_status_name(code), st == SHARDOPT_SUCCESS ? "" : shardopt_last_error());
    return 0;
  }
  if (shardopt_last_status() != st) {
    failure(line, "%s: shardopt_last_status() is %s, the call returned %s", call,
            shardopt_status_name(shardopt_last_status()), shardopt_status_name(st));
    ok = 0;
  }
  if (!contains_any(shardopt_last_error(), needles)) {
    failure(line, "%s: the message \"%s\" does not name \"%s\"", call, shardopt_last_error(),
            needles);
    ok = 0;
  }
  if (shardopt_last_error_hint()[0] == '\0') {
    failure(line, "%s: no hint with \"%s\"", call, shardopt_last_error());
    ok = 0;
  }
  if (ok) record_function(call);
  if (g_verbose && g_rank == 0)
    printf("%s\n  -> %s: %s\n     hint: %s\n", call, shardopt_status_name(st),
           shardopt_last_error(), shardopt_last_error_hint());
  return ok;
}
#define EXPECT_ERR(call, code, needles) \
  expect_err((call), (code), (code), (needles), __LINE__, #call)
#define EXPECT_ERR2(call, code, alt, needles) \
  expect_err((call), (code), (alt), (needles), __LINE__, #call)

/* The message or the hint of the last error contains one of `needles`. */
static int last_error_mentions(const char* needles, int line) {
  ++g_checks;
  if (contains_any(shardopt_last_error(), needles) ||
      contains_any(shardopt_last_error_hint(), needles))
    return 1;
  failure(line, "neither \"%s\" nor its hint \"%s\" mentions \"%s\"", shardopt_last_error(),
          shardopt_last_error_hint(), needles);
  return 0;
}
#define LAST_ERROR_MENTIONS(needles) last_error_mentions((needles), __LINE__)

/* The last error speaks C: its message and its hint name no C++ spelling
 * ("ZeroOptions::bucket_mb", "LoadOptions::strict"), and one of them names
 * `c_name`, the C API's word for the thing (a struct field, a constant, a
 * function). */
static int speaks_c(const char* c_name, int line) {
  ++g_checks;
  const char* message = shardopt_last_error();
  const char* hint = shardopt_last_error_hint();
  if (strstr(message, "::") != NULL || strstr(hint, "::") != NULL) {
    failure(line, "\"%s\" (hint: \"%s\") has a C++ spelling (\"::\")", message, hint);
    return 0;
  }
  if (strstr(message, c_name) == NULL && strstr(hint, c_name) == NULL) {
    failure(line, "neither \"%s\" nor its hint \"%s\" names \"%s\"", message, hint, c_name);
    return 0;
  }
  return 1;
}
#define SPEAKS_C(c_name) speaks_c((c_name), __LINE__)

static const shardopt_status_t INVALID_ARGUMENT = SHARDOPT_ERR_INVALID_ARGUMENT;
static const shardopt_status_t INVALID_STATE = SHARDOPT_ERR_INVALID_STATE;

/* A count past PTRDIFF_MAX, as a negative Fortran count arrives. */
#define MINUS_ONE ((size_t)-1)
#define MINUS_THREE ((size_t)-3)

/* Values that are not codes of their enums. */
#define BAD_DTYPE ((shardopt_dtype_t)42)
#define BAD_OP ((shardopt_op_t)42)

/* Collective: whether `local` holds on every rank. */
static int all_ranks(int local) {
  int all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all;
}

/* ------------------------------------------------------------------------
 * Version, errors and status names: nothing can fail there. */

static void test_version(void) {
  g_where = "test_version";
  /* No call has failed on this thread yet. */
  CHECK(shardopt_last_status() == SHARDOPT_SUCCESS);
  CHECK(strcmp(shardopt_last_error(), "") == 0);
  CHECK(strcmp(shardopt_last_error_hint(), "") == 0);

  int major = -1, minor = -1, patch = -1;
  EXPECT_OK(shardopt_version(&major, &minor, &patch));
  CHECK(major == SHARDOPT_VERSION_MAJOR);
  CHECK(minor == SHARDOPT_VERSION_MINOR);
  CHECK(patch == SHARDOPT_VERSION_PATCH);
  CHECK(SHARDOPT_VERSION_NUMBER == 10000 * major + 100 * minor + patch);
  EXPECT_OK(shardopt_version(NULL, NULL, NULL));
  EXPECT_OK(shardopt_version(NULL, &minor, NULL));
  CHECK(minor == SHARDOPT_VERSION_MINOR);
  CHECK(strcmp(shardopt_version_string(), SHARDOPT_VERSION_STRING) == 0);
  char expected[64];
  snprintf(expected, sizeof expected, "%d.%d.%d", major, minor, patch);
  CHECK(strcmp(shardopt_version_string(), expected) == 0);

  CHECK(strcmp(shardopt_status_name(SHARDOPT_SUCCESS), "SHARDOPT_SUCCESS") == 0);
  CHECK(strcmp(shardopt_status_name(SHARDOPT_ERR_MPI), "SHARDOPT_ERR_MPI") == 0);
  CHECK(strcmp(shardopt_status_name(SHARDOPT_ERR_INTERNAL), "SHARDOPT_ERR_INTERNAL") == 0);
  CHECK(strcmp(shardopt_status_name((shardopt_status_t)99), "SHARDOPT_ERR_UNKNOWN") == 0);
  CHECK(strcmp(shardopt_status_name((shardopt_status_t)-1), "SHARDOPT_ERR_UNKNOWN") == 0);
  for (int s = SHARDOPT_SUCCESS; s <= SHARDOPT_ERR_INTERNAL; ++s) {
    CHECK(shardopt_status_description((shardopt_status_t)s)[0] != '\0');
    CHECK(strncmp(shardopt_status_name((shardopt_status_t)s), "SHARDOPT_", 9) == 0);
  }
  CHECK(shardopt_status_description((shardopt_status_t)99) != NULL);

  /* A failure is remembered until the next failure, through successful
   * calls, and shardopt_clear_error() forgets it. */
  EXPECT_ERR(shardopt_device_count(NULL), INVALID_ARGUMENT, "count|null");
  int count = -1;
  EXPECT_OK(shardopt_device_count(&count));
  CHECK(count >= 0);
  CHECK(shardopt_last_status() == INVALID_ARGUMENT);
  CHECK(shardopt_last_error()[0] != '\0');
  shardopt_clear_error();
  CHECK(shardopt_last_status() == SHARDOPT_SUCCESS);
  CHECK(strcmp(shardopt_last_error(), "") == 0);
  CHECK(strcmp(shardopt_last_error_hint(), "") == 0);
}

static void test_devices(void) {
  g_where = "test_devices";
  int count = -1;
  EXPECT_ERR(shardopt_device_count(NULL), INVALID_ARGUMENT, "count|null");
  EXPECT_OK(shardopt_device_count(&count));
  /* Without a device the process has none to choose: either code names
   * the device. */
  EXPECT_ERR2(shardopt_set_device(-1), INVALID_ARGUMENT, SHARDOPT_ERR_WRONG_DEVICE, "device");
  EXPECT_ERR2(shardopt_set_device(count), INVALID_ARGUMENT, SHARDOPT_ERR_WRONG_DEVICE, "device");
  if (count > 0) EXPECT_OK(shardopt_set_device(0));
}

/* ------------------------------------------------------------------------
 * The communicator and its collectives. */

/* Collective: an allreduce through comm gives the sum of 1..size. */
static int sums_correctly(shardopt_comm_t comm) {
  double x = g_rank + 1.0, s = 0.0;
  if (!EXPECT_OK(shardopt_allreduce(comm, &x, &s, 1, SHARDOPT_F64, SHARDOPT_SUM))) return 0;
  return CHECK(s == g_size * (g_size + 1) / 2.0);
}

static shardopt_comm_t test_comm_create(void) {
  g_where = "test_comm_create";
  shardopt_comm_t comm = NULL;
  shardopt_comm_options_t opts;
  EXPECT_ERR(shardopt_comm_options_init(NULL), INVALID_ARGUMENT, "options|null");
  memset(&opts, 0x5a, sizeof opts);
  EXPECT_OK(shardopt_comm_options_init(&opts));
  CHECK(opts.max_chunk_elements == 0);
  CHECK(opts.check_arguments == -1);
  CHECK(opts.stream == NULL);
  CHECK(opts.device_comm == NULL);
  CHECK(opts.host_comm == NULL);

  EXPECT_ERR(shardopt_comm_create(MPI_COMM_NULL, NULL, &comm), INVALID_ARGUMENT,
             "MPI_COMM_NULL|null");
  CHECK(comm == NULL);
  EXPECT_ERR(shardopt_comm_create(MPI_COMM_WORLD, NULL, NULL), INVALID_ARGUMENT, "out|null");
  opts.check_arguments = 7;
  EXPECT_ERR(shardopt_comm_create(MPI_COMM_WORLD, &opts, &comm), INVALID_ARGUMENT,
             "check_arguments");
  opts.check_arguments = -1;
  opts.device_comm = "carrier-pigeon";
  EXPECT_ERR2(shardopt_comm_create(MPI_COMM_WORLD, &opts, &comm), INVALID_ARGUMENT,
              SHARDOPT_ERR_INVALID_CONFIG, "carrier-pigeon");
  LAST_ERROR_MENTIONS("staged");
  CHECK(comm == NULL);
  opts.device_comm = NULL;
  opts.host_comm = "tin-can";
  EXPECT_ERR(shardopt_comm_create(MPI_COMM_WORLD, &opts, &comm), INVALID_ARGUMENT, "tin-can");
  LAST_ERROR_MENTIONS("hier");
  CHECK(comm == NULL);
  EXPECT_ERR(shardopt_comm_create_f(MPI_Comm_c2f(MPI_COMM_NULL), NULL, &comm), INVALID_ARGUMENT,
             "MPI_COMM_NULL|null");
  EXPECT_ERR(shardopt_comm_create_f(MPI_Comm_c2f(MPI_COMM_WORLD), NULL, NULL), INVALID_ARGUMENT,
             "out|null");

  /* Corrected: every option set, to values that work. */
  opts.device_comm = "auto";
  opts.host_comm = "auto";
  opts.check_arguments = 1;
  opts.max_chunk_elements = 1000;
  EXPECT_OK(shardopt_comm_create(MPI_COMM_WORLD, &opts, &comm));
  CHECK(comm != NULL);
  return comm;
}

/* The node layout against MPI's own answer (MPI_Comm_split_type), on one
 * machine or several. */
static void test_comm_node(shardopt_comm_t comm) {
  int node = -1, nodes = -1, local_rank = -1, local_ranks = -1;
  EXPECT_ERR(shardopt_comm_node(NULL, &node, &nodes, &local_rank, &local_ranks), INVALID_ARGUMENT,
             "null|comm");
  EXPECT_ERR(shardopt_comm_node(comm, NULL, NULL, NULL, NULL), INVALID_ARGUMENT, "null|node");
  EXPECT_OK(shardopt_comm_node(comm, &node, &nodes, &local_rank, &local_ranks));
  MPI_Comm shared = MPI_COMM_NULL;
  int mpi_local_rank = -2, mpi_local_size = -2;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &shared);
  MPI_Comm_rank(shared, &mpi_local_rank);
  MPI_Comm_size(shared, &mpi_local_size);
  MPI_Comm_free(&shared);
  CHECK(local_rank == mpi_local_rank);
  CHECK(local_ranks == mpi_local_size);
  CHECK(nodes >= 1 && nodes <= g_size && node >= 0 && node < nodes);
  CHECK(g_rank != 0 || node == 0); /* nodes are numbered from rank 0's */
  /* Each part alone, the others NULL. */
  int only = -1;
  EXPECT_OK(shardopt_comm_node(comm, NULL, &only, NULL, NULL));
  CHECK(only == nodes);
  EXPECT_OK(shardopt_comm_node(comm, NULL, NULL, NULL, &only));
  CHECK(only == local_ranks);
}

static void test_comm_queries(shardopt_comm_t comm) {
  g_where = "test_comm_queries";
  int rank = -1, size = -1;
  MPI_Comm mpi = MPI_COMM_NULL;
  MPI_Fint fmpi = 0;
  const char *host = NULL, *device = NULL;

  EXPECT_ERR(shardopt_comm_rank(NULL, &rank), INVALID_ARGUMENT, "null|comm");
  EXPECT_ERR(shardopt_comm_rank(comm, NULL), INVALID_ARGUMENT, "rank|null");
  EXPECT_OK(shardopt_comm_rank(comm, &rank));
  CHECK(rank == g_rank);
  EXPECT_ERR(shardopt_comm_size(NULL, &size), INVALID_ARGUMENT, "null|comm");
  EXPECT_ERR(shardopt_comm_size(comm, NULL), INVALID_ARGUMENT, "size|null");
  EXPECT_OK(shardopt_comm_size(comm, &size));
  CHECK(size == g_size);
  EXPECT_ERR(shardopt_comm_mpi(comm, NULL), INVALID_ARGUMENT, "out|null");
  EXPECT_ERR(shardopt_comm_mpi(NULL, &mpi), INVALID_ARGUMENT, "null|comm");
  EXPECT_OK(shardopt_comm_mpi(comm, &mpi));
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(mpi, MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT); /* a duplicate, not the world itself */
  EXPECT_ERR(shardopt_comm_mpi_f(NULL, &fmpi), INVALID_ARGUMENT, "null|comm");
  EXPECT_ERR(shardopt_comm_mpi_f(comm, NULL), INVALID_ARGUMENT, "out|null");
  EXPECT_OK(shardopt_comm_mpi_f(comm, &fmpi));
  CHECK(MPI_Comm_f2c(fmpi) == mpi);
  EXPECT_ERR(shardopt_comm_backends(NULL, &host, &device), INVALID_ARGUMENT, "null|comm");
  EXPECT_OK(shardopt_comm_backends(comm, &host, &device));
  /* Shared memory between the ranks of one node unless MPI is asked for
     (the test runs on one node; one rank has nothing to share). */
  const char* asked = getenv("SHARDOPT_HOST_COMM");
  const int want_mpi = size == 1 || (asked != NULL && strcmp(asked, "mpi") == 0);
  CHECK(host != NULL && strcmp(host, want_mpi ? "mpi-host" : "shm") == 0);
  CHECK(device != NULL && device[0] != '\0');
  test_comm_node(comm);
  EXPECT_ERR(shardopt_comm_set_stream(NULL, NULL), INVALID_ARGUMENT, "null|comm");
  EXPECT_OK(shardopt_comm_set_stream(comm, NULL));
}

static void test_collectives(shardopt_comm_t comm) {
  g_where = "test_collectives";
  enum { N = 6 };
  const size_t n = (size_t)g_size;
  float send[N * 4 * 2], recv[N * 4 * 2];
  int32_t isend[N], irecv[N];
  shardopt_request_t req = NULL;
  int done = 0;
  for (size_t i = 0; i < sizeof send / sizeof send[0]; ++i)
    send[i] = (float)(g_rank + 1) * (float)i;
  for (int i = 0; i < N; ++i) isend[i] = g_rank + i;

  /* allreduce */
  EXPECT_ERR(shardopt_allreduce(NULL, send, recv, N, SHARDOPT_F32, SHARDOPT_SUM), INVALID_ARGUMENT,
             "null|comm");
  EXPECT_ERR(shardopt_allreduce(comm, send, recv, N, BAD_DTYPE, SHARDOPT_SUM), INVALID_ARGUMENT,
             "42");
  LAST_ERROR_MENTIONS("dtype|type");
  EXPECT_ERR(shardopt_allreduce(comm, send, recv, N, SHARDOPT_F32, BAD_OP), INVALID_ARGUMENT, "42");
  LAST_ERROR_MENTIONS("op");
  EXPECT_ERR(shardopt_allreduce(comm, send, recv, MINUS_ONE, SHARDOPT_F32, SHARDOPT_SUM),
             INVALID_ARGUMENT, "-1");
  EXPECT_ERR(shardopt_allreduce(comm, NULL, recv, N, SHARDOPT_F32, SHARDOPT_SUM), INVALID_ARGUMENT,
             "send|null");
  EXPECT_ERR(shardopt_allreduce(comm, send, NULL, N, SHARDOPT_F32, SHARDOPT_SUM), INVALID_ARGUMENT,
             "recv|null");
  EXPECT_ERR(shardopt_allreduce(comm, isend, irecv, N, SHARDOPT_I32, SHARDOPT_AVG),
             SHARDOPT_ERR_UNSUPPORTED, "avg");
  SPEAKS_C("SHARDOPT_AVG");
  SPEAKS_C("SHARDOPT_SUM"); /* the hint: reduce with SHARDOPT_SUM and divide */
  /* Corrected: the sum of the integers. */
  if (EXPECT_OK(shardopt_allreduce(comm, isend, irecv, N, SHARDOPT_I32, SHARDOPT_SUM)))
    for (int i = 0; i < N; ++i) CHECK(irecv[i] == g_size * (g_size - 1) / 2 + g_size * i);
  /* Zero elements with NULL buffers are fine. */
  EXPECT_OK(shardopt_allreduce(comm, NULL, NULL, 0, SHARDOPT_F32, SHARDOPT_SUM));

  /* reduce_scatter */
  EXPECT_ERR(shardopt_reduce_scatter(comm, send, recv, 2, BAD_DTYPE, SHARDOPT_SUM),
             INVALID_ARGUMENT, "42");
  EXPECT_ERR(shardopt_reduce_scatter(comm, send, recv, MINUS_THREE, SHARDOPT_F32, SHARDOPT_SUM),
             INVALID_ARGUMENT, "-3");
  EXPECT_ERR(shardopt_reduce_scatter(comm, send, recv, 2, SHARDOPT_F32, (shardopt_op_t)-1),
             INVALID_ARGUMENT, "-1");
  EXPECT_ERR(shardopt_reduce_scatter(comm, send, NULL, 2, SHARDOPT_F32, SHARDOPT_SUM),
             INVALID_ARGUMENT, "recv|null");
  if (EXPECT_OK(shardopt_reduce_scatter(comm, send, recv, 2, SHARDOPT_F32, SHARDOPT_MAX))) {
    /* Block r of rank q is (q + 1) * (2r + j): the max is the last rank's. */
    CHECK(recv[0] == (float)g_size * (float)(2 * g_rank));
    CHECK(recv[1] == (float)g_size * (float)(2 * g_rank + 1));
  }

  /* allgather */
  EXPECT_ERR(shardopt_allgather(comm, send, recv, 2, BAD_DTYPE), INVALID_ARGUMENT, "42");
  EXPECT_ERR(shardopt_allgather(comm, send, recv, MINUS_ONE, SHARDOPT_F32), INVALID_ARGUMENT, "-1");
  EXPECT_ERR(shardopt_allgather(NULL, send, recv, 2, SHARDOPT_F32), INVALID_ARGUMENT, "null|comm");
  if (EXPECT_OK(shardopt_allgather(comm, send, recv, 2, SHARDOPT_F32)))
    for (size_t r = 0; r < n; ++r) CHECK(recv[2 * r + 1] == (float)(r + 1));

  /* broadcast */
  EXPECT_ERR(shardopt_broadcast(comm, recv, 2, SHARDOPT_F32, g_size), INVALID_ARGUMENT, "root");
  EXPECT_ERR(shardopt_broadcast(comm, recv, 2, SHARDOPT_F32, -1), INVALID_ARGUMENT, "root");
  EXPECT_ERR(shardopt_broadcast(comm, recv, 2, BAD_DTYPE, 0), INVALID_ARGUMENT, "42");
  EXPECT_ERR(shardopt_broadcast(comm, recv, MINUS_ONE, SHARDOPT_F32, 0), INVALID_ARGUMENT, "-1");
  recv[0] = (float)g_rank;
  if (EXPECT_OK(shardopt_broadcast(comm, recv, 1, SHARDOPT_F32, g_size - 1)))
    CHECK(recv[0] == (float)(g_size - 1));

  /* barrier */
  EXPECT_ERR(shardopt_barrier(NULL), INVALID_ARGUMENT, "null|comm");
  EXPECT_OK(shardopt_barrier(comm));

  /* Non-blocking forms. */
  EXPECT_ERR(shardopt_iallreduce(comm, send, recv, N, SHARDOPT_F32, SHARDOPT_SUM, NULL),
             INVALID_ARGUMENT, "request|null");
  EXPECT_ERR(shardopt_iallreduce(comm, send, recv, N, SHARDOPT_F32, BAD_OP, &req), INVALID_ARGUMENT,
             "42");
  CHECK(req == NULL);
  EXPECT_ERR(shardopt_iallreduce(comm, send, recv, MINUS_ONE, SHARDOPT_F32, SHARDOPT_SUM, &req),
             INVALID_ARGUMENT, "-1");
  EXPECT_ERR(shardopt_ireduce_scatter(comm, send, recv, 2, BAD_DTYPE, SHARDOPT_SUM, &req),
             INVALID_ARGUMENT, "42");
  EXPECT_ERR(shardopt_ireduce_scatter(comm, send, recv, 2, SHARDOPT_F32, SHARDOPT_SUM, NULL),
             INVALID_ARGUMENT, "request|null");
  EXPECT_ERR(shardopt_iallgather(comm, send, recv, 2, SHARDOPT_F32, NULL), INVALID_ARGUMENT,
             "request|null");
  EXPECT_ERR(shardopt_iallgather(comm, send, recv, MINUS_THREE, SHARDOPT_F32, &req),
             INVALID_ARGUMENT, "-3");
  EXPECT_ERR(shardopt_ibroadcast(comm, recv, 2, SHARDOPT_F32, g_size + 3, &req), INVALID_ARGUMENT,
             "root");
  EXPECT_ERR(shardopt_ibroadcast(NULL, recv, 2, SHARDOPT_F32, 0, &req), INVALID_ARGUMENT,
             "null|comm");
  CHECK(req == NULL);
  EXPECT_ERR(shardopt_wait(NULL), INVALID_ARGUMENT, "request|null");
  EXPECT_OK(shardopt_wait(&req)); /* a NULL *request returns at once */
  EXPECT_ERR(shardopt_test(NULL, &done), INVALID_ARGUMENT, "request|null");

  /* Corrected: each non-blocking form, completed by test() and wait(). */
  if (EXPECT_OK(shardopt_iallreduce(comm, send, recv, N, SHARDOPT_F32, SHARDOPT_SUM, &req))) {
    EXPECT_ERR(shardopt_test(&req, NULL), INVALID_ARGUMENT, "done|null");
    CHECK(req != NULL);
    shardopt_request_t copy = req;
    done = 0;
    while (!done && EXPECT_OK(shardopt_test(&req, &done))) {
    }
    CHECK(req == NULL);
    for (int i = 0; i < N; ++i) CHECK(recv[i] == (float)(g_size * (g_size + 1) / 2) * (float)i);
    /* A copy of the completed request is a destroyed handle. */
    shardopt_request_t copy2 = copy;
    EXPECT_ERR(shardopt_wait(&copy), INVALID_STATE, "destroyed|freed|completed");
    EXPECT_ERR(shardopt_test(&copy2, &done), INVALID_STATE, "destroyed|freed|completed");
  }
  if (EXPECT_OK(shardopt_ireduce_scatter(comm, send, recv, 2, SHARDOPT_F32, SHARDOPT_MIN, &req)))
    EXPECT_OK(shardopt_wait(&req));
  CHECK(recv[1] == (float)(2 * g_rank + 1));
  CHECK(req == NULL);
  if (EXPECT_OK(shardopt_iallgather(comm, send, recv, 1, SHARDOPT_F32, &req)))
    EXPECT_OK(shardopt_wait(&req));
  for (size_t r = 0; r < n; ++r) CHECK(recv[r] == 0.0f);
  recv[0] = (float)(g_rank + 5);
  if (EXPECT_OK(shardopt_ibroadcast(comm, recv, 1, SHARDOPT_F32, 0, &req)))
    EXPECT_OK(shardopt_wait(&req));
  CHECK(recv[0] == 5.0f);
  CHECK(sums_correctly(comm));
}

/* Destroyed handles and handles of the wrong kind. */
static void test_comm_handles(shardopt_comm_t comm) {
  g_where = "test_comm_handles";
  shardopt_comm_t t = NULL, copy = NULL, t2 = NULL;
  int rank = -1;
  EXPECT_ERR(shardopt_comm_destroy(NULL), INVALID_ARGUMENT, "null|comm");
  EXPECT_OK(shardopt_comm_destroy(&t)); /* a NULL *comm: nothing to do */

  if (!EXPECT_OK(shardopt_comm_create_f(MPI_Comm_c2f(MPI_COMM_WORLD), NULL, &t))) return;
  CHECK(sums_correctly(t));
  copy = t;
  EXPECT_OK(shardopt_comm_destroy(&t));
  CHECK(t == NULL);
  EXPECT_ERR(shardopt_comm_rank(copy, &rank), INVALID_STATE, "destroyed");
  EXPECT_ERR(shardopt_comm_size(copy, &rank), INVALID_STATE, "destroyed");
  EXPECT_ERR(shardopt_barrier(copy), INVALID_STATE, "destroyed");
  EXPECT_ERR(shardopt_allreduce(copy, &rank, &rank, 1, SHARDOPT_I32, SHARDOPT_SUM), INVALID_STATE,
             "destroyed");
  EXPECT_ERR(shardopt_comm_set_stream(copy, NULL), INVALID_STATE, "destroyed");
  EXPECT_ERR(shardopt_comm_destroy(&copy), INVALID_STATE, "destroyed");
  /* Still destroyed after a new communicator (perhaps at the same address)
   * is made. */
  if (EXPECT_OK(shardopt_comm_create(MPI_COMM_WORLD, NULL, &t2))) {
    EXPECT_ERR(shardopt_comm_rank(copy, &rank), INVALID_STATE, "destroyed");
    CHECK(sums_correctly(t2));
    EXPECT_OK(shardopt_comm_destroy(&t2));
  }

  /* A value that was never a handle, and handles of another kind. */
  long junk[16] = {0};
  EXPECT_ERR(shardopt_comm_rank((shardopt_comm_t)(void*)junk, &rank), INVALID_ARGUMENT,
             "handle|comm");
  shardopt_request_t not_a_request = (shardopt_request_t)(void*)comm;
  EXPECT_ERR(shardopt_wait(&not_a_request), INVALID_ARGUMENT, "handle|request");
  EXPECT_ERR(shardopt_test(&not_a_request, &rank), INVALID_ARGUMENT, "handle|request");
  CHECK(not_a_request == (shardopt_request_t)(void*)comm); /* untouched */
  CHECK(sums_correctly(comm));
}

/* ------------------------------------------------------------------------
 * The optimizer. */

enum { NP = 3 };
static const size_t k_counts[NP] = {7, 0, 1001};
static float g_data[NP][1001];
static float g_grad0[7];
static const size_t k_shape0[2] = {7, 1};

static void fill_params(shardopt_param_t* p) {
  static const char* const names[NP] = {"weight", "empty", "bias"};
  for (int i = 0; i < NP; ++i) {
    memset(&p[i], 0, sizeof p[i]);
    p[i].name = names[i];
    p[i].data = g_data[i];
    p[i].count = k_counts[i];
    p[i].dtype = SHARDOPT_F32;
    p[i].grad = i == 0 ? g_grad0 : NULL; /* the others: owned by the optimizer */
    p[i].group = i == 2 ? 1 : 0;
    p[i].shape = i == 0 ? k_shape0 : NULL;
    p[i].ndim = i == 0 ? 2 : 0;
    for (size_t j = 0; j < k_counts[i]; ++j) g_data[i][j] = 0.001f * (float)((j * 37 + i) % 101);
  }
}

static shardopt_optimizer_t test_optimizer_create(shardopt_comm_t comm) {
  g_where = "test_optimizer_create";
  shardopt_param_t p[NP];
  shardopt_zero_options_t o;
  shardopt_optimizer_t opt = NULL;
  const char* groups[2] = {"adamw lr=0.01 betas=0.8,0.99", "adamw lr=0.02 weight_decay=0"};
  fill_params(p);

  EXPECT_ERR(shardopt_zero_options_init(NULL), INVALID_ARGUMENT, "options|null");
  memset(&o, 0x5a, sizeof o);
  EXPECT_OK(shardopt_zero_options_init(&o));
  CHECK(o.stage == 1);
  CHECK(o.bucket_mb == 0.0);
  CHECK(o.reduce_sum == 0);
  CHECK(o.predivide_factor == 1.0);
  CHECK(o.reduce_in_fp32 == 0 && o.param_remainders == 0 && o.stream_grads == 0);
  CHECK(o.check_sync_every == 0 && o.non_finite == 0 && o.stream == NULL);
  CHECK(o.loss_scaler == 0);
  CHECK(o.init_scale == 65536.0 && o.growth_factor == 2.0 && o.backoff_factor == 0.5);
  CHECK(o.growth_interval == 2000 && o.hysteresis == 1 && o.min_scale == 1.0);

#define CREATE(params_, n_, groups_, ng_, opts_) \
  shardopt_optimizer_create(comm, (params_), (n_), (groups_), (ng_), (opts_), &opt)
  /* Pointers and counts. */
  EXPECT_ERR(shardopt_optimizer_create(NULL, p, NP, groups, 2, &o, &opt), INVALID_ARGUMENT,
             "null|comm");
  EXPECT_ERR(CREATE(NULL, NP, groups, 2, &o), INVALID_ARGUMENT, "params|null");
  EXPECT_ERR(CREATE(p, MINUS_ONE, groups, 2, &o), INVALID_ARGUMENT, "-1");
  EXPECT_ERR(CREATE(p, NP, NULL, 2, &o), INVALID_ARGUMENT, "groups|null");
  EXPECT_ERR(CREATE(p, NP, groups, 0, &o), INVALID_ARGUMENT, "group");
  EXPECT_ERR(shardopt_optimizer_create(comm, p, NP, groups, 2, &o, NULL), INVALID_ARGUMENT,
             "out|null");
  CHECK(opt == NULL);

  /* Spec strings: the second group's spec, what the message must name and
   * what the message or the hint must also mention (NULL: nothing more). */
  static const struct {
    const char* spec;
    const char* names;
    const char* mentions;
  } k_bad_specs[] = {
      {"adamx lr=0.02", "adamx", "radam"},                   /* lists the keys */
      {"adamw lr=0.02 momentum=0.9", "momentum", "amsgrad"}, /* lists AdamW's hyper-parameters */
      {"adamw lr=abc", "abc", "lr"},
      {"adamw lr", "lr", NULL},
      {"adamw lr=0.01x", "0.01x", NULL},
      {"adamw betas=0.9", "betas", NULL},
      {"adamw amsgrad=maybe", "maybe", NULL},
      {"adamw lr=-1", "-1", "lr|learning rate"},
      {"adamw betas=1.5,0.9", "beta", NULL},
      {"adamw eps=nan", "eps|epsilon", NULL},
      {"", "empty|key|spec", NULL},
      {NULL, "null|group", NULL},
  };
  const char* bad[2] = {groups[0], groups[1]};
  for (size_t i = 0; i < sizeof k_bad_specs / sizeof k_bad_specs[0]; ++i) {
    const int failed_before = g_failed;
    bad[1] = k_bad_specs[i].spec;
    EXPECT_ERR(CREATE(p, NP, bad, 2, &o), INVALID_ARGUMENT, k_bad_specs[i].names);
    if (k_bad_specs[i].mentions != NULL) LAST_ERROR_MENTIONS(k_bad_specs[i].mentions);
    /* The failures above name the loop's line: which spec it was. */
    if (g_failed != failed_before)
      fprintf(stderr, "rank %d:   with the spec \"%s\"\n", g_rank,
              bad[1] != NULL ? bad[1] : "(null)");
  }
  bad[0] = "sgd lr=0.1 nesterov=true";
  bad[1] = "sgd lr=0.1";
  EXPECT_ERR(CREATE(p, NP, bad, 2, &o), INVALID_ARGUMENT, "nesterov");
  bad[0] = groups[0];
  bad[1] = "sgd lr=0.1";
  EXPECT_ERR(CREATE(p, NP, bad, 2, &o), INVALID_ARGUMENT, "sgd|SGD");
  LAST_ERROR_MENTIONS("same kind|every group");

  /* Options: named by their fields in shardopt_zero_options_t. */
  o.stage = 5;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "stage");
  SPEAKS_C("shardopt_zero_options_t.stage is 5");
  o.stage = 1;
  o.prefetch = 2;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "prefetch");
  SPEAKS_C("options->prefetch is 2");
  o.prefetch = 1;
  o.bucket_mb = -1.0;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "bucket_mb");
  SPEAKS_C("shardopt_zero_options_t.bucket_mb is -1");
  o.bucket_mb = 0.0;
  o.non_finite = 7;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "non_finite");
  o.non_finite = 0;
  o.loss_scaler = 1;
  o.init_scale = -1.0;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "init_scale");
  SPEAKS_C("shardopt_zero_options_t.init_scale");
  o.init_scale = 65536.0;
  o.non_finite = SHARDOPT_NON_FINITE_IGNORE; /* no check, which the loss scaler needs */
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "non_finite");
  SPEAKS_C("shardopt_zero_options_t.non_finite is SHARDOPT_NON_FINITE_IGNORE");
  o.non_finite = SHARDOPT_NON_FINITE_AUTO;
  o.loss_scaler = 0;
  o.predivide_factor = 0.0;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "predivide_factor");
  SPEAKS_C("shardopt_zero_options_t.predivide_factor");
  o.predivide_factor = 1.0;
  o.check_sync_every = -5;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "check_sync_every");
  SPEAKS_C("shardopt_zero_options_t.check_sync_every");
  o.check_sync_every = 0;
  o.stream_grads = 1; /* needs stage 2 */
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "stream_grads");
  SPEAKS_C("shardopt_zero_options_t.stream_grads");
  o.stream_grads = 0;

  /* Parameters. */
  p[2].dtype = BAD_DTYPE;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "42");
  p[2].dtype = SHARDOPT_F32;
  p[1].group = 2;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "group");
  p[1].group = 0;
  p[1].unit = -1;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "unit");
  SPEAKS_C("params[1].unit is -1");
  p[1].unit = 0;
  p[2].count = MINUS_ONE;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "-1");
  p[2].count = k_counts[2];
  p[2].data = NULL;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "bias");
  p[2].data = g_data[2];
  p[2].name = NULL;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "name");
  p[2].name = "weight";
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "weight");
  p[2].name = "bias";
  p[0].ndim = 1; /* shape {7} alone: fine; {7, 1} with ndim 2 also; {7, 1, ...} no */
  EXPECT_OK(CREATE(p, NP, groups, 2, &o));
  EXPECT_OK(shardopt_optimizer_destroy(&opt));
  CHECK(opt == NULL);
  p[0].shape = k_counts; /* {7, 0}: product 0 */
  p[0].ndim = 2;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "shape");
  p[0].shape = k_shape0;
  p[0].ndim = -1;
  EXPECT_ERR(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, "ndim|shape");
  p[0].ndim = 2;
  p[2].dtype = SHARDOPT_F64; /* not a parameter type */
  EXPECT_ERR2(CREATE(p, NP, groups, 2, &o), INVALID_ARGUMENT, SHARDOPT_ERR_UNSUPPORTED,
              "f64|dtype");
  p[2].dtype = SHARDOPT_F32;
  CHECK(opt == NULL);

  /* A difference between ranks: every rank fails, none hangs. */
  if (g_size > 1) {
    const char* mine[2] = {groups[0], g_rank == 0 ? "adamw lr=0.03 weight_decay=0" : groups[1]};
    const shardopt_status_t st = CREATE(p, NP, mine, 2, &o);
    EXPECT_ERR(st, SHARDOPT_ERR_LAYOUT_MISMATCH, "lr|hyper");
    /* A spec that only the last rank cannot parse. */
    g_where = "shardopt_optimizer_create with a spec that only the last rank cannot parse";
    mine[1] = g_rank == g_size - 1 ? "adamw lr=0.02 weight_decay=zero" : groups[1];
    const shardopt_status_t st2 = CREATE(p, NP, mine, 2, &o);
    CHECK(st2 != SHARDOPT_SUCCESS);
    if (g_rank == g_size - 1) EXPECT_ERR(st2, INVALID_ARGUMENT, "zero");
    int codes[2] = {(int)st2, -(int)st2};
    MPI_Allreduce(MPI_IN_PLACE, codes, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(codes[0] == -codes[1]); /* the same code everywhere */
    CHECK(opt == NULL);
    g_where = "test_optimizer_create";
  }

  /* Corrected. */
  o.stage = 2;
  o.bucket_mb = 0.001;
  EXPECT_OK(CREATE(p, NP, groups, 2, &o));
#undef CREATE
  CHECK(opt != NULL);
  return opt;
}

/* One step with every gradient marked ready (through the registered, the
 * owned and a copied buffer), clipped to max_norm if it is > 0. */
static int good_step_clipped(shardopt_optimizer_t opt, shardopt_step_info_t* info,
                             double max_norm) {
  void* owned = NULL;
  float g2[1001];
  int ok = EXPECT_OK(shardopt_zero_grad(opt));
  for (int j = 0; j < 7; ++j) g_grad0[j] = 0.01f * (float)(j - 3 + g_rank);
  for (int j = 0; j < 1001; ++j) g2[j] = 0.001f * (float)((j % 13) - 6);
  ok = ok && EXPECT_OK(shardopt_param_grad(opt, 2, &owned)) && CHECK(owned != NULL);
  ok = ok && EXPECT_OK(shardopt_grad_ready(opt, 2, g2));
  ok = ok && EXPECT_OK(shardopt_grad_ready(opt, 1, NULL));
  ok = ok && EXPECT_OK(shardopt_grad_ready(opt, 0, NULL));
  double norm = -2.0;
  if (max_norm > 0.0) {
    ok = ok && EXPECT_OK(shardopt_clip_grad_norm(opt, max_norm, &norm)) && CHECK(norm > 0.0);
  }
  ok = EXPECT_OK(shardopt_step(opt, info)) && ok;
  if (max_norm > 0.0 && info != NULL) ok = CHECK(info->grad_norm == norm) && ok;
  return ok;
}

static int good_step(shardopt_optimizer_t opt, shardopt_step_info_t* info) {
  return good_step_clipped(opt, info, 0.0);
}

static void test_optimizer_calls(shardopt_optimizer_t opt, shardopt_comm_t comm) {
  g_where = "test_optimizer_calls";
  shardopt_step_info_t info;
  double v = 0.0;
  int64_t steps = -1, skipped = -1;
  size_t count = 0;
  shardopt_dtype_t dtype = BAD_DTYPE;
  void* grad = NULL;
  int rank = -1;
  shardopt_comm_t not_a_comm = (shardopt_comm_t)(void*)opt;
  shardopt_optimizer_t not_an_opt = (shardopt_optimizer_t)(void*)comm;

  /* Handles of the wrong kind. */
  EXPECT_ERR(shardopt_comm_rank(not_a_comm, &rank), INVALID_ARGUMENT, "handle|comm");
  EXPECT_ERR(shardopt_zero_grad(not_an_opt), INVALID_ARGUMENT, "handle|optimizer");
  EXPECT_ERR(shardopt_step(not_an_opt, &info), INVALID_ARGUMENT, "handle|optimizer");
  EXPECT_ERR(shardopt_optimizer_create(not_a_comm, NULL, 0, NULL, 0, NULL, &not_an_opt),
             INVALID_ARGUMENT, "handle|comm|null");

  EXPECT_ERR(shardopt_zero_grad(NULL), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_OK(shardopt_zero_grad(opt));

  /* grad_ready and its forms. */
  EXPECT_ERR(shardopt_grad_ready(opt, 3, NULL), INVALID_ARGUMENT, "3");
  LAST_ERROR_MENTIONS("num_params|index|range");
  LAST_ERROR_MENTIONS("from 0 to 2"); /* C numbers parameters from 0 */
  /* The language is the process's: a binding's (Fortran numbers from 1),
   * then C again. */
  EXPECT_ERR(shardopt_set_language(7), INVALID_ARGUMENT, "language");
  EXPECT_OK(shardopt_set_language(SHARDOPT_LANGUAGE_FORTRAN));
  EXPECT_ERR(shardopt_grad_ready(opt, 3, NULL), INVALID_ARGUMENT, "index 4 is not a parameter");
  LAST_ERROR_MENTIONS("from 1 to 3");
  EXPECT_OK(shardopt_set_language(SHARDOPT_LANGUAGE_C));
  EXPECT_ERR(shardopt_grad_ready(opt, 3, NULL), INVALID_ARGUMENT, "index 3 is not a parameter");
  EXPECT_ERR(shardopt_grad_ready(opt, MINUS_ONE, NULL), INVALID_ARGUMENT, "-1");
  EXPECT_ERR(shardopt_grad_ready(NULL, 0, NULL), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_ERR(shardopt_grad_ready_on(opt, NULL, 0, NULL), INVALID_ARGUMENT, "host");
  EXPECT_ERR(shardopt_grad_ready_on(opt, NULL, 5, NULL), INVALID_ARGUMENT, "5|host");
  EXPECT_OK(shardopt_zero_grad(opt));

  /* Some gradients marked, not all: every rank fails in
   * reduce_gradients, naming the ones never marked, and the micro-batch
   * is discarded. */
  EXPECT_OK(shardopt_grad_ready(opt, 0, NULL));
  EXPECT_ERR(shardopt_reduce_gradients(opt), INVALID_STATE, "bias");
  EXPECT_ERR(shardopt_reduce_gradients(NULL), INVALID_ARGUMENT, "null|optimizer");

  EXPECT_ERR(shardopt_clip_grad_norm(opt, -1.0, &v), INVALID_ARGUMENT, "max_norm");
  EXPECT_ERR(shardopt_clip_grad_norm(opt, NAN, NULL), INVALID_ARGUMENT, "max_norm");
  EXPECT_ERR(shardopt_clip_grad_norm(NULL, 1.0, &v), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_ERR(shardopt_step(NULL, &info), INVALID_ARGUMENT, "null|optimizer");

  /* Corrected: a micro-batch reduced (nothing marked: all at once), then
   * a whole step with a clipped norm. */
  EXPECT_OK(shardopt_zero_grad(opt));
  EXPECT_OK(shardopt_reduce_gradients(opt));
  memset(&info, 0x5a, sizeof info);
  CHECK(good_step_clipped(opt, &info, 1e-3));
  CHECK(info.applied == 1 && info.grads_finite == 1 && info.pending == 0);
  CHECK(info.step == 1);
  CHECK(info.loss_scale == 1.0);

  /* Local queries. */
  EXPECT_ERR(shardopt_loss_scale(opt, NULL), INVALID_ARGUMENT, "scale|null");
  EXPECT_ERR(shardopt_loss_scale(NULL, &v), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_OK(shardopt_loss_scale(opt, &v));
  CHECK(v == 1.0);
  EXPECT_ERR(shardopt_steps(NULL, &steps, &skipped), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_OK(shardopt_steps(opt, &steps, &skipped));
  CHECK(steps == 1 && skipped == 0);
  EXPECT_ERR(shardopt_num_params(opt, NULL), INVALID_ARGUMENT, "count|null");
  EXPECT_OK(shardopt_num_params(opt, &count));
  CHECK(count == NP);
  EXPECT_ERR(shardopt_param_info(opt, 3, &count, &dtype), INVALID_ARGUMENT, "3");
  EXPECT_ERR(shardopt_param_info(opt, MINUS_ONE, &count, &dtype), INVALID_ARGUMENT, "-1");
  EXPECT_OK(shardopt_param_info(opt, 2, &count, &dtype));
  CHECK(count == 1001 && dtype == SHARDOPT_F32);
  EXPECT_OK(shardopt_param_info(opt, 1, NULL, &dtype));
  EXPECT_OK(shardopt_param_info(opt, 1, &count, NULL));
  CHECK(count == 0);
  EXPECT_ERR(shardopt_param_grad(opt, 0, NULL), INVALID_ARGUMENT, "grad|null");
  EXPECT_ERR(shardopt_param_grad(opt, 9, &grad), INVALID_ARGUMENT, "9");
  EXPECT_OK(shardopt_param_grad(opt, 0, &grad));
  CHECK(grad == (void*)g_grad0);

  /* Hyper-parameters. */
  EXPECT_ERR(shardopt_set_lr(opt, -1.0, -1), INVALID_ARGUMENT, "lr|learning rate");
  EXPECT_ERR(shardopt_set_lr(opt, NAN, 0), INVALID_ARGUMENT, "lr|learning rate");
  EXPECT_ERR(shardopt_set_lr(opt, 0.1, 2), INVALID_ARGUMENT, "group");
  EXPECT_ERR(shardopt_set_lr(NULL, 0.1, 0), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_OK(shardopt_get_hparam(opt, 0, "lr", &v));
  CHECK(v == 0.01);
  EXPECT_ERR(shardopt_set_hparams(opt, 0, "lr=0.5 bogus=1"), INVALID_ARGUMENT, "bogus");
  LAST_ERROR_MENTIONS("weight_decay");
  EXPECT_ERR(shardopt_set_hparams(opt, -1, "lr=0.5 betas=2,0"), INVALID_ARGUMENT, "beta");
  EXPECT_ERR(shardopt_set_hparams(opt, 1, "weight_decay=abc"), INVALID_ARGUMENT, "abc");
  EXPECT_ERR(shardopt_set_hparams(opt, 0, "lr=-3"), INVALID_ARGUMENT, "-3");
  EXPECT_ERR(shardopt_set_hparams(opt, 5, "lr=0.1"), INVALID_ARGUMENT, "group|5");
  EXPECT_ERR(shardopt_set_hparams(opt, 0, NULL), INVALID_ARGUMENT, "pairs|null");
  EXPECT_ERR(shardopt_set_hparams(opt, 0, "adamw lr=0.1"), INVALID_ARGUMENT, "adamw");
  /* Nothing changed. */
  EXPECT_OK(shardopt_get_hparam(opt, 0, "lr", &v));
  CHECK(v == 0.01);
  EXPECT_OK(shardopt_get_hparam(opt, 1, "lr", &v));
  CHECK(v == 0.02);
  EXPECT_OK(shardopt_get_hparam(opt, 0, "betas", &v));
  CHECK(v == 0.8);
  EXPECT_ERR(shardopt_get_hparam(opt, 0, "bogus", &v), INVALID_ARGUMENT, "bogus");
  EXPECT_ERR(shardopt_get_hparam(opt, 0, "betas.2", &v), INVALID_ARGUMENT, "betas.2");
  EXPECT_ERR(shardopt_get_hparam(opt, 0, "lr", NULL), INVALID_ARGUMENT, "value|null");
  EXPECT_ERR(shardopt_get_hparam(opt, 0, NULL, &v), INVALID_ARGUMENT, "name|null");
  EXPECT_ERR(shardopt_get_hparam(opt, 7, "lr", &v), INVALID_ARGUMENT, "group|7");
  /* Corrected. */
  EXPECT_OK(shardopt_set_hparams(opt, 1, "lr=0.005 betas=0.85,0.995 eps=1e-7"));
  EXPECT_OK(shardopt_get_hparam(opt, 1, "betas.1", &v));
  CHECK(v == 0.995);
  EXPECT_OK(shardopt_get_hparam(opt, 1, "betas.0", &v));
  CHECK(v == 0.85);
  EXPECT_OK(shardopt_get_hparam(opt, 1, "eps", &v));
  CHECK(v == 1e-7);
  EXPECT_OK(shardopt_get_hparam(opt, 0, "amsgrad", &v));
  CHECK(v == 0.0);
  EXPECT_OK(shardopt_set_lr(opt, 0.004, -1));
  EXPECT_OK(shardopt_get_hparam(opt, 0, "lr", &v));
  CHECK(v == 0.004);
  EXPECT_OK(shardopt_get_hparam(opt, 1, "lr", &v));
  CHECK(v == 0.004);

  /* Memory and state. */
  shardopt_memory_report_t mem;
  float state[1001];
  EXPECT_ERR(shardopt_memory_report(opt, NULL), INVALID_ARGUMENT, "report|null");
  EXPECT_OK(shardopt_memory_report(opt, &mem));
  CHECK(mem.user_params == (7 + 1001) * 4);
  CHECK(mem.user_grads == 7 * 4);
  CHECK(mem.owned_grads >= 1001 * 4);
  CHECK(mem.allocated == mem.master_params + mem.optimizer_state + mem.grad_shard +
                             mem.reduced_grads + mem.owned_grads + mem.buckets);
  CHECK(mem.node_shared == 0); /* one gradient is the user's: no fused update */
  EXPECT_ERR(shardopt_gather_state(opt, "nope", 0, state, 7), INVALID_ARGUMENT, "nope");
  LAST_ERROR_MENTIONS("exp_avg");
  EXPECT_ERR(shardopt_gather_state(opt, "exp_avg", 0, state, 6), INVALID_ARGUMENT, "6|7");
  EXPECT_ERR(shardopt_gather_state(opt, "exp_avg", 0, NULL, 7), INVALID_ARGUMENT, "out|null");
  EXPECT_ERR(shardopt_gather_state(opt, "exp_avg", 3, state, 7), INVALID_ARGUMENT, "3");
  EXPECT_ERR(shardopt_gather_state(opt, NULL, 0, state, 7), INVALID_ARGUMENT, "name|null");
  if (EXPECT_OK(shardopt_gather_state(opt, "master", 0, state, 7)))
    for (int j = 0; j < 7; ++j) CHECK(state[j] == g_data[0][j]);
  EXPECT_OK(shardopt_gather_state(opt, "exp_avg", 1, NULL, 0));

  /* check_sync */
  int in_sync = -1;
  char message[512];
  EXPECT_ERR(shardopt_check_sync(opt, NULL, message, sizeof message), INVALID_ARGUMENT,
             "in_sync|null");
  EXPECT_ERR(shardopt_check_sync(NULL, &in_sync, message, sizeof message), INVALID_ARGUMENT,
             "null|optimizer");
  EXPECT_OK(shardopt_check_sync(opt, &in_sync, NULL, 0));
  CHECK(in_sync == 1);
  if (g_size > 1) {
    /* The last rank's copy differs: reported in the message, not as an
     * error. */
    const char* before = shardopt_last_error();
    char kept[512];
    snprintf(kept, sizeof kept, "%s", before);
    const float saved = g_data[2][500];
    if (g_rank == g_size - 1) g_data[2][500] += 1.0f;
    memset(message, 'x', sizeof message);
    EXPECT_OK(shardopt_check_sync(opt, &in_sync, message, sizeof message));
    CHECK(in_sync == 0);
    CHECK(memchr(message, '\0', sizeof message) != NULL);
    CHECK(contains_nocase(message, "bias"));
    CHECK(strcmp(shardopt_last_error(), kept) == 0);
    memset(message, 'x', sizeof message);
    EXPECT_OK(shardopt_check_sync(opt, &in_sync, message, 8));
    CHECK(in_sync == 0);
    CHECK(strlen(message) <= 7);
    CHECK(message[8] == 'x');
    g_data[2][500] = saved;
    EXPECT_OK(shardopt_check_sync(opt, &in_sync, message, sizeof message));
    CHECK(in_sync == 1);
  }

  /* Steps after all the errors. */
  CHECK(good_step(opt, &info));
  CHECK(info.step == 2);
}

/* Collective: a new scratch folder, the same path on every rank. */
static void make_temp_dir(char* dir, size_t size) {
  char path[256] = "";
  if (g_rank == 0) {
    const char* base = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/shardopt-capi-XXXXXX", base != NULL ? base : "/tmp");
    if (mkdtemp(path) == NULL) path[0] = '\0';
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  snprintf(dir, size, "%s", path);
}

static void test_checkpoints(shardopt_optimizer_t opt, shardopt_comm_t comm) {
  g_where = "test_checkpoints";
  char dir[256], path[512], bad[512], garbage[512], missing[512];
  shardopt_load_report_t report;
  char value[64];
  const char* keys[2] = {"epoch", "dataset"};
  const char* values[2] = {"7", "heat-1d"};
  make_temp_dir(dir, sizeof dir);
  if (!CHECK(all_ranks(dir[0] != '\0'))) return;
  snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
  snprintf(bad, sizeof bad, "%s/no-such-folder/ckpt.safetensors", dir);
  snprintf(garbage, sizeof garbage, "%s/garbage.safetensors", dir);
  snprintf(missing, sizeof missing, "%s/missing.safetensors", dir);

  EXPECT_ERR(shardopt_save(opt, path, 0, NULL, NULL, 0), INVALID_ARGUMENT, "keep_last");
  EXPECT_ERR(shardopt_save(opt, NULL, 1, NULL, NULL, 0), INVALID_ARGUMENT, "path|null");
  EXPECT_ERR(shardopt_save(opt, path, 1, NULL, values, 2), INVALID_ARGUMENT, "metadata|keys|null");
  EXPECT_ERR(shardopt_save(opt, path, 1, keys, NULL, 2), INVALID_ARGUMENT, "metadata|values|null");
  EXPECT_ERR(shardopt_save(opt, path, 1, keys, values, MINUS_ONE), INVALID_ARGUMENT, "-1");
  EXPECT_ERR(shardopt_save(NULL, path, 1, NULL, NULL, 0), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_ERR(shardopt_save(opt, bad, 1, NULL, NULL, 0), SHARDOPT_ERR_IO, "no-such-folder");
  EXPECT_OK(shardopt_save(opt, path, 1, keys, values, 2));

  EXPECT_ERR2(shardopt_load_metadata(opt, "epoch", value, sizeof value), INVALID_STATE,
              INVALID_ARGUMENT, "load");
  EXPECT_ERR(shardopt_load(opt, missing, 1, 1, &report), SHARDOPT_ERR_IO, "missing.safetensors");
  if (g_rank == 0) {
    FILE* f = fopen(garbage, "wb");
    if (f != NULL) {
      fputs("this is not a checkpoint, just some bytes in a file", f);
      fclose(f);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_ERR(shardopt_load(opt, garbage, 1, 1, &report), SHARDOPT_ERR_CHECKPOINT,
             "garbage.safetensors");
  EXPECT_ERR(shardopt_load(opt, NULL, 1, 1, &report), INVALID_ARGUMENT, "path|null");
  EXPECT_ERR(shardopt_load(NULL, path, 1, 1, &report), INVALID_ARGUMENT, "null|optimizer");

  /* Corrected: the parameters change, then load brings them back. */
  float before[7];
  memcpy(before, g_data[0], sizeof before);
  shardopt_step_info_t info;
  CHECK(good_step(opt, &info));
  CHECK(memcmp(before, g_data[0], sizeof before) != 0);
  memset(&report, 0x5a, sizeof report);
  if (EXPECT_OK(shardopt_load(opt, path, 1, 1, &report))) {
    CHECK(memcmp(before, g_data[0], sizeof before) == 0);
    CHECK(report.step == 2);
    CHECK(report.saved_ranks == g_size);
    CHECK(report.hyper_parameters == 1);
    CHECK(report.missing == 0 && report.unexpected == 0 && report.mismatched == 0);
    CHECK(report.loaded > 0);
  }
  EXPECT_ERR(shardopt_load_metadata(opt, "nope", value, sizeof value), INVALID_ARGUMENT, "nope");
  EXPECT_ERR(shardopt_load_metadata(opt, "epoch", NULL, sizeof value), INVALID_ARGUMENT,
             "value|null");
  EXPECT_ERR(shardopt_load_metadata(opt, NULL, value, sizeof value), INVALID_ARGUMENT, "key|null");
  EXPECT_ERR(shardopt_load_metadata(NULL, "epoch", value, sizeof value), INVALID_ARGUMENT,
             "null|optimizer");
  if (EXPECT_OK(shardopt_load_metadata(opt, "dataset", value, sizeof value)))
    CHECK(strcmp(value, "heat-1d") == 0);
  if (EXPECT_OK(shardopt_load_metadata(opt, "epoch", value, sizeof value)))
    CHECK(strcmp(value, "7") == 0);
  /* A value longer than the buffer: cut short, or refused naming the size
   * it needs ("heat-1d" and its NUL: 8 bytes). */
  memset(value, 'x', sizeof value);
  const shardopt_status_t st = shardopt_load_metadata(opt, "dataset", value, 4);
  if (st == SHARDOPT_SUCCESS)
    CHECK(strlen(value) <= 3);
  else
    EXPECT_ERR(st, INVALID_ARGUMENT, "8");
  CHECK(value[4] == 'x');
  EXPECT_OK(shardopt_load(opt, path, 0, 0, NULL));

  char exported[512];
  snprintf(exported, sizeof exported, "%s/params.safetensors", dir);
  EXPECT_ERR(shardopt_export(opt, NULL, 1), INVALID_ARGUMENT, "path|null");
  EXPECT_ERR(shardopt_export(opt, bad, 1), SHARDOPT_ERR_IO, "no-such-folder");
  EXPECT_ERR(shardopt_export(NULL, exported, 0), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_OK(shardopt_export(opt, exported, 0));
  /* A parameters-only file is not a checkpoint. */
  EXPECT_ERR(shardopt_load(opt, exported, 1, 1, NULL), SHARDOPT_ERR_CHECKPOINT,
             "params.safetensors");

  /* An optimizer of other parameters, at stage 2 with its gradients
   * streamed: a strict load of the checkpoint names shardopt_load's strict
   * argument, and a gradient marked ready without a buffer names the
   * parameter's missing grad field. */
  static float other[5];
  shardopt_param_t q;
  memset(&q, 0, sizeof q);
  q.name = "other";
  q.data = other;
  q.count = 5;
  q.dtype = SHARDOPT_F32;
  const char* spec = "adamw lr=0.01";
  shardopt_zero_options_t zo;
  EXPECT_OK(shardopt_zero_options_init(&zo));
  zo.stage = 2;
  zo.stream_grads = 1;
  shardopt_optimizer_t streamed = NULL;
  if (EXPECT_OK(shardopt_optimizer_create(comm, &q, 1, &spec, 1, &zo, &streamed))) {
    EXPECT_ERR(shardopt_load(streamed, path, 1, 1, NULL), SHARDOPT_ERR_CHECKPOINT, "match");
    SPEAKS_C("strict = 0 of shardopt_load");
    EXPECT_OK(shardopt_zero_grad(streamed));
    EXPECT_ERR(shardopt_grad_ready(streamed, 0, NULL), INVALID_ARGUMENT, "gradient buffer");
    SPEAKS_C("shardopt_param_t.grad is NULL");
    SPEAKS_C("shardopt_grad_ready(opt, i, grad)");
    EXPECT_OK(shardopt_optimizer_destroy(&streamed));
  }

  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    remove(path);
    remove(garbage);
    remove(exported);
    rmdir(dir);
  }
}

static void test_optimizer_lifetime(shardopt_comm_t comm, shardopt_optimizer_t* opt) {
  g_where = "test_optimizer_lifetime";
  shardopt_optimizer_t copy = *opt;
  shardopt_step_info_t info;
  int64_t steps = 0;
  /* The communicator outlives its optimizers. */
  EXPECT_ERR(shardopt_comm_destroy(&comm), INVALID_STATE, "optimizer");
  CHECK(comm != NULL);
  CHECK(sums_correctly(comm));
  CHECK(good_step(*opt, &info));

  EXPECT_ERR(shardopt_optimizer_destroy(NULL), INVALID_ARGUMENT, "null|optimizer");
  EXPECT_OK(shardopt_optimizer_destroy(opt));
  CHECK(*opt == NULL);
  EXPECT_OK(shardopt_optimizer_destroy(opt)); /* NULL *opt: nothing to do */
  EXPECT_ERR(shardopt_step(copy, &info), INVALID_STATE, "destroyed");
  EXPECT_ERR(shardopt_steps(copy, &steps, NULL), INVALID_STATE, "destroyed");
  EXPECT_ERR(shardopt_zero_grad(copy), INVALID_STATE, "destroyed");
  EXPECT_ERR(shardopt_grad_ready(copy, 0, NULL), INVALID_STATE, "destroyed");
  shardopt_memory_report_t mem;
  EXPECT_ERR(shardopt_memory_report(copy, &mem), INVALID_STATE, "destroyed");
  EXPECT_ERR(shardopt_optimizer_destroy(&copy), INVALID_STATE, "destroyed");
}

/* ------------------------------------------------------------------------
 * Functional steps. */

static void test_functional(void) {
  g_where = "test_functional";
  shardopt_step_options_t so;
  float p[5] = {1, 2, 3, 4, 5}, g[5] = {0.5f, -0.5f, 0.25f, 0, 1}, m[5] = {0}, v[5] = {0},
        vmax[5] = {0};
  float* states[3] = {m, v, NULL};
  int applied = -1, finite = -1, num = -1;
  char name[32];

  EXPECT_ERR(shardopt_step_options_init(NULL), INVALID_ARGUMENT, "options|null");
  memset(&so, 0x5a, sizeof so);
  EXPECT_OK(shardopt_step_options_init(&so));
  CHECK(so.grad_mul == 1.0 && so.param_out == NULL && so.param_out_dtype == SHARDOPT_BF16);
  CHECK(so.stream == NULL && so.skip_nonfinite == 0 && so.remainders == NULL);

#define FSTEP(spec, pt, gt, count, nstates, step)                                             \
  shardopt_functional_step((spec), p, (pt), g, (gt), (count), states, (nstates), (step), &so, \
                           &applied, &finite)
  EXPECT_ERR(FSTEP("adamz", SHARDOPT_F32, SHARDOPT_F32, 5, 3, 1), INVALID_ARGUMENT, "adamz");
  EXPECT_ERR(FSTEP(NULL, SHARDOPT_F32, SHARDOPT_F32, 5, 3, 1), INVALID_ARGUMENT, "spec|null");
  EXPECT_ERR(FSTEP("adam lr=2", SHARDOPT_F32, SHARDOPT_F32, MINUS_ONE, 3, 1), INVALID_ARGUMENT,
             "-1");
  EXPECT_ERR(FSTEP("adam lr=-2", SHARDOPT_F32, SHARDOPT_F32, 5, 3, 1), INVALID_ARGUMENT, "-2");
  EXPECT_ERR(FSTEP("adam", SHARDOPT_F32, SHARDOPT_F32, 5, 2, 1), INVALID_ARGUMENT, "state");
  EXPECT_ERR(FSTEP("adam", SHARDOPT_F32, BAD_DTYPE, 5, 3, 1), INVALID_ARGUMENT, "42");
  EXPECT_ERR2(FSTEP("adam", SHARDOPT_BF16, SHARDOPT_F32, 5, 3, 1), SHARDOPT_ERR_UNSUPPORTED,
              INVALID_ARGUMENT, "remainder");
  EXPECT_ERR(FSTEP("adam amsgrad=true", SHARDOPT_F32, SHARDOPT_F32, 5, 3, 1), INVALID_ARGUMENT,
             "max_exp_avg_sq");
  EXPECT_ERR(FSTEP("adam", SHARDOPT_F32, SHARDOPT_F32, 5, -1, 1), INVALID_ARGUMENT,
             "num_states|-1|state");
  EXPECT_ERR(shardopt_functional_step("adam", NULL, SHARDOPT_F32, g, SHARDOPT_F32, 5, states, 3, 1,
                                      &so, &applied, &finite),
             INVALID_ARGUMENT, "param|null");
  EXPECT_ERR(shardopt_functional_step("adam", p, SHARDOPT_F32, g, SHARDOPT_F32, 5, NULL, 3, 1, &so,
                                      &applied, &finite),
             INVALID_ARGUMENT, "state|null");
  CHECK(p[0] == 1.0f && m[0] == 0.0f); /* nothing written */

  /* Corrected: one Adam step, lr 0.5: each element with a gradient moves
   * by lr against its sign on the first step. */
  if (EXPECT_OK(FSTEP("adam lr=0.5", SHARDOPT_F32, SHARDOPT_F32, 5, 3, 1))) {
    CHECK(applied == 1 && finite == 1);
    CHECK(fabsf(p[0] - 0.5f) < 1e-6f && fabsf(p[1] - 2.5f) < 1e-6f);
    CHECK(p[3] == 4.0f);
  }
  states[2] = vmax;
  EXPECT_OK(FSTEP("adam lr=0.5 amsgrad=1", SHARDOPT_F32, SHARDOPT_F32, 5, 3, 2));
  /* A buffer for a slot the options do not use (SGD without momentum). */
  EXPECT_ERR(shardopt_functional_step("sgd lr=0.1", p, SHARDOPT_F32, g, SHARDOPT_F32, 5, states, 1,
                                      1, NULL, NULL, NULL),
             INVALID_ARGUMENT, "momentum");
  float* no_state[1] = {NULL};
  EXPECT_OK(shardopt_functional_step("sgd lr=0.1", p, SHARDOPT_F32, g, SHARDOPT_F32, 5, no_state, 1,
                                     1, NULL, NULL, NULL));
#undef FSTEP

  EXPECT_ERR(shardopt_functional_slots("adamz", &num, 0, name, sizeof name), INVALID_ARGUMENT,
             "adamz");
  EXPECT_ERR(shardopt_functional_slots("adam", &num, 3, name, sizeof name), INVALID_ARGUMENT, "3");
  EXPECT_ERR(shardopt_functional_slots("adam", &num, -1, name, sizeof name), INVALID_ARGUMENT,
             "-1");
  EXPECT_ERR(shardopt_functional_slots("adam betas=1,1", &num, 0, name, sizeof name),
             INVALID_ARGUMENT, "beta");
  if (EXPECT_OK(shardopt_functional_slots("adam", &num, 2, name, sizeof name))) {
    CHECK(num == 3);
    CHECK(strcmp(name, "max_exp_avg_sq") == 0);
  }
  if (EXPECT_OK(shardopt_functional_slots("lamb", &num, 0, NULL, 0))) CHECK(num == 3);
  int used = -1;
  EXPECT_ERR(shardopt_functional_slot_used("adam", 3, &used), INVALID_ARGUMENT, "3");
  EXPECT_ERR(shardopt_functional_slot_used("adam", 0, NULL), INVALID_ARGUMENT, "used");
  EXPECT_ERR(shardopt_functional_slot_used("sgd lr=x", 0, &used), INVALID_ARGUMENT, "lr=x");
  if (EXPECT_OK(shardopt_functional_slot_used("adam", 2, &used))) CHECK(used == 0);
  if (EXPECT_OK(shardopt_functional_slot_used("adam amsgrad=true", 2, &used))) CHECK(used == 1);
  if (EXPECT_OK(shardopt_functional_slot_used("sgd momentum=0.9", 0, &used))) CHECK(used == 1);
  if (EXPECT_OK(shardopt_functional_slot_used("lamb", 2, &used))) CHECK(used == 1);
  /* A name longer than the buffer: cut short, or refused naming the size
   * it needs ("momentum_buffer" and its NUL: 16 bytes). */
  memset(name, 'x', sizeof name);
  const shardopt_status_t st = shardopt_functional_slots("sgd momentum=0.9", &num, 0, name, 5);
  if (st == SHARDOPT_SUCCESS)
    CHECK(strlen(name) <= 4);
  else
    EXPECT_ERR(st, INVALID_ARGUMENT, "16");
  CHECK(name[5] == 'x');
}

/* ------------------------------------------------------------------------ */

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  /* A call that hangs ends the job instead of the test's timeout. */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);
  alarm(60);
  g_verbose = getenv("SHARDOPT_TEST_VERBOSE") != NULL;

  test_version();
  test_devices();
  shardopt_comm_t comm = test_comm_create();
  if (all_ranks(comm != NULL)) {
    test_comm_queries(comm);
    test_collectives(comm);
    test_comm_handles(comm);
    shardopt_optimizer_t opt = test_optimizer_create(comm);
    if (all_ranks(opt != NULL)) {
      test_optimizer_calls(opt, comm);
      test_checkpoints(opt, comm);
      test_optimizer_lifetime(comm, &opt);
    }
    EXPECT_OK(shardopt_comm_destroy(&comm));
    CHECK(comm == NULL);
  }
  test_functional();

  /* Every function of the header failed as it should at least once. */
  for (size_t i = 0; i < NUM_FUNCTIONS; ++i)
    if (!g_failed_as_expected[i])
      failure(__LINE__, "%s was never seen failing as expected", k_functions[i]);

  int total = 0;
  MPI_Allreduce(&g_failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf("capi-errors: %d ranks, %d checks per rank, %d failed (all ranks)\n", g_size, g_checks,
           total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
