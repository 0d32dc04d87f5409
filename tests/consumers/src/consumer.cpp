// A C++ program built against the installed shardopt, as a user's code is:
// a ZeRO optimizer (stage 2) over two parameters, a few SGD steps (momentum
// and weight decay) on gradients known in advance, and the result compared
// with the same update computed here in double precision, and the ranks'
// parameters compared through Communicator's std::span overloads. Exits
// non-zero on any failure or mismatch, on every rank.
#include <cmath>
#include <cstdio>
#include <shardopt/shardopt.hpp>
#include <span>
#include <vector>

namespace {

constexpr int kSteps = 4;
constexpr double kLr = 0.1, kMomentum = 0.9, kWeightDecay = 0.01;

// This rank's gradient of element i (of both parameters, in order) at a step.
double grad_of(std::size_t i, int step, int rank) {
  return std::sin(0.3 * static_cast<double>(i) + step) * (rank + 1);
}

bool run(shardopt::Communicator& comm) {
  std::vector<float> w(37), b(5), dw(w.size()), db(b.size());
  const std::size_t n = w.size() + b.size();
  std::vector<double> ref(n), buf(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    ref[i] = 0.5 - 0.01 * static_cast<double>(i);
    (i < w.size() ? w[i] : b[i - w.size()]) = static_cast<float>(ref[i]);
  }
  std::vector<shardopt::Param> params = {
      {.name = "w", .data = w.data(), .numel = w.size(), .grad = dw.data()},
      {.name = "b", .data = b.data(), .numel = b.size(), .grad = db.data()},
  };
  shardopt::ZeroRedundancyOptimizer opt(
      comm, params, shardopt::SGD{.lr = kLr, .momentum = kMomentum, .weight_decay = kWeightDecay},
      {.stage = 2});
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    for (std::size_t i = 0; i < n; ++i)
      (i < w.size() ? dw[i] : db[i - w.size()]) = static_cast<float>(grad_of(i, step, comm.rank()));
    opt.grad_ready(1);
    opt.grad_ready(0);
    opt.step();
    // torch.optim.SGD: g += wd p; buf = g (first step), mu buf + g; p -= lr buf.
    for (std::size_t i = 0; i < n; ++i) {
      double g = 0.0;
      for (int r = 0; r < comm.size(); ++r) g += grad_of(i, step, r);
      g = g / comm.size() + kWeightDecay * ref[i];
      buf[i] = step == 0 ? g : kMomentum * buf[i] + g;
      ref[i] -= kLr * buf[i];
    }
  }
  bool good = opt.steps() == kSteps;
  if (!good)
    std::fprintf(stderr, "consumer (C++): %lld steps counted, expected %d\n",
                 static_cast<long long>(opt.steps()), kSteps);
  for (std::size_t i = 0; i < n && good; ++i) {
    const double got = i < w.size() ? w[i] : b[i - w.size()];
    if (std::fabs(got - ref[i]) > 1e-5 * (1.0 + std::fabs(ref[i]))) {
      std::fprintf(stderr, "consumer (C++): rank %d: element %zu is %.8f, expected %.8f\n",
                   comm.rank(), i, got, ref[i]);
      good = false;
    }
  }
  // After the step's gather every rank holds the same parameters: their
  // sum over the ranks is size() times this rank's.
  std::vector<float> sum(w.size());
  comm.allreduce(std::span<const float>(w), std::span<float>(sum), shardopt::ReduceOp::sum);
  for (std::size_t i = 0; i < w.size() && good; ++i) {
    if (std::fabs(sum[i] - static_cast<float>(comm.size()) * w[i]) > 1e-5f * comm.size()) {
      std::fprintf(stderr, "consumer (C++): rank %d: the ranks' element %zu differ (sum %.8f)\n",
                   comm.rank(), i, static_cast<double>(sum[i]));
      good = false;
    }
  }
  return good;
}

}  // namespace

int main(int argc, char** argv) {
  shardopt::Environment env(&argc, &argv);
  int bad = 0, any = 0;
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    bad = run(comm) ? 0 : 1;
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "consumer (C++): %s\n", e.what());
    bad = 1;
  }
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank == 0 && !any)
    std::printf("consumer (C++): %d SGD steps at %d ranks match the reference (shardopt %s)\n",
                kSteps, size, SHARDOPT_VERSION_STRING);
  return any;
}
