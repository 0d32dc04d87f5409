/* A C program built against the installed shardopt, as a user's code is:
 * a ZeRO optimizer (stage 2) over two parameters, a few SGD steps (momentum
 * and weight decay) on gradients known in advance, and the result compared
 * with the same update computed here in double precision. Exits non-zero
 * on any failure or mismatch, on every rank. */
#include <math.h>
#include <shardopt/shardopt.h>
#include <stdio.h>

enum { NW = 37, NB = 5, STEPS = 4, NALL = NW + NB };

static const double lr = 0.1, momentum = 0.9, weight_decay = 0.01;

/* This rank's gradient of element i (of both parameters, in order) at a
 * step: the ranks' mean is (size + 1) / 2 times sin(...). */
static double grad_of(int i, int step, int rank) { return sin(0.3 * i + step) * (rank + 1); }

static int check(shardopt_status_t s, const char* what) {
  if (s == SHARDOPT_SUCCESS) return 0;
  fprintf(stderr, "consumer (C): %s failed: %s (%s)\n", what, shardopt_last_error(),
          shardopt_last_error_hint());
  return 1;
}

static int run(int rank, int size) {
  float w[NW], b[NB], dw[NW], db[NB];
  double ref[NALL], buf[NALL];
  for (int i = 0; i < NALL; ++i) {
    ref[i] = 0.5 - 0.01 * i;
    buf[i] = 0.0;
    if (i < NW)
      w[i] = (float)ref[i];
    else
      b[i - NW] = (float)ref[i];
  }

  shardopt_comm_t comm = NULL;
  if (check(shardopt_comm_create(MPI_COMM_WORLD, NULL, &comm), "shardopt_comm_create")) return 1;
  shardopt_param_t params[2] = {
      {.name = "w", .data = w, .count = NW, .dtype = SHARDOPT_F32, .grad = dw},
      {.name = "b", .data = b, .count = NB, .dtype = SHARDOPT_F32, .grad = db},
  };
  const char* groups[1] = {"sgd lr=0.1 momentum=0.9 weight_decay=0.01"};
  shardopt_zero_options_t options;
  shardopt_zero_options_init(&options);
  options.stage = 2;
  shardopt_optimizer_t opt = NULL;
  if (check(shardopt_optimizer_create(comm, params, 2, groups, 1, &options, &opt),
            "shardopt_optimizer_create"))
    return 1;

  int bad = 0;
  for (int step = 0; step < STEPS && !bad; ++step) {
    bad |= check(shardopt_zero_grad(opt), "shardopt_zero_grad");
    for (int i = 0; i < NALL; ++i) {
      if (i < NW)
        dw[i] = (float)grad_of(i, step, rank);
      else
        db[i - NW] = (float)grad_of(i, step, rank);
    }
    bad |= check(shardopt_grad_ready(opt, 1, NULL), "shardopt_grad_ready");
    bad |= check(shardopt_grad_ready(opt, 0, NULL), "shardopt_grad_ready");
    bad |= check(shardopt_step(opt, NULL), "shardopt_step");
    /* torch.optim.SGD: g += wd p; buf = g (first step), mu buf + g; p -= lr buf. */
    for (int i = 0; i < NALL; ++i) {
      double g = 0.0;
      for (int r = 0; r < size; ++r) g += grad_of(i, step, r);
      g = g / size + weight_decay * ref[i];
      buf[i] = step == 0 ? g : momentum * buf[i] + g;
      ref[i] -= lr * buf[i];
    }
  }
  for (int i = 0; i < NALL && !bad; ++i) {
    double got = i < NW ? w[i] : b[i - NW];
    if (fabs(got - ref[i]) > 1e-5 * (1.0 + fabs(ref[i]))) {
      fprintf(stderr, "consumer (C): rank %d: element %d is %.8f, expected %.8f\n", rank, i, got,
              ref[i]);
      bad = 1;
    }
  }
  int64_t steps = 0;
  bad |= check(shardopt_steps(opt, &steps, NULL), "shardopt_steps");
  if (!bad && steps != STEPS) {
    fprintf(stderr, "consumer (C): %lld steps counted, expected %d\n", (long long)steps, STEPS);
    bad = 1;
  }
  bad |= check(shardopt_optimizer_destroy(&opt), "shardopt_optimizer_destroy");
  bad |= check(shardopt_comm_destroy(&comm), "shardopt_comm_destroy");
  return bad;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int bad = run(rank, size), any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && !any)
    printf("consumer (C): %d SGD steps at %d ranks match the reference (shardopt %s)\n", STEPS,
           size, shardopt_version_string());
  MPI_Finalize();
  return any;
}
