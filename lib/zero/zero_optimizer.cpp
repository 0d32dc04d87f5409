// shardopt: ZeroRedundancyOptimizer and DistributedOptimizer, over the engine.
#include <sstream>

#include "common/check.hpp"
#include "common/language.hpp"
#include "shardopt/zero.hpp"

using shardopt::detail::throw_error;
#include "zero/engine.hpp"

namespace shardopt {

namespace {

detail::ZeroEngine& engine(const std::unique_ptr<detail::ZeroEngine>& e) {
  if (!e)
    throw_error(ErrorCode::invalid_state, "the optimizer was moved from",
                "use the object it was moved to", __FILE__, __LINE__);
  return *e;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Communicator& comm, std::vector<Param> params,
                                                 std::vector<OptimizerConfig> groups,
                                                 ZeroOptions options)
    : engine_(std::make_unique<detail::ZeroEngine>(comm, std::move(params), std::move(groups),
                                                   std::move(options))) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Communicator& comm, std::vector<Param> params,
                                                 OptimizerConfig optimizer, ZeroOptions options)
    : ZeroRedundancyOptimizer(comm, std::move(params),
                              std::vector<OptimizerConfig>{std::move(optimizer)},
                              std::move(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(ZeroRedundancyOptimizer&&) noexcept = default;
ZeroRedundancyOptimizer& ZeroRedundancyOptimizer::operator=(ZeroRedundancyOptimizer&&) noexcept =
    default;
ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::zero_grad() { engine(engine_).zero_grad(); }
void ZeroRedundancyOptimizer::grad_ready(std::size_t i) { engine(engine_).grad_ready(i, nullptr); }
void ZeroRedundancyOptimizer::grad_ready(std::size_t i, const void* grad) {
  if (grad == nullptr && param(i).numel > 0)
    throw_error(ErrorCode::invalid_argument,
                "grad_ready(" + detail::index_text(i) + ", grad): grad is null",
                "pass the gradient's buffer, or call grad_ready(i) for the registered one",
                __FILE__, __LINE__);
  engine(engine_).grad_ready(i, grad);
}
void ZeroRedundancyOptimizer::grad_ready_on(void* stream, std::size_t i, const void* grad) {
  engine(engine_).grad_ready(i, grad, stream);
}
void ZeroRedundancyOptimizer::reduce_gradients() { engine(engine_).reduce_gradients(); }
double ZeroRedundancyOptimizer::clip_grad_norm(double max_norm) {
  return engine(engine_).clip_grad_norm(max_norm);
}
StepInfo ZeroRedundancyOptimizer::step() { return engine(engine_).step(); }
void ZeroRedundancyOptimizer::save(const std::string& path, const SaveOptions& options) {
  engine(engine_).save(path, options);
}
LoadReport ZeroRedundancyOptimizer::load(const std::string& path, const LoadOptions& options) {
  return engine(engine_).load(path, options);
}
void ZeroRedundancyOptimizer::export_params(const std::string& path, const ExportOptions& options) {
  engine(engine_).export_params(path, options);
}
SyncReport ZeroRedundancyOptimizer::check_sync() { return engine(engine_).check_sync(); }
std::size_t ZeroRedundancyOptimizer::num_units() const { return engine(engine_).num_units(); }
void ZeroRedundancyOptimizer::gather(std::size_t unit) { engine(engine_).gather(unit); }
void ZeroRedundancyOptimizer::igather(std::size_t unit) { engine(engine_).igather(unit); }
void ZeroRedundancyOptimizer::release(std::size_t unit) { engine(engine_).release(unit); }
const void* ZeroRedundancyOptimizer::data(std::size_t i) const { return engine(engine_).data(i); }

std::string LoadReport::summary() const {
  std::ostringstream s;
  s << "step " << step << ", saved at " << saved_ranks << " rank(s); " << loaded.size()
    << " tensor(s) loaded" << (hyper_parameters ? ", hyper-parameters restored" : "");
  const auto line = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    s << "\n" << v.size() << " " << what << ":";
    for (std::size_t i = 0; i < v.size(); ++i) s << (i ? "; " : " ") << v[i];
  };
  line("missing from the file", missing);
  line("in the file only", unexpected);
  line("of another dtype or shape", mismatched);
  return s.str();
}
double ZeroRedundancyOptimizer::loss_scale() const { return engine(engine_).loss_scale(); }
std::int64_t ZeroRedundancyOptimizer::steps() const { return engine(engine_).steps(); }
std::int64_t ZeroRedundancyOptimizer::skipped_steps() const {
  return engine(engine_).skipped_steps();
}
int ZeroRedundancyOptimizer::stage() const { return engine(engine_).stage(); }
std::size_t ZeroRedundancyOptimizer::num_params() const { return engine(engine_).num_params(); }
const Param& ZeroRedundancyOptimizer::param(std::size_t i) const {
  return engine(engine_).param(i);
}
void* ZeroRedundancyOptimizer::grad(std::size_t i) { return engine(engine_).grad(i); }
OptimizerConfig& ZeroRedundancyOptimizer::param_group(int g) {
  return engine(engine_).param_group(g);
}
int ZeroRedundancyOptimizer::num_groups() const { return engine(engine_).num_groups(); }
void ZeroRedundancyOptimizer::set_lr(double lr, int group) { engine(engine_).set_lr(lr, group); }
std::vector<std::string> ZeroRedundancyOptimizer::state_names() const {
  return engine(engine_).state_names();
}
std::span<const ShardRange> ZeroRedundancyOptimizer::owned_ranges() const {
  return engine(engine_).owned_ranges();
}
std::vector<float> ZeroRedundancyOptimizer::gather_state(std::string_view name,
                                                         std::size_t i) const {
  return engine(engine_).gather_state(name, i);
}
std::map<std::string, std::vector<float>> ZeroRedundancyOptimizer::state(std::size_t i) const {
  std::map<std::string, std::vector<float>> out;
  for (const std::string& name : engine(engine_).state_names())
    out[name] = engine(engine_).gather_state(name, i);
  return out;
}
MemoryReport ZeroRedundancyOptimizer::memory_report() const {
  return engine(engine_).memory_report();
}

namespace {
ZeroOptions stage0(ZeroOptions o) {
  o.stage = 0;
  return o;
}
}  // namespace

DistributedOptimizer::DistributedOptimizer(Communicator& comm, std::vector<Param> params,
                                           std::vector<OptimizerConfig> groups, ZeroOptions options)
    : ZeroRedundancyOptimizer(comm, std::move(params), std::move(groups),
                              stage0(std::move(options))) {}

DistributedOptimizer::DistributedOptimizer(Communicator& comm, std::vector<Param> params,
                                           OptimizerConfig optimizer, ZeroOptions options)
    : ZeroRedundancyOptimizer(comm, std::move(params), std::move(optimizer),
                              stage0(std::move(options))) {}

double zero_memory_formula(int stage, double psi, int ranks, DType dtype, double state_bytes) {
  const double p = static_cast<double>(dtype_size(dtype));
  const double master = dtype == DType::f32 ? 0.0 : 4.0;
  const double n = ranks > 0 ? ranks : 1;
  switch (stage) {
    case 0:
      return psi * (2 * p + master + state_bytes);
    case 1:
      return psi * 2 * p + psi * (master + state_bytes) / n;
    case 2:
      return psi * p + psi * (4 + master + state_bytes) / n;
    default:
      return psi * (p + 4 + master + state_bytes) / n;
  }
}

}  // namespace shardopt
