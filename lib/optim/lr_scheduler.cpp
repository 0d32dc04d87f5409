// shardopt: learning-rate schedules (shardopt/lr_scheduler.hpp), each
// written as torch 1.13's torch/optim/lr_scheduler.py computes it: the
// chainable form from the groups' current learning rates, in the same order
// of operations on doubles (Python's floats), so that the sequences agree
// bit for bit (tests/test_lr_scheduler.cpp, against torch's).
#include "shardopt/lr_scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <variant>

#include "common/check.hpp"
#include "shardopt/zero.hpp"

namespace shardopt {

namespace {

constexpr double kPi = std::numbers::pi;

// Python's a % b for b > 0: never negative.
std::int64_t py_mod(std::int64_t a, std::int64_t b) {
  const std::int64_t r = a % b;
  return r < 0 ? r + b : r;
}

void require(bool ok, const std::string& what, const std::string& hint) {
  if (!ok) SHARDOPT_THROW(invalid_argument, what, hint);
}

// f of each learning rate of `lrs` (the groups' current ones, or the base
// ones of a closed form).
template <class F>
std::vector<double> each(const std::vector<double>& lrs, F f) {
  std::vector<double> r;
  r.reserve(lrs.size());
  for (double lr : lrs) r.push_back(f(lr));
  return r;
}

// From base to eta_min along half a cosine, at step of period.
double half_cosine(double base, double eta_min, double step, double period) {
  return eta_min + (base - eta_min) * (1.0 + std::cos(kPi * step / period)) / 2.0;
}

}  // namespace

LrGroups::LrGroups(std::vector<double> lrs) : lr_(std::move(lrs)), initial_(lr_) {
  require(!lr_.empty(), "LrGroups: no parameter group", "give one learning rate per group");
}

LrGroups::LrGroups(ZeroRedundancyOptimizer& opt) : opt_(&opt) {
  for (int g = 0; g < opt.num_groups(); ++g)
    lr_.push_back(std::visit([](const auto& c) { return c.lr; }, opt.param_group(g)));
  initial_ = lr_;
}

void LrGroups::set_lr(std::size_t g, double lr) {
  lr_.at(g) = lr;
  if (opt_) opt_->set_lr(lr, static_cast<int>(g));
}

namespace lr_scheduler {

LRScheduler::LRScheduler(LrGroups& groups) : groups_(groups) {
  for (std::size_t g = 0; g < groups.size(); ++g) base_lrs_.push_back(groups.initial_lr(g));
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  for (std::size_t g = 0; g < lrs.size(); ++g) groups_.set_lr(g, lrs[g]);
  last_lr_ = groups_.lrs();
}

void LRScheduler::step() {
  ++last_epoch_;
  apply(get_lr());
}

void LRScheduler::step_to(std::int64_t epoch) {
  last_epoch_ = epoch;
  const std::optional<std::vector<double>> closed = closed_form_lr();
  apply(closed ? *closed : get_lr());
}

std::vector<double> LRScheduler::per_group(const std::vector<double>& values,
                                           const char* what) const {
  if (values.size() == 1) return std::vector<double>(groups_.size(), values[0]);
  require(values.size() == groups_.size(),
          std::string(what) + " has " + std::to_string(values.size()) + " values for " +
              std::to_string(groups_.size()) + " parameter groups",
          "give one value for every group, or one per group");
  return values;
}

// ---------------------------------------------------------------------------

namespace {

std::vector<LambdaLR::Lambda> lambdas_for(std::size_t groups, std::vector<LambdaLR::Lambda> f,
                                          const char* who) {
  require(f.size() == 1 || f.size() == groups,
          std::string(who) + ": " + std::to_string(f.size()) + " functions for " +
              std::to_string(groups) + " parameter groups",
          "give one function for every group, or one per group");
  for (const auto& l : f)
    require(static_cast<bool>(l), std::string(who) + ": an empty function", "give a callable");
  if (f.size() == 1) f.assign(groups, f[0]);
  return f;
}

}  // namespace

LambdaLR::LambdaLR(LrGroups& groups, std::vector<Lambda> lambdas)
    : LRScheduler(groups), lambdas_(lambdas_for(groups.size(), std::move(lambdas), "LambdaLR")) {
  step();
}

std::vector<double> LambdaLR::get_lr() const {
  std::vector<double> r = base_lrs_;
  for (std::size_t g = 0; g < r.size(); ++g) r[g] = r[g] * lambdas_[g](last_epoch_);
  return r;
}

MultiplicativeLR::MultiplicativeLR(LrGroups& groups, std::vector<LambdaLR::Lambda> lambdas)
    : LRScheduler(groups),
      lambdas_(lambdas_for(groups.size(), std::move(lambdas), "MultiplicativeLR")) {
  step();
}

std::vector<double> MultiplicativeLR::get_lr() const {
  std::vector<double> r = groups_.lrs();
  if (last_epoch_ > 0)
    for (std::size_t g = 0; g < r.size(); ++g) r[g] = r[g] * lambdas_[g](last_epoch_);
  return r;
}

StepLR::StepLR(LrGroups& groups, Options o) : LRScheduler(groups), o_(o) {
  require(o.step_size >= 1, "StepLR: step_size is " + std::to_string(o.step_size),
          "give a step size of 1 or more");
  step();
}

std::vector<double> StepLR::get_lr() const {
  if (last_epoch_ == 0 || last_epoch_ % o_.step_size != 0) return groups_.lrs();
  return each(groups_.lrs(), [&](double lr) { return lr * o_.gamma; });
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  const double k = static_cast<double>(last_epoch_ / o_.step_size);
  return each(base_lrs_, [&](double b) { return b * std::pow(o_.gamma, k); });
}

MultiStepLR::MultiStepLR(LrGroups& groups, Options o) : LRScheduler(groups), o_(std::move(o)) {
  std::sort(o_.milestones.begin(), o_.milestones.end());
  step();
}

std::vector<double> MultiStepLR::get_lr() const {
  const double n =
      static_cast<double>(std::count(o_.milestones.begin(), o_.milestones.end(), last_epoch_));
  if (n == 0.0) return groups_.lrs();
  return each(groups_.lrs(), [&](double lr) { return lr * std::pow(o_.gamma, n); });
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  const auto passed = std::upper_bound(o_.milestones.begin(), o_.milestones.end(), last_epoch_) -
                      o_.milestones.begin();
  return each(base_lrs_,
              [&](double b) { return b * std::pow(o_.gamma, static_cast<double>(passed)); });
}

ConstantLR::ConstantLR(LrGroups& groups, Options o) : LRScheduler(groups), o_(o) {
  require(o.factor >= 0.0 && o.factor <= 1.0, "ConstantLR: factor is " + std::to_string(o.factor),
          "give a factor from 0 to 1");
  step();
}

std::vector<double> ConstantLR::get_lr() const {
  if (last_epoch_ == 0) return each(groups_.lrs(), [&](double lr) { return lr * o_.factor; });
  if (last_epoch_ == o_.total_iters)
    return each(groups_.lrs(), [&](double lr) { return lr * (1.0 / o_.factor); });
  return groups_.lrs();
}

std::optional<std::vector<double>> ConstantLR::closed_form_lr() const {
  const double past = last_epoch_ >= o_.total_iters ? 1.0 : 0.0;
  return each(base_lrs_, [&](double b) { return b * (o_.factor + past * (1.0 - o_.factor)); });
}

LinearLR::LinearLR(LrGroups& groups, Options o) : LRScheduler(groups), o_(o) {
  require(o.start_factor > 0.0 && o.start_factor <= 1.0,
          "LinearLR: start_factor is " + std::to_string(o.start_factor),
          "give a start factor above 0 and at most 1");
  require(o.end_factor >= 0.0 && o.end_factor <= 1.0,
          "LinearLR: end_factor is " + std::to_string(o.end_factor),
          "give an end factor from 0 to 1");
  step();
}

std::vector<double> LinearLR::get_lr() const {
  if (last_epoch_ == 0) return each(groups_.lrs(), [&](double lr) { return lr * o_.start_factor; });
  if (last_epoch_ > o_.total_iters) return groups_.lrs();
  const double d = o_.end_factor - o_.start_factor;
  const double f = 1.0 + d / (static_cast<double>(o_.total_iters) * o_.start_factor +
                              static_cast<double>(last_epoch_ - 1) * d);
  return each(groups_.lrs(), [&](double lr) { return lr * f; });
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  const double k = static_cast<double>(std::min(o_.total_iters, last_epoch_));
  const double f =
      o_.start_factor + (o_.end_factor - o_.start_factor) * k / static_cast<double>(o_.total_iters);
  return each(base_lrs_, [&](double b) { return b * f; });
}

ExponentialLR::ExponentialLR(LrGroups& groups, Options o) : LRScheduler(groups), o_(o) { step(); }

std::vector<double> ExponentialLR::get_lr() const {
  if (last_epoch_ == 0) return groups_.lrs();
  return each(groups_.lrs(), [&](double lr) { return lr * o_.gamma; });
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  const double f = std::pow(o_.gamma, static_cast<double>(last_epoch_));
  return each(base_lrs_, [&](double b) { return b * f; });
}

CosineAnnealingLR::CosineAnnealingLR(LrGroups& groups, Options o) : LRScheduler(groups), o_(o) {
  require(o.t_max >= 1, "CosineAnnealingLR: t_max is " + std::to_string(o.t_max),
          "give the steps of the half cosine, 1 or more");
  step();
}

std::vector<double> CosineAnnealingLR::get_lr() const {
  std::vector<double> r = groups_.lrs();
  if (last_epoch_ == 0) return r;
  const double t = static_cast<double>(o_.t_max), e = static_cast<double>(last_epoch_);
  if (py_mod(last_epoch_ - 1 - o_.t_max, 2 * o_.t_max) == 0) {
    for (std::size_t g = 0; g < r.size(); ++g)
      r[g] = r[g] + (base_lrs_[g] - o_.eta_min) * (1.0 - std::cos(kPi / t)) / 2.0;
    return r;
  }
  const double ratio = (1.0 + std::cos(kPi * e / t)) / (1.0 + std::cos(kPi * (e - 1.0) / t));
  return each(r, [&](double lr) { return ratio * (lr - o_.eta_min) + o_.eta_min; });
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  return each(base_lrs_, [&](double b) {
    return half_cosine(b, o_.eta_min, static_cast<double>(last_epoch_),
                       static_cast<double>(o_.t_max));
  });
}

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(LrGroups& groups, Options o)
    : LRScheduler(groups), o_(o), t_i_(o.t_0) {
  require(o.t_0 >= 1, "CosineAnnealingWarmRestarts: t_0 is " + std::to_string(o.t_0),
          "give the steps of the first period, 1 or more");
  require(o.t_mult >= 1, "CosineAnnealingWarmRestarts: t_mult is " + std::to_string(o.t_mult),
          "give a period factor of 1 or more");
  step();
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() const {
  return each(base_lrs_, [&](double b) {
    return half_cosine(b, o_.eta_min, static_cast<double>(t_cur_), static_cast<double>(t_i_));
  });
}

void CosineAnnealingWarmRestarts::step() {
  if (last_epoch_ < 0) {
    step_to(0);
    return;
  }
  ++t_cur_;
  if (t_cur_ >= t_i_) {
    t_cur_ -= t_i_;
    t_i_ *= o_.t_mult;
  }
  ++last_epoch_;
  apply(get_lr());
}

// torch's step(epoch) for whole epochs: the period the epoch falls in.
void CosineAnnealingWarmRestarts::step_to(std::int64_t epoch) {
  require(epoch >= 0, "CosineAnnealingWarmRestarts: epoch " + std::to_string(epoch),
          "give an epoch of 0 or more");
  if (epoch >= o_.t_0 && o_.t_mult == 1) {
    t_cur_ = epoch % o_.t_0;
  } else if (epoch >= o_.t_0) {
    std::int64_t start = 0, period = o_.t_0;
    while (start + period <= epoch) {
      start += period;
      period *= o_.t_mult;
    }
    t_cur_ = epoch - start;
    t_i_ = period;
  } else {
    t_i_ = o_.t_0;
    t_cur_ = epoch;
  }
  last_epoch_ = epoch;
  apply(get_lr());
}

PolynomialLR::PolynomialLR(LrGroups& groups, Options o) : LRScheduler(groups), o_(o) {
  require(o.total_iters >= 1, "PolynomialLR: total_iters is " + std::to_string(o.total_iters),
          "give the steps of the decay, 1 or more");
  step();
}

std::vector<double> PolynomialLR::get_lr() const {
  if (last_epoch_ == 0 || last_epoch_ > o_.total_iters) return groups_.lrs();
  const double t = static_cast<double>(o_.total_iters), e = static_cast<double>(last_epoch_);
  const double decay = std::pow((1.0 - e / t) / (1.0 - (e - 1.0) / t), o_.power);
  return each(groups_.lrs(), [&](double lr) { return lr * decay; });
}

std::optional<std::vector<double>> PolynomialLR::closed_form_lr() const {
  const double k = static_cast<double>(std::min(o_.total_iters, last_epoch_));
  const double f = std::pow(1.0 - k / static_cast<double>(o_.total_iters), o_.power);
  return each(base_lrs_, [&](double b) { return b * f; });
}

OneCycleLR::OneCycleLR(LrGroups& groups, Options o) : LRScheduler(groups), o_(std::move(o)) {
  require(o_.total_steps >= 1, "OneCycleLR: total_steps is " + std::to_string(o_.total_steps),
          "give the steps of the cycle, 1 or more");
  require(o_.pct_start >= 0.0 && o_.pct_start <= 1.0,
          "OneCycleLR: pct_start is " + std::to_string(o_.pct_start),
          "give the share of the steps spent rising, from 0 to 1");
  max_ = per_group(o_.max_lr, "OneCycleLR's max_lr");
  // torch sets each group's initial_lr here, the base of the schedule.
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const double initial = max_[g] / o_.div_factor;
    groups.set_initial_lr(g, initial);
    base_lrs_[g] = initial;
    min_.push_back(initial / o_.final_div_factor);
  }
  const double n = static_cast<double>(o_.total_steps), up = o_.pct_start * n;
  if (o_.three_phase)
    phases_ = {{up - 1.0, 0, 1}, {2.0 * up - 2.0, 1, 0}, {n - 1.0, 0, 2}};
  else
    phases_ = {{up - 1.0, 0, 1}, {n - 1.0, 1, 2}};
  step();
}

std::vector<double> OneCycleLR::get_lr() const {
  require(last_epoch_ <= o_.total_steps,
          "OneCycleLR: step " + std::to_string(last_epoch_) + " is past total_steps " +
              std::to_string(o_.total_steps),
          "give total_steps as the number of steps the run takes");
  const double step = static_cast<double>(last_epoch_);
  std::vector<double> r;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    const double value[3] = {base_lrs_[g], max_[g], min_[g]};
    double start_step = 0.0, lr = 0.0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const Phase& p = phases_[i];
      if (step <= p.end_step || i + 1 == phases_.size()) {
        const double pct = (step - start_step) / (p.end_step - start_step);
        const double a = value[p.start], b = value[p.end];
        lr = o_.anneal_strategy == Anneal::cos ? b + (a - b) / 2.0 * (std::cos(kPi * pct) + 1.0)
                                               : (b - a) * pct + a;
        break;
      }
      start_step = p.end_step;
    }
    r.push_back(lr);
  }
  return r;
}

// ---------------------------------------------------------------------------

ChainedScheduler::ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : schedulers_(std::move(schedulers)) {
  require(!schedulers_.empty(), "ChainedScheduler: no schedule", "give one schedule or more");
  for (const auto& s : schedulers_)
    require(s && &s->groups() == &schedulers_[0]->groups(),
            "ChainedScheduler: the schedules drive different LrGroups",
            "make every schedule on the same LrGroups");
  last_lr_ = schedulers_.back()->groups().lrs();
}

void ChainedScheduler::step() {
  for (const auto& s : schedulers_) s->step();
  last_lr_ = schedulers_.back()->groups().lrs();
}

SequentialLR::SequentialLR(std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<std::int64_t> milestones)
    : schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  require(!schedulers_.empty(), "SequentialLR: no schedule", "give one schedule or more");
  for (const auto& s : schedulers_)
    require(s && &s->groups() == &schedulers_[0]->groups(),
            "SequentialLR: the schedules drive different LrGroups",
            "make every schedule on the same LrGroups");
  require(milestones_.size() + 1 == schedulers_.size(),
          "SequentialLR: " + std::to_string(milestones_.size()) + " milestones for " +
              std::to_string(schedulers_.size()) + " schedules",
          "give one milestone fewer than schedules: where each next one takes over");
  // As torch: the groups back at their initial learning rates, every
  // schedule's step 0 undone, and the first one's made again.
  LrGroups& groups = schedulers_[0]->groups();
  for (std::size_t g = 0; g < groups.size(); ++g) groups.set_lr(g, groups.initial_lr(g));
  for (const auto& s : schedulers_) --s->last_epoch_;
  schedulers_[0]->step();
  last_lr_ = schedulers_[0]->get_last_lr();
}

void SequentialLR::step() {
  ++last_epoch_;
  const auto idx = static_cast<std::size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  LRScheduler& s = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_)
    s.step_to(0);
  else
    s.step();
  last_lr_ = s.get_last_lr();
}

}  // namespace lr_scheduler
}  // namespace shardopt
