/* heat_inverse: recovers the heat source of a 1-D steady heat problem from
 * noisy temperature readings, with shardopt's sharded Adam from C.
 *
 * The model: a rod on [0, 1] held at temperature 0 at both ends, losing
 * heat to its surroundings, heated by a source f (the fin equation,
 * scaled):
 *
 *     -eps^2 u''(x) + u(x) = f(x),   u(0) = u(1) = 0,
 *     f(x) = sum_j c_j sin(j pi x),  j = 1..M.
 *
 * The M coefficients c_j are unknown. Temperature sensors at NOBS random
 * points read u plus noise; each MPI rank holds every size-th reading. The
 * coefficients are fitted by minimizing the misfit
 *
 *     J(c) = 1/2 sum_i (u(x_i) - d_i)^2
 *
 * by gradient descent with Adam: each rank solves the heat equation by
 * finite differences for the current c, computes its own readings'
 * residuals, and gets their gradient with respect to c from one adjoint
 * solve. shardopt sums the ranks' gradients and updates the coefficients
 * (sharded over the ranks at stages 1 and 2), so every rank holds the same
 * c after each step.
 *
 * Usage: mpirun -n RANKS heat_inverse STAGE STEPS OUTPUT
 *   STAGE   0, 1 or 2: the ZeRO stage
 *   STEPS   optimizer steps (300 reaches the threshold)
 *   OUTPUT  file for the recovered coefficients, one per line
 * Prints one line with the final misfit and the coefficients' relative
 * error, and exits 0 if that error is below 0.03 (the noise allows about
 * 0.015), 1 if not, 2 on bad arguments or a failed call. */
#include <math.h>
#include <shardopt/shardopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  NX = 2047,  /* interior grid points; h = 1 / (NX + 1) */
  M = 256,    /* source coefficients */
  NOBS = 2048 /* sensors, over all ranks */
};
static const double kEps = 0.005;      /* conduction length over rod length */
static const double kNoise = 0.01;     /* sensor noise, relative to the RMS temperature */
static const double kThreshold = 0.03; /* relative error of the coefficients to reach */

/* Stops every rank when a shardopt call fails, with shardopt's message and
 * its hint. */
#define CHECKED(call)                                                               \
  do {                                                                              \
    const shardopt_status_t status_ = (call);                                       \
    if (status_ != SHARDOPT_SUCCESS) fail_call(#call, status_, __FILE__, __LINE__); \
  } while (0)

static void fail_call(const char* call, shardopt_status_t status, const char* file, int line) {
  fprintf(stderr, "%s:%d: %s failed: %s: %s\n  hint: %s\n", file, line, call,
          shardopt_status_name(status), shardopt_last_error(), shardopt_last_error_hint());
  MPI_Abort(MPI_COMM_WORLD, 2);
}

/* Deterministic random numbers (splitmix64), the same on every rank and at
 * every rank count. */
static uint64_t g_seed = 20240611;
static double uniform01(void) {
  uint64_t z = (g_seed += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-53;
}
static double normal(void) {
  const double pi = 3.14159265358979323846;
  const double u1 = 1.0 - uniform01(), u2 = uniform01(); /* u1 in (0, 1] */
  return sqrt(-2.0 * log(u1)) * cos(2.0 * pi * u2);
}

/* The discretization: basis[k * M + j] = sin((j + 1) pi x_k) at grid point
 * x_k = (k + 1) h, and the tridiagonal matrix of the heat operator. */
static double g_basis[NX * M];
static double g_off, g_diag; /* -eps^2/h^2 and 2 eps^2/h^2 + 1 */

static void setup_grid(void) {
  const double pi = 3.14159265358979323846, h = 1.0 / (NX + 1);
  for (int k = 0; k < NX; ++k)
    for (int j = 0; j < M; ++j) g_basis[k * M + j] = sin((j + 1) * pi * (k + 1) * h);
  g_off = -kEps * kEps / (h * h);
  g_diag = 2.0 * kEps * kEps / (h * h) + 1.0;
}

/* f = sum_j c_j sin(j pi x) on the grid. */
static void source(const float* c, double* f) {
  for (int k = 0; k < NX; ++k) {
    double s = 0.0;
    for (int j = 0; j < M; ++j) s += (double)c[j] * g_basis[k * M + j];
    f[k] = s;
  }
}

/* Solves the heat equation A u = f (Thomas algorithm); u may be f. A is
 * symmetric, so the same solve gives the adjoint. */
static void solve(const double* f, double* u) {
  static double cp[NX], dp[NX];
  cp[0] = g_off / g_diag;
  dp[0] = f[0] / g_diag;
  for (int k = 1; k < NX; ++k) {
    const double m = g_diag - g_off * cp[k - 1];
    cp[k] = g_off / m;
    dp[k] = (f[k] - g_off * dp[k - 1]) / m;
  }
  u[NX - 1] = dp[NX - 1];
  for (int k = NX - 2; k >= 0; --k) u[k] = dp[k] - cp[k] * u[k + 1];
}

/* A sensor at x reads the linear interpolation of u between grid points
 * `left` and left + 1 (points -1 and NX are the rod's ends, at 0). */
typedef struct sensor_t {
  int left;
  double weight; /* of point left + 1 */
  double reading;
} sensor_t;

static double interpolate(const double* u, const sensor_t* s) {
  const double ul = s->left >= 0 ? u[s->left] : 0.0;
  const double ur = s->left + 1 < NX ? u[s->left + 1] : 0.0;
  return (1.0 - s->weight) * ul + s->weight * ur;
}

/* This rank's misfit, and its gradient with respect to the coefficients
 * (one forward and one adjoint solve). grad may be NULL. */
static double misfit(const float* c, const sensor_t* sensors, int count, float* grad) {
  static double u[NX], lambda[NX];
  double j = 0.0;
  source(c, u);
  solve(u, u);
  memset(lambda, 0, sizeof lambda);
  for (int i = 0; i < count; ++i) {
    const sensor_t* s = &sensors[i];
    const double r = interpolate(u, s) - s->reading;
    j += 0.5 * r * r;
    if (s->left >= 0) lambda[s->left] += (1.0 - s->weight) * r;
    if (s->left + 1 < NX) lambda[s->left + 1] += s->weight * r;
  }
  if (grad == NULL) return j;
  /* dJ/dc = B^T A^-T Q^T r: the adjoint solve, then the basis. */
  solve(lambda, lambda);
  double g[M] = {0};
  for (int k = 0; k < NX; ++k)
    for (int m = 0; m < M; ++m) g[m] += lambda[k] * g_basis[k * M + m];
  for (int m = 0; m < M; ++m) grad[m] = (float)g[m];
  return j;
}

/* The truth (random coefficients) and the readings of this rank's
 * sensors: every rank draws all of them, the same numbers at any rank
 * count, and keeps every size-th. Returns how many it kept; *sigma is the
 * noise's standard deviation. */
static int make_readings(int rank, int size, float* truth, sensor_t* sensors, double* sigma) {
  static double u[NX];
  for (int j = 0; j < M; ++j) truth[j] = (float)(2.0 * uniform01() - 1.0);
  source(truth, u);
  solve(u, u);
  double rms = 0.0;
  for (int k = 0; k < NX; ++k) rms += u[k] * u[k];
  *sigma = kNoise * sqrt(rms / NX);
  int count = 0;
  for (int i = 0; i < NOBS; ++i) {
    const double t = uniform01() * (NX + 1); /* x / h */
    sensor_t s = {.left = (int)t - 1, .weight = t - (int)t, .reading = 0.0};
    s.reading = interpolate(u, &s) + *sigma * normal();
    if (i % size == rank) sensors[count++] = s;
  }
  return count;
}

/* Writes the coefficients, one per line ("%.9e" keeps every bit of a
 * float). Returns 0 on failure. */
static int write_coefficients(const char* path, const float* c) {
  FILE* out = fopen(path, "w");
  int ok = out != NULL;
  for (int j = 0; ok && j < M; ++j) ok = fprintf(out, "%.9e\n", c[j]) > 0;
  if (out != NULL && fclose(out) != 0) ok = 0;
  if (!ok) fprintf(stderr, "heat_inverse: cannot write %s\n", path);
  return ok;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char *end1 = NULL, *end2 = NULL;
  const long stage = argc == 4 ? strtol(argv[1], &end1, 10) : -1;
  const long steps = argc == 4 ? strtol(argv[2], &end2, 10) : -1;
  if (argc != 4 || *end1 != '\0' || *end2 != '\0' || stage < 0 || stage > 2 || steps < 1 ||
      steps > 1000000) {
    if (rank == 0)
      fprintf(stderr,
              "usage: mpirun -n RANKS %s STAGE STEPS OUTPUT\n"
              "  STAGE 0, 1 or 2; STEPS >= 1 (300 reach the threshold); OUTPUT: a file for "
              "the coefficients\n",
              argv[0]);
    MPI_Finalize();
    return 2;
  }
  setup_grid();
  static float truth[M];
  static sensor_t sensors[NOBS];
  double sigma = 0.0;
  const int count = make_readings(rank, size, truth, sensors, &sigma);

  /* shardopt: a communicator over the ranks, and an optimizer for one
   * parameter, the coefficients (starting at 0), with its gradient buffer.
   * Gradients are summed over the ranks: the misfit is a sum over all
   * ranks' sensors. */
  shardopt_comm_t comm = NULL;
  CHECKED(shardopt_comm_create(MPI_COMM_WORLD, NULL, &comm));
  static float coeffs[M], grad[M];
  const shardopt_param_t param = {.name = "source",
                                  .data = coeffs,
                                  .count = M,
                                  .dtype = SHARDOPT_F32,
                                  .grad = grad,
                                  .group = 0,
                                  .shape = NULL,
                                  .ndim = 0};
  shardopt_zero_options_t options;
  CHECKED(shardopt_zero_options_init(&options));
  options.stage = (int)stage;
  options.reduce_sum = 1;
  const char* groups[1] = {"adam lr=0.1 betas=0.9,0.999"};
  shardopt_optimizer_t opt = NULL;
  CHECKED(shardopt_optimizer_create(comm, &param, 1, groups, 1, &options, &opt));

  /* Gradient descent, with a cosine schedule from lr 0.1 down to 0. */
  const double pi = 3.14159265358979323846;
  for (long step = 0; step < steps; ++step) {
    CHECKED(shardopt_set_lr(opt, 0.05 * (1.0 + cos(pi * (double)step / (double)steps)), -1));
    CHECKED(shardopt_zero_grad(opt));
    misfit(coeffs, sensors, count, grad);
    CHECKED(shardopt_grad_ready(opt, 0, NULL));
    CHECKED(shardopt_step(opt, NULL)); /* coeffs: updated, the same on every rank */
  }

  /* The result: the misfit over all sensors, in noise variances per
   * reading (about 1 once the data are fitted and the noise is not), and
   * the coefficients' relative error. */
  double j_local = misfit(coeffs, sensors, count, NULL), j_total = 0.0;
  CHECKED(shardopt_allreduce(comm, &j_local, &j_total, 1, SHARDOPT_F64, SHARDOPT_SUM));
  double err = 0.0, norm = 0.0;
  for (int j = 0; j < M; ++j) {
    err += ((double)coeffs[j] - truth[j]) * ((double)coeffs[j] - truth[j]);
    norm += (double)truth[j] * truth[j];
  }
  const double rel = sqrt(err / norm);
  int in_sync = 0, written = 1;
  CHECKED(shardopt_check_sync(opt, &in_sync, NULL, 0));
  if (rank == 0) {
    printf(
        "heat_inverse: %d ranks, stage %ld, %ld steps: misfit %.4f per reading, coefficient "
        "error %.4f (threshold %.2f): %s\n",
        size, stage, steps, 2.0 * j_total / NOBS / (sigma * sigma), rel, kThreshold,
        rel < kThreshold ? "reached" : "NOT reached");
    written = write_coefficients(argv[3], coeffs);
  }
  MPI_Bcast(&written, 1, MPI_INT, 0, MPI_COMM_WORLD);

  CHECKED(shardopt_optimizer_destroy(&opt));
  CHECKED(shardopt_comm_destroy(&comm));
  MPI_Finalize();
  return !written ? 2 : in_sync && rel < kThreshold ? 0 : 1;
}
