// shardopt: the C++ API's names in messages, spelled as the C API's caller
// writes them (capi.hpp, in_callers_words).
//
// The library's messages and hints are written once, in the words of the
// C++ API (ZeroOptions::bucket_mb, LoadOptions::strict = false, step()).
// A C or Fortran user has other names for the same things: the C API's
// struct fields, constants and functions, or the Fortran module's keyword
// arguments and derived types. Every error the C API records passes through
// this table, so a message speaks its caller's language without the
// library's code knowing who called it. Each target names something that
// exists in include/shardopt/shardopt.h or lib/fortran/shardopt.f90; where
// the module has no spelling of its own (it does not expose the option) the
// Fortran column repeats the C one, which a Fortran code can still call.
//
// A spelling is replaced where it stands alone (not inside a longer
// identifier: "step()" is left alone in "shardopt_step()"), scanning the
// text once, trying the rows in order at each position: a longer phrase is
// listed before the shorter spellings it contains.
#include <array>
#include <string>
#include <string_view>

#include "capi.hpp"

namespace shardopt::capi {
namespace {

struct Spelling {
  std::string_view cpp;      // as the library's messages write it
  std::string_view c;        // SHARDOPT_LANGUAGE_C
  std::string_view fortran;  // SHARDOPT_LANGUAGE_FORTRAN
};

// clang-format off
constexpr std::array kSpellings = std::to_array<Spelling>({
  // Phrases first: an option with its value.
  {"ZeroOptions::non_finite = NonFinite::skip",
   "shardopt_zero_options_t.non_finite = SHARDOPT_NON_FINITE_SKIP",
   "non_finite=SHARDOPT_NON_FINITE_SKIP of shardopt_optimizer_create"},
  {"ZeroOptions::reduction = GradReduction::sum", "shardopt_zero_options_t.reduce_sum = 1",
   "reduce_sum=.true. of shardopt_optimizer_create"},
  {"ZeroOptions::reduction = GradReduction::avg", "shardopt_zero_options_t.reduce_sum = 0",
   "reduce_sum=.false. of shardopt_optimizer_create"},
  {"NonFinite::automatic, skip, error or ignore",
   "SHARDOPT_NON_FINITE_AUTO, SHARDOPT_NON_FINITE_SKIP, SHARDOPT_NON_FINITE_ERROR or "
   "SHARDOPT_NON_FINITE_IGNORE",
   "SHARDOPT_NON_FINITE_AUTO, SHARDOPT_NON_FINITE_SKIP, SHARDOPT_NON_FINITE_ERROR or "
   "SHARDOPT_NON_FINITE_IGNORE"},
  {"LoadOptions::strict = false", "strict = 0 of shardopt_load", "strict=.false. of shardopt_load"},
  {"LoadOptions differ", "the strict and hyper_parameters arguments of shardopt_load differ",
   "strict= and hyper_parameters= of shardopt_load differ"},
  {"Param::grad is null", "shardopt_param_t.grad is NULL",
   "no grad= array was given to shardopt_params_add"},
  {"ReduceOp::sum, avg, max, min", "SHARDOPT_SUM, SHARDOPT_AVG, SHARDOPT_MAX, SHARDOPT_MIN",
   "SHARDOPT_SUM, SHARDOPT_AVG, SHARDOPT_MAX, SHARDOPT_MIN"},
  {"DType::f32, f64, bf16, f16, i32, i64",
   "SHARDOPT_F32, SHARDOPT_F64, SHARDOPT_BF16, SHARDOPT_F16, SHARDOPT_I32, SHARDOPT_I64",
   "SHARDOPT_F32, SHARDOPT_F64, SHARDOPT_BF16, SHARDOPT_F16, SHARDOPT_I32, SHARDOPT_I64"},

  // shardopt::ZeroOptions: shardopt_zero_options_t, and in Fortran the
  // keyword arguments of shardopt_optimizer_create where it has them.
  {"ZeroOptions::stage", "shardopt_zero_options_t.stage", "stage= of shardopt_optimizer_create"},
  {"ZeroOptions::bucket_mb", "shardopt_zero_options_t.bucket_mb",
   "bucket_mb= of shardopt_optimizer_create"},
  {"ZeroOptions::reduction", "shardopt_zero_options_t.reduce_sum",
   "reduce_sum= of shardopt_optimizer_create"},
  {"ZeroOptions::check_sync_every", "shardopt_zero_options_t.check_sync_every",
   "check_sync_every= of shardopt_optimizer_create"},
  {"ZeroOptions::non_finite", "shardopt_zero_options_t.non_finite",
   "non_finite= of shardopt_optimizer_create"},
  {"ZeroOptions::loss_scaler", "shardopt_zero_options_t.loss_scaler",
   "loss_scaler= of shardopt_optimizer_create"},
  {"ZeroOptions::predivide_factor", "shardopt_zero_options_t.predivide_factor",
   "shardopt_zero_options_t%predivide_factor"},
  {"ZeroOptions::reduce_in_fp32", "shardopt_zero_options_t.reduce_in_fp32",
   "shardopt_zero_options_t%reduce_in_fp32"},
  {"ZeroOptions::param_remainders", "shardopt_zero_options_t.param_remainders",
   "shardopt_zero_options_t%param_remainders"},
  {"ZeroOptions::stream_grads", "shardopt_zero_options_t.stream_grads",
   "shardopt_zero_options_t%stream_grads"},
  {"ZeroOptions::stream", "shardopt_zero_options_t.stream", "shardopt_zero_options_t%stream"},
  {"ZeroOptions::gather_limit_bytes", "shardopt_zero_options_t.gather_limit_bytes",
   "shardopt_zero_options_t%gather_limit_bytes"},
  {"LossScaler::init_scale", "shardopt_zero_options_t.init_scale",
   "shardopt_zero_options_t%init_scale"},
  {"LossScaler::growth_factor", "shardopt_zero_options_t.growth_factor",
   "shardopt_zero_options_t%growth_factor"},
  {"LossScaler::backoff_factor", "shardopt_zero_options_t.backoff_factor",
   "shardopt_zero_options_t%backoff_factor"},
  {"LossScaler::growth_interval", "shardopt_zero_options_t.growth_interval",
   "shardopt_zero_options_t%growth_interval"},
  {"LossScaler::hysteresis", "shardopt_zero_options_t.hysteresis",
   "shardopt_zero_options_t%hysteresis"},
  {"LossScaler::min_scale", "shardopt_zero_options_t.min_scale",
   "shardopt_zero_options_t%min_scale"},
  {"NonFinite::automatic", "SHARDOPT_NON_FINITE_AUTO", "SHARDOPT_NON_FINITE_AUTO"},
  {"NonFinite::skip", "SHARDOPT_NON_FINITE_SKIP", "SHARDOPT_NON_FINITE_SKIP"},
  {"NonFinite::error", "SHARDOPT_NON_FINITE_ERROR", "SHARDOPT_NON_FINITE_ERROR"},
  {"NonFinite::ignore", "SHARDOPT_NON_FINITE_IGNORE", "SHARDOPT_NON_FINITE_IGNORE"},
  {"GradReduction::sum", "reduce_sum = 1", "reduce_sum=.true."},
  {"GradReduction::avg", "reduce_sum = 0", "reduce_sum=.false."},
  {"LoadOptions::strict", "strict of shardopt_load", "strict= of shardopt_load"},
  {"Param::grad", "shardopt_param_t.grad", "grad= of shardopt_params_add"},

  // The communicator and its options.
  {"Communicator::free()", "shardopt_comm_destroy()", "shardopt_comm_destroy()"},
  {"Communicator::free", "shardopt_comm_destroy", "shardopt_comm_destroy"},
  {"shardopt::Communicator", "communicator (shardopt_comm_create)",
   "communicator (shardopt_comm_create)"},
  {"CommOptions::max_chunk_elements", "shardopt_comm_options_t.max_chunk_elements",
   "max_chunk_elements= of shardopt_comm_create"},
  {"CommOptions::device_comm", "shardopt_comm_options_t.device_comm",
   "device_comm= of shardopt_comm_create"},
  {"CommOptions::host_comm", "shardopt_comm_options_t.host_comm",
   "host_comm= of shardopt_comm_create"},
  {"CommOptions::stream", "shardopt_comm_options_t.stream", "shardopt_comm_options_t.stream"},
  {"ReduceOp::sum", "SHARDOPT_SUM", "SHARDOPT_SUM"},
  {"ReduceOp::avg", "SHARDOPT_AVG", "SHARDOPT_AVG"},
  {"ReduceOp::max", "SHARDOPT_MAX", "SHARDOPT_MAX"},
  {"ReduceOp::min", "SHARDOPT_MIN", "SHARDOPT_MIN"},
  {"DType::f32", "SHARDOPT_F32", "SHARDOPT_F32"},
  {"DType::f64", "SHARDOPT_F64", "SHARDOPT_F64"},
  {"DType::bf16", "SHARDOPT_BF16", "SHARDOPT_BF16"},
  {"DType::f16", "SHARDOPT_F16", "SHARDOPT_F16"},
  {"DType::i32", "SHARDOPT_I32", "SHARDOPT_I32"},
  {"DType::i64", "SHARDOPT_I64", "SHARDOPT_I64"},

  // The functional optimizers' options.
  {"StepOptions::grad_mul", "shardopt_step_options_t.grad_mul",
   "grad_mul= of shardopt_functional_step"},
  {"StepOptions::param_out_dtype", "shardopt_step_options_t.param_out_dtype",
   "shardopt_step_options_t.param_out_dtype"},
  {"StepOptions::param_out", "shardopt_step_options_t.param_out",
   "shardopt_step_options_t.param_out"},

  // Methods, named by the function that calls them.
  {"ZeroRedundancyOptimizer::save()", "shardopt_save()", "shardopt_save()"},
  {"grad_ready(i, grad)", "shardopt_grad_ready(opt, i, grad)", "shardopt_grad_ready(opt, i, grad)"},
  {"grad_ready(i)", "shardopt_grad_ready(opt, i, NULL)", "shardopt_grad_ready(opt, i)"},
  {"grad_ready(", "shardopt_grad_ready(opt, ", "shardopt_grad_ready(opt, "},
  {"reduce_gradients()", "shardopt_reduce_gradients()", "shardopt_reduce_gradients()"},
  {"clip_grad_norm()", "shardopt_clip_grad_norm()", "shardopt_clip_grad_norm()"},
  {"zero_grad()", "shardopt_zero_grad()", "shardopt_zero_grad()"},
  {"step()", "shardopt_step()", "shardopt_step()"},
  {"save()", "shardopt_save()", "shardopt_save()"},
  {"load()", "shardopt_load()", "shardopt_load()"},
  {"check_sync()", "shardopt_check_sync()", "shardopt_check_sync()"},
  {"export_params()", "shardopt_export()", "shardopt_export()"},
  {"num_params()", "shardopt_num_params()", "shardopt_num_params()"},
  {"num_units()", "shardopt_num_units()", "shardopt_num_units()"},
  {"gather()", "shardopt_gather_unit()", "shardopt_gather_unit()"},
  {"release()", "shardopt_release_unit()", "shardopt_release_unit()"},
  {"gather(", "shardopt_gather_unit(", "shardopt_gather_unit("},
  {"release(", "shardopt_release_unit(", "shardopt_release_unit("},
  {"size()", "shardopt_comm_size()", "shardopt_comm_size()"},
});
// clang-format on

bool identifier_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '_';
}

// Whether row's C++ spelling stands at text[at] on its own.
bool stands_at(std::string_view text, std::size_t at, std::string_view cpp) {
  if (text.compare(at, cpp.size(), cpp) != 0) return false;
  if (at > 0 && (identifier_char(text[at - 1]) || text[at - 1] == ':')) return false;
  const std::size_t end = at + cpp.size();
  return !identifier_char(cpp.back()) || end == text.size() || !identifier_char(text[end]);
}

}  // namespace

std::string in_callers_words(std::string text, shardopt_language_t language) {
  if (text.empty()) return text;
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  std::size_t at = 0;
  while (at < text.size()) {
    const Spelling* row = nullptr;
    for (const Spelling& s : kSpellings)
      if (stands_at(text, at, s.cpp)) {
        row = &s;
        break;
      }
    if (row) {
      out += language == SHARDOPT_LANGUAGE_FORTRAN ? row->fortran : row->c;
      at += row->cpp.size();
    } else {
      out += text[at++];
    }
  }
  return out;
}

}  // namespace shardopt::capi
