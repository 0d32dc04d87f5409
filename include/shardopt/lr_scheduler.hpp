// shardopt: learning-rate schedules, computed as torch.optim.lr_scheduler
// (torch 1.13) computes them, step for step and to the last bit where torch
// follows a formula (docs/schedules.md). Local: no MPI; every rank runs the
// same schedule and gets the same values.
//
//   shardopt::LrGroups lrs(opt);  // the optimizer's groups, bound to it
//   shardopt::lr_scheduler::CosineAnnealingLR cosine(lrs, {.t_max = 1000});
//   for (...) { ... opt.step(); cosine.step(); }  // each step sets opt's lr
//
// As in torch, a schedule applies its step 0 when it is made, and its
// chainable forms change the groups' current learning rates: several
// schedules on one LrGroups compose (ChainedScheduler), and SequentialLR
// hands over from one to the next at milestones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "shardopt/export.h"

namespace shardopt {

class ZeroRedundancyOptimizer;

// What a schedule drives: each parameter group's learning rate, and the one
// it started from (torch's param_groups' "lr" and "initial_lr"). Bound to an
// optimizer, it starts from the groups' learning rates and sets each change
// on the optimizer (set_lr), which must outlive it.
class SHARDOPT_API LrGroups {
 public:
  explicit LrGroups(std::vector<double> lrs);
  explicit LrGroups(ZeroRedundancyOptimizer& opt);

  std::size_t size() const noexcept { return lr_.size(); }
  const std::vector<double>& lrs() const noexcept { return lr_; }
  double lr(std::size_t g) const { return lr_.at(g); }
  double initial_lr(std::size_t g) const { return initial_.at(g); }
  void set_lr(std::size_t g, double lr);
  void set_initial_lr(std::size_t g, double lr) { initial_.at(g) = lr; }

 private:
  std::vector<double> lr_, initial_;
  ZeroRedundancyOptimizer* opt_ = nullptr;
};

namespace lr_scheduler {

// torch's _LRScheduler: last_epoch() steps taken (0 once made), the
// learning rates they gave (get_last_lr()).
class SHARDOPT_API LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // One step: the groups' learning rates become the next step's.
  virtual void step();
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }
  LrGroups& groups() noexcept { return groups_; }

 protected:
  // Every schedule's constructor ends with step(), to epoch 0 (torch's
  // _initial_step(); this constructor cannot: the schedule is not made yet).
  explicit LRScheduler(LrGroups& groups);
  // The learning rates at last_epoch_, from the groups' current ones
  // (torch's chainable get_lr()).
  virtual std::vector<double> get_lr() const = 0;
  // The same from the base learning rates alone, where torch has a closed
  // form (_get_closed_form_lr): what SequentialLR's step(0) uses.
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  // torch's step(epoch): last_epoch_ = epoch, then the closed form if any.
  virtual void step_to(std::int64_t epoch);
  void apply(const std::vector<double>& lrs);
  // Each group's value of a per-group or single-valued option.
  std::vector<double> per_group(const std::vector<double>& values, const char* what) const;

  LrGroups& groups_;
  std::vector<double> base_lrs_;
  std::int64_t last_epoch_ = -1;
  std::vector<double> last_lr_;

  friend class SequentialLR;
  friend class ChainedScheduler;
};

// lr = base_lr * lambda(epoch), a function per group (or one for all).
class SHARDOPT_API LambdaLR : public LRScheduler {
 public:
  using Lambda = std::function<double(std::int64_t epoch)>;
  LambdaLR(LrGroups& groups, std::vector<Lambda> lambdas);

 protected:
  std::vector<double> get_lr() const override;

 private:
  std::vector<Lambda> lambdas_;
};

// lr *= lambda(epoch) at each step after the first.
class SHARDOPT_API MultiplicativeLR : public LRScheduler {
 public:
  MultiplicativeLR(LrGroups& groups, std::vector<LambdaLR::Lambda> lambdas);

 protected:
  std::vector<double> get_lr() const override;

 private:
  std::vector<LambdaLR::Lambda> lambdas_;
};

// lr = base_lr * gamma ^ (epoch / step_size).
class SHARDOPT_API StepLR : public LRScheduler {
 public:
  struct Options {
    std::int64_t step_size = 1;
    double gamma = 0.1;
  };
  StepLR(LrGroups& groups, Options o);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  Options o_;
};

// lr = base_lr * gamma ^ (milestones passed); a milestone given twice
// counts twice.
class SHARDOPT_API MultiStepLR : public LRScheduler {
 public:
  struct Options {
    std::vector<std::int64_t> milestones;
    double gamma = 0.1;
  };
  MultiStepLR(LrGroups& groups, Options o);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  Options o_;  // milestones sorted
};

// lr = base_lr * factor until total_iters, then base_lr.
class SHARDOPT_API ConstantLR : public LRScheduler {
 public:
  struct Options {
    double factor = 1.0 / 3.0;
    std::int64_t total_iters = 5;
  };
  ConstantLR(LrGroups& groups, Options o);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  Options o_;
};

// A linear ramp of the factor from start_factor to end_factor over
// total_iters steps (a warm-up with the defaults), then held.
class SHARDOPT_API LinearLR : public LRScheduler {
 public:
  struct Options {
    double start_factor = 1.0 / 3.0;
    double end_factor = 1.0;
    std::int64_t total_iters = 5;
  };
  LinearLR(LrGroups& groups, Options o);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  Options o_;
};

// lr = base_lr * gamma ^ epoch.
class SHARDOPT_API ExponentialLR : public LRScheduler {
 public:
  struct Options {
    double gamma = 0.9;
  };
  ExponentialLR(LrGroups& groups, Options o);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  Options o_;
};

// Half a cosine from base_lr down to eta_min over t_max steps (and back up
// over the next t_max, as torch's recursive form goes on).
class SHARDOPT_API CosineAnnealingLR : public LRScheduler {
 public:
  struct Options {
    std::int64_t t_max = 1;
    double eta_min = 0.0;
  };
  CosineAnnealingLR(LrGroups& groups, Options o);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  Options o_;
};

// Cosine annealing restarted every t_0 steps, the period multiplied by
// t_mult after each restart (SGDR).
class SHARDOPT_API CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  struct Options {
    std::int64_t t_0 = 1;
    std::int64_t t_mult = 1;
    double eta_min = 0.0;
  };
  CosineAnnealingWarmRestarts(LrGroups& groups, Options o);
  void step() override;
  std::int64_t t_cur() const noexcept { return t_cur_; }
  std::int64_t t_i() const noexcept { return t_i_; }

 protected:
  std::vector<double> get_lr() const override;
  void step_to(std::int64_t epoch) override;

 private:
  Options o_;
  std::int64_t t_cur_ = -1, t_i_ = 1;
};

// lr = base_lr * (1 - epoch / total_iters) ^ power, then held.
class SHARDOPT_API PolynomialLR : public LRScheduler {
 public:
  struct Options {
    std::int64_t total_iters = 5;
    double power = 1.0;
  };
  PolynomialLR(LrGroups& groups, Options o);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  Options o_;
};

// The 1cycle policy over total_steps steps: from max_lr / div_factor up to
// max_lr over the first pct_start of them, then down to that divided by
// final_div_factor (three_phase: back to the start first). The learning
// rate only: torch's default cycle_momentum, which also moves the
// optimizer's momentum (beta1), is not done here (docs/schedules.md).
class SHARDOPT_API OneCycleLR : public LRScheduler {
 public:
  enum class Anneal { cos, linear };
  struct Options {
    std::vector<double> max_lr;  // one for every group, or one per group
    std::int64_t total_steps = 0;
    double pct_start = 0.3;
    Anneal anneal_strategy = Anneal::cos;
    double div_factor = 25.0;
    double final_div_factor = 1e4;
    bool three_phase = false;
  };
  OneCycleLR(LrGroups& groups, Options o);

 protected:
  std::vector<double> get_lr() const override;

 private:
  struct Phase {
    double end_step;
    int start, end;  // 0 initial, 1 max, 2 min learning rate
  };
  Options o_;
  std::vector<Phase> phases_;
  std::vector<double> max_, min_;
};

// Several schedules stepped together, each changing the groups' learning
// rates in turn.
class SHARDOPT_API ChainedScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers);
  void step();
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<double> last_lr_;
};

// schedulers[k] from milestones[k - 1] on, restarted there (its step to
// epoch 0); milestones has one fewer entry than schedulers.
class SHARDOPT_API SequentialLR {
 public:
  SequentialLR(std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<std::int64_t> milestones);
  void step();
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<std::int64_t> milestones_;
  std::int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

}  // namespace lr_scheduler
}  // namespace shardopt
