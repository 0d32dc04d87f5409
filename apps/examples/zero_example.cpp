// shardopt: the example of docs/api.md, built and run by the tests so that
// the documented code keeps working. A least-squares fit y = W x + b, data
// parallel: every rank draws its own samples, the optimizer averages the
// gradients, shards the AdamW state (stage 2) and keeps W and b identical on
// every rank. Prints the loss every 50 steps and exits 0 if it fell below
// 1e-3.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "shardopt/shardopt.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    const int in = 16, out = 4, batch = 32;

    // The model's parameters and gradients live in the application's buffers.
    std::vector<float> w(out * in, 0.0f), b(out, 0.0f);
    std::vector<float> dw(w.size()), db(b.size());
    std::vector<shardopt::Param> params = {
        {.name = "w", .data = w.data(), .numel = w.size(), .grad = dw.data()},
        {.name = "b", .data = b.data(), .numel = b.size(), .grad = db.data()},
    };
    shardopt::ZeroRedundancyOptimizer opt(comm, params, shardopt::AdamW{.lr = 0.05}, {.stage = 2});

    // The function to learn, the same on every rank; samples differ by rank.
    std::mt19937 truth(42), data(1000 + static_cast<unsigned>(comm.rank()));
    std::normal_distribution<float> normal;
    std::vector<float> w_true(w.size()), b_true(b.size());
    for (float& v : w_true) v = normal(truth);
    for (float& v : b_true) v = normal(truth);

    double loss = 0.0;
    for (int step = 1; step <= 400; ++step) {
      opt.zero_grad();
      loss = 0.0;
      std::vector<float> x(in), err(out);
      for (int s = 0; s < batch; ++s) {
        for (float& v : x) v = normal(data);
        for (int o = 0; o < out; ++o) {
          float pred = b[o], target = b_true[o];
          for (int i = 0; i < in; ++i) {
            pred += w[o * in + i] * x[i];
            target += w_true[o * in + i] * x[i];
          }
          err[o] = pred - target;
          loss += 0.5 * err[o] * err[o] / batch;
          db[o] += err[o] / batch;
          for (int i = 0; i < in; ++i) dw[o * in + i] += err[o] * x[i] / batch;
        }
      }
      // Backward order: b's gradient is "ready" last in a real network's
      // first layer; here both are done, so mark them and step.
      opt.grad_ready(1);
      opt.grad_ready(0);
      opt.step();  // averages the gradients over ranks, updates, allgathers
      MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      loss /= comm.size();
      if (comm.rank() == 0 && step % 50 == 0) std::printf("step %3d  loss %.3e\n", step, loss);
    }
    if (!(loss < 1e-3)) status = 1;
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  }
  MPI_Finalize();
  return status;
}
