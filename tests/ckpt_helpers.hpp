// Helpers of the checkpoint tests: a directory every rank sees, the layout
// they save, exact training steps (with the reference's alongside) and a
// snapshot of the parameters and gathered states.
#pragma once

#include <mpi.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "zero_helpers.hpp"

namespace shardopt::test::zero {

// A directory every rank sees, removed at the end of the test case.
class TempDir {
 public:
  TempDir() {
    char buf[256] = {};
    if (world_rank() == 0) {
      std::snprintf(buf, sizeof buf, "%s/shardopt-ckpt-XXXXXX",
                    std::filesystem::temp_directory_path().c_str());
      if (::mkdtemp(buf) == nullptr) buf[0] = '\0';
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = buf;
  }
  ~TempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0 && !path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline const Layout& ckpt_layout() {
  static const Layout l = make_layout({37, 1, 300, 0, 129, 64, 5});
  return l;
}

// `count` steps from step `first` on n ranks (this one rank r) with exact
// gradients; the reference, if any, takes the same steps.
inline void train(ZeroRedundancyOptimizer& opt, Model& model, Reference* ref, std::uint64_t key,
                  int first, int count, int n, int r) {
  const Layout& l = model.layout();
  for (int s = first; s < first + count; ++s) {
    opt.zero_grad();
    for (std::size_t i = l.size(); i-- > 0;) {
      // Scaled by the loss scale (a power of 2: exact), which step() undoes.
      fill_grad(model.grad_host(i), model.dtype(), l.sizes[i], GradKind::exact, key, s, r, i, false,
                static_cast<float>(opt.loss_scale()));
      Model::upload(model.grad_data(i), model.grad_host(i), l.sizes[i] * dtype_size(model.dtype()));
      opt.grad_ready(i);
    }
    opt.step();
    if (ref) ref->step(reduced_grads(l, model.dtype(), GradKind::exact, key, s, n), 1.0 / n);
  }
}

inline Snapshot snapshot(ZeroRedundancyOptimizer& opt, Model& model) {
  Snapshot s;
  model.pull();
  for (std::size_t i = 0; i < model.layout().size(); ++i) s.params.push_back(model.all_bits(i));
  for (const std::string& name : opt.state_names())
    for (std::size_t i = 0; i < model.layout().size(); ++i)
      s.states[name].push_back(opt.gather_state(name, i));
  return s;
}

}  // namespace shardopt::test::zero
