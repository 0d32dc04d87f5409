// shardopt: the C API's ZeRO optimizer (shardopt.h).
#include <cmath>
#include <string>
#include <vector>

#include "capi.hpp"
#include "common/check.hpp"
#include "common/language.hpp"
#include "hparams.hpp"
#include "shardopt/agree.hpp"

using namespace shardopt;
using namespace shardopt::capi;

namespace {

ZeroOptions zero_options(const shardopt_zero_options_t* o) {
  ZeroOptions z;
  if (!o) return z;
  z.stage = o->stage;
  z.bucket_mb = o->bucket_mb;
  if (o->reduce_sum != 0 && o->reduce_sum != 1)
    SHARDOPT_THROW(invalid_argument, "options->reduce_sum is " + std::to_string(o->reduce_sum),
                   "use 0 (average the gradients over ranks) or 1 (sum them)");
  z.reduction = o->reduce_sum ? GradReduction::sum : GradReduction::avg;
  z.predivide_factor = o->predivide_factor;
  z.reduce_in_fp32 = o->reduce_in_fp32 != 0;
  z.param_remainders = o->param_remainders != 0;
  z.stream_grads = o->stream_grads != 0;
  z.check_sync_every = o->check_sync_every;
  if (o->non_finite < 0 || o->non_finite > 3)
    SHARDOPT_THROW(invalid_argument, "options->non_finite is " + std::to_string(o->non_finite),
                   "use 0 (automatic), 1 (skip), 2 (error) or 3 (ignore)");
  z.non_finite = static_cast<NonFinite>(o->non_finite);
  z.stream = o->stream;
  if (o->loss_scaler != 0 && o->loss_scaler != 1)
    SHARDOPT_THROW(invalid_argument, "options->loss_scaler is " + std::to_string(o->loss_scaler),
                   "use 1 (dynamic loss scaling) or 0 (none)");
  if (o->loss_scaler)
    z.loss_scaler = LossScaler{o->init_scale,      o->growth_factor, o->backoff_factor,
                               o->growth_interval, o->hysteresis,    o->min_scale};
  z.gather_limit_bytes = o->gather_limit_bytes;
  for (const auto& [value, name] : {std::pair{o->prefetch, "prefetch"},
                                    std::pair{o->reshard_after_forward, "reshard_after_forward"}})
    if (value != 0 && value != 1)
      SHARDOPT_THROW(invalid_argument,
                     std::string("options->") + name + " is " + std::to_string(value),
                     "use 1 (on) or 0 (off)");
  z.prefetch = o->prefetch != 0;
  z.reshard_after_forward = o->reshard_after_forward != 0;
  z.persist_below_bytes = o->persist_below_bytes;
  return z;
}

void check_index(OptimizerObject& o, std::size_t index) {
  check_count(index, "index");
  if (index >= o.opt->num_params())
    SHARDOPT_THROW(invalid_argument,
                   "index " + detail::index_text(static_cast<long long>(index)) +
                       " is not a parameter: there are " + std::to_string(o.opt->num_params()),
                   "pass an index from " + detail::index_text(0) + " to " +
                       detail::index_text(static_cast<long long>(o.opt->num_params()) - 1) +
                       " (registration order)");
}

void check_group(OptimizerObject& o, int group, bool all_allowed) {
  if ((all_allowed && group == -1) || (group >= 0 && group < o.opt->num_groups())) return;
  SHARDOPT_THROW(invalid_argument,
                 "group " + detail::index_text(group) + " is not a parameter group: there are " +
                     std::to_string(o.opt->num_groups()),
                 "pass a group from " + detail::index_text(0) + " to " +
                     detail::index_text(o.opt->num_groups() - 1) +
                     (all_allowed ? ", or -1 for every group" : ""));
}

}  // namespace

extern "C" {

SHARDOPT_API shardopt_status_t shardopt_zero_options_init(shardopt_zero_options_t* options) {
  return guard("shardopt_zero_options_init", [&] {
    check_out(options, "options");
    const ZeroOptions z;
    const LossScaler s;
    *options = shardopt_zero_options_t{};
    options->stage = z.stage;
    options->bucket_mb = z.bucket_mb;
    options->reduce_sum = 0;
    options->predivide_factor = z.predivide_factor;
    options->check_sync_every = z.check_sync_every;
    options->non_finite = static_cast<int>(z.non_finite);
    options->loss_scaler = 0;
    options->init_scale = s.init_scale;
    options->growth_factor = s.growth_factor;
    options->backoff_factor = s.backoff_factor;
    options->growth_interval = s.growth_interval;
    options->hysteresis = s.hysteresis;
    options->min_scale = s.min_scale;
    options->gather_limit_bytes = z.gather_limit_bytes;
    options->prefetch = z.prefetch ? 1 : 0;
    options->reshard_after_forward = z.reshard_after_forward ? 1 : 0;
    options->persist_below_bytes = z.persist_below_bytes;
  });
}

SHARDOPT_API shardopt_status_t shardopt_optimizer_create(shardopt_comm_t comm,
                                                         const shardopt_param_t* params,
                                                         size_t num_params,
                                                         const char* const* groups, int num_groups,
                                                         const shardopt_zero_options_t* options,
                                                         shardopt_optimizer_t* out) {
  return guard("shardopt_optimizer_create", [&] {
    check_out(out, "out");
    *out = nullptr;
    CommObject& c = comm_of(comm);
    // The arguments are converted on each rank alone; a mistake on some
    // ranks only is agreed on before the constructor's collectives, so that
    // every rank returns the error instead of the others waiting for ever.
    std::vector<Param> ps;
    std::vector<OptimizerConfig> configs;
    ZeroOptions zero;
    std::string local_error, hint;
    ErrorCode code = ErrorCode::invalid_argument;
    try {
      check_count(num_params, "num_params");
      if (!params && num_params > 0)
        SHARDOPT_THROW(invalid_argument,
                       "params is NULL with num_params " + std::to_string(num_params),
                       "pass an array of num_params shardopt_param_t");
      if (num_groups < 1 || !groups)
        SHARDOPT_THROW(
            invalid_argument,
            "num_groups is " + std::to_string(num_groups) + (groups ? "" : " and groups is NULL"),
            "pass at least one optimizer spec, e.g. \"adamw lr=1e-3\"");
      ps.reserve(num_params);
      for (std::size_t i = 0; i < num_params; ++i) {
        const shardopt_param_t& p = params[i];
        const std::string where = element_name("params", i);
        Param q;
        q.name = string_of(p.name, (where + ".name").c_str());
        q.data = p.data;
        check_count(p.count, (where + ".count").c_str());
        q.numel = p.count;
        q.dtype = dtype_of_code(p.dtype, (where + ".dtype").c_str());
        q.grad = p.grad;
        q.group = p.group;
        if (p.unit < 0)
          SHARDOPT_THROW(invalid_argument, where + ".unit is " + std::to_string(p.unit),
                         "number the units from 1 (0: the parameter is a unit of its own)");
        q.unit = p.unit - 1;
        if (p.ndim < 0 || (p.ndim > 0 && !p.shape))
          SHARDOPT_THROW(
              invalid_argument,
              where + ".ndim is " + std::to_string(p.ndim) + (p.shape ? "" : " with a NULL shape"),
              "pass ndim sizes in shape, or ndim 0 (one dimension of count)");
        q.shape.assign(p.shape, p.shape + p.ndim);
        ps.push_back(std::move(q));
      }
      for (int g = 0; g < num_groups; ++g) {
        const std::string where = element_name("groups", static_cast<std::size_t>(g));
        try {
          configs.push_back(parse_spec(string_of(groups[g], where.c_str())));
        } catch (const Error& e) {
          detail::throw_error(e.code(), where + ": " + e.message(), e.hint(), e.file(), e.line());
        }
      }
      zero = zero_options(options);
    } catch (const Error& e) {
      local_error = e.message();
      code = e.code();
      hint = e.hint();
    }
    agree_or_throw(c.comm, local_error, code, hint);
    auto object = std::make_shared<OptimizerObject>();
    object->opt =
        std::make_unique<ZeroRedundancyOptimizer>(c.comm, std::move(ps), std::move(configs), zero);
    object->comm = &c;
    *out = reinterpret_cast<shardopt_optimizer_t>(add_handle(Kind::optimizer, std::move(object)));
    ++c.optimizers;
  });
}

SHARDOPT_API shardopt_status_t shardopt_optimizer_destroy(shardopt_optimizer_t* opt) {
  return guard("shardopt_optimizer_destroy", [&] {
    check_out(opt, "opt");
    if (!*opt) return;
    OptimizerObject& o = optimizer_of(*opt, "*opt");
    --o.comm->optimizers;
    remove_handle(reinterpret_cast<std::uintptr_t>(*opt));
    *opt = nullptr;
  });
}

SHARDOPT_API shardopt_status_t shardopt_zero_grad(shardopt_optimizer_t opt) {
  return guard("shardopt_zero_grad", [&] { optimizer_of(opt).opt->zero_grad(); });
}

SHARDOPT_API shardopt_status_t shardopt_grad_ready(shardopt_optimizer_t opt, size_t index,
                                                   const void* grad) {
  return guard("shardopt_grad_ready", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_index(o, index);
    if (grad)
      o.opt->grad_ready(index, grad);
    else
      o.opt->grad_ready(index);
  });
}

SHARDOPT_API shardopt_status_t shardopt_grad_ready_on(shardopt_optimizer_t opt, void* stream,
                                                      size_t index, const void* grad) {
  return guard("shardopt_grad_ready_on", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_index(o, index);
    o.opt->grad_ready_on(stream, index, grad);
  });
}

SHARDOPT_API shardopt_status_t shardopt_reduce_gradients(shardopt_optimizer_t opt) {
  return guard("shardopt_reduce_gradients", [&] { optimizer_of(opt).opt->reduce_gradients(); });
}

SHARDOPT_API shardopt_status_t shardopt_clip_grad_norm(shardopt_optimizer_t opt, double max_norm,
                                                       double* norm) {
  return guard("shardopt_clip_grad_norm", [&] {
    const double n = optimizer_of(opt).opt->clip_grad_norm(max_norm);
    if (norm) *norm = n;
  });
}

SHARDOPT_API shardopt_status_t shardopt_step(shardopt_optimizer_t opt, shardopt_step_info_t* info) {
  return guard("shardopt_step", [&] {
    const StepInfo s = optimizer_of(opt).opt->step();
    if (!info) return;
    info->applied = s.applied;
    info->grads_finite = s.grads_finite;
    info->pending = s.pending;
    info->grad_norm = s.grad_norm;
    info->loss_scale = s.loss_scale;
    info->step = s.step;
    info->reduce_seconds = s.reduce_seconds;
    info->update_seconds = s.update_seconds;
    info->gather_seconds = s.gather_seconds;
    info->reduce_bytes = s.reduce_bytes;
    info->gather_bytes = s.gather_bytes;
    info->reduce_span_seconds = s.reduce_span_seconds;
    info->exposed_comm_seconds = s.exposed_comm_seconds;
    info->reduce_busbw_gbps = s.reduce_busbw_gbps;
    info->gather_busbw_gbps = s.gather_busbw_gbps;
    info->gathers = s.gathers;
    info->gathers_ahead = s.gathers_ahead;
  });
}

SHARDOPT_API shardopt_status_t shardopt_loss_scale(shardopt_optimizer_t opt, double* scale) {
  return guard("shardopt_loss_scale", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_out(scale, "scale");
    *scale = o.opt->loss_scale();
  });
}

SHARDOPT_API shardopt_status_t shardopt_steps(shardopt_optimizer_t opt, int64_t* steps,
                                              int64_t* skipped) {
  return guard("shardopt_steps", [&] {
    OptimizerObject& o = optimizer_of(opt);
    if (!steps && !skipped) check_out(steps, "steps and skipped");
    if (steps) *steps = o.opt->steps();
    if (skipped) *skipped = o.opt->skipped_steps();
  });
}

SHARDOPT_API shardopt_status_t shardopt_num_params(shardopt_optimizer_t opt, size_t* count) {
  return guard("shardopt_num_params", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_out(count, "count");
    *count = o.opt->num_params();
  });
}

SHARDOPT_API shardopt_status_t shardopt_num_units(shardopt_optimizer_t opt, size_t* count) {
  return guard("shardopt_num_units", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_out(count, "count");
    *count = o.opt->num_units();
  });
}

// The unit's range and the ranks' agreement are the engine's (collective).
SHARDOPT_API shardopt_status_t shardopt_gather_unit(shardopt_optimizer_t opt, size_t unit) {
  return guard("shardopt_gather_unit", [&] { optimizer_of(opt).opt->gather(unit); });
}

SHARDOPT_API shardopt_status_t shardopt_igather_unit(shardopt_optimizer_t opt, size_t unit) {
  return guard("shardopt_igather_unit", [&] { optimizer_of(opt).opt->igather(unit); });
}

SHARDOPT_API shardopt_status_t shardopt_release_unit(shardopt_optimizer_t opt, size_t unit) {
  return guard("shardopt_release_unit", [&] { optimizer_of(opt).opt->release(unit); });
}

SHARDOPT_API shardopt_status_t shardopt_param_data(shardopt_optimizer_t opt, size_t index,
                                                   const void** data) {
  return guard("shardopt_param_data", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_index(o, index);
    check_out(data, "data");
    *data = o.opt->data(index);
  });
}

SHARDOPT_API shardopt_status_t shardopt_param_info(shardopt_optimizer_t opt, size_t index,
                                                   size_t* count, shardopt_dtype_t* dtype) {
  return guard("shardopt_param_info", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_index(o, index);
    if (!count && !dtype) check_out(count, "count and dtype");
    const Param& p = o.opt->param(index);
    if (count) *count = p.numel;
    if (dtype) *dtype = static_cast<shardopt_dtype_t>(static_cast<int>(p.dtype));
  });
}

SHARDOPT_API shardopt_status_t shardopt_param_grad(shardopt_optimizer_t opt, size_t index,
                                                   void** grad) {
  return guard("shardopt_param_grad", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_index(o, index);
    check_out(grad, "grad");
    *grad = o.opt->grad(index);
  });
}

SHARDOPT_API shardopt_status_t shardopt_set_lr(shardopt_optimizer_t opt, double lr, int group) {
  return guard("shardopt_set_lr", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_group(o, group, true);
    if (!(lr >= 0.0) || !std::isfinite(lr))
      SHARDOPT_THROW(invalid_argument, "invalid learning rate: " + std::to_string(lr),
                     "pass a finite lr >= 0, as torch.optim requires");
    o.opt->set_lr(lr, group);
  });
}

SHARDOPT_API shardopt_status_t shardopt_set_hparams(shardopt_optimizer_t opt, int group,
                                                    const char* pairs) {
  return guard("shardopt_set_hparams", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_group(o, group, true);
    const std::string text = string_of(pairs, "pairs");
    // Every group checked before any changes.
    const int first = group == -1 ? 0 : group;
    const int last = group == -1 ? o.opt->num_groups() - 1 : group;
    std::vector<OptimizerConfig> updated;
    for (int g = first; g <= last; ++g) {
      OptimizerConfig c = o.opt->param_group(g);
      apply_pairs(c, text);
      updated.push_back(std::move(c));
    }
    for (int g = first; g <= last; ++g) o.opt->param_group(g) = std::move(updated[g - first]);
  });
}

SHARDOPT_API shardopt_status_t shardopt_get_hparam(shardopt_optimizer_t opt, int group,
                                                   const char* name, double* value) {
  return guard("shardopt_get_hparam", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_group(o, group, false);
    const std::string n = string_of(name, "name");
    check_out(value, "value");
    *value = field_value(o.opt->param_group(group), n);
  });
}

SHARDOPT_API shardopt_status_t shardopt_memory_report(shardopt_optimizer_t opt,
                                                      shardopt_memory_report_t* report) {
  return guard("shardopt_memory_report", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_out(report, "report");
    const MemoryReport m = o.opt->memory_report();
    *report = shardopt_memory_report_t{
        m.master_params, m.optimizer_state, m.grad_shard,  m.reduced_grads, m.owned_grads,
        m.buckets,       m.user_params,     m.user_grads,  m.device_bytes,  m.host_bytes,
        m.allocated(),   m.node_shared,     m.param_shard, m.gather_pool,   m.persistent_params};
  });
}

SHARDOPT_API shardopt_status_t shardopt_gather_state(shardopt_optimizer_t opt, const char* name,
                                                     size_t index, float* out, size_t count) {
  return guard("shardopt_gather_state", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_index(o, index);
    const std::string n = string_of(name, "name");
    check_count(count, "count");
    // Collective: every rank gathers before its own arguments are checked,
    // so that a local mistake does not leave the other ranks waiting.
    const std::vector<float> v = o.opt->gather_state(n, index);
    const std::size_t numel = o.opt->param(index).numel;
    if (count != numel)
      SHARDOPT_THROW(invalid_argument,
                     "count " + std::to_string(count) + " differs from parameter " +
                         detail::index_text(static_cast<long long>(index)) + " ('" +
                         o.opt->param(index).name + "'), which has " + std::to_string(numel) +
                         " elements",
                     "pass a buffer of the parameter's element count");
    if (!out && count > 0) check_out(out, "out");
    std::copy(v.begin(), v.end(), out);
  });
}

SHARDOPT_API shardopt_status_t shardopt_check_sync(shardopt_optimizer_t opt, int* in_sync,
                                                   char* message, size_t message_size) {
  return guard("shardopt_check_sync", [&] {
    OptimizerObject& o = optimizer_of(opt);
    check_out(in_sync, "in_sync");
    const SyncReport r = o.opt->check_sync();
    *in_sync = r.in_sync ? 1 : 0;
    if (message && message_size > 0) {
      const std::string& m = r.message;
      const std::size_t n = std::min(m.size(), message_size - 1);
      std::copy(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(n), message);
      message[n] = '\0';
    }
  });
}

SHARDOPT_API shardopt_status_t shardopt_save(shardopt_optimizer_t opt, const char* path,
                                             int keep_last, const char* const* metadata_keys,
                                             const char* const* metadata_values,
                                             size_t num_metadata) {
  return guard("shardopt_save", [&] {
    OptimizerObject& o = optimizer_of(opt);
    SaveOptions s;
    const std::string p = string_of(path, "path");
    if (keep_last < 1)
      SHARDOPT_THROW(invalid_argument, "keep_last is " + std::to_string(keep_last),
                     "pass 1 to replace the file, or N > 1 to keep N checkpoints");
    s.keep_last = keep_last;
    check_count(num_metadata, "num_metadata");
    if (num_metadata > 0 && (!metadata_keys || !metadata_values))
      SHARDOPT_THROW(invalid_argument, "metadata_keys or metadata_values is NULL",
                     "pass num_metadata keys and values, or num_metadata 0");
    for (std::size_t i = 0; i < num_metadata; ++i)
      s.metadata[string_of(metadata_keys[i], "metadata_keys[i]")] =
          string_of(metadata_values[i], "metadata_values[i]");
    o.opt->save(p, s);
  });
}

SHARDOPT_API shardopt_status_t shardopt_load(shardopt_optimizer_t opt, const char* path, int strict,
                                             int hyper_parameters, shardopt_load_report_t* report) {
  return guard("shardopt_load", [&] {
    OptimizerObject& o = optimizer_of(opt);
    const std::string p = string_of(path, "path");
    const LoadReport r = o.opt->load(p, LoadOptions{strict != 0, hyper_parameters != 0});
    o.loaded_metadata = r.metadata;
    if (!report) return;
    *report = shardopt_load_report_t{
        r.step,           r.saved_ranks,       r.hyper_parameters ? 1 : 0, r.loaded.size(),
        r.missing.size(), r.unexpected.size(), r.mismatched.size()};
  });
}

SHARDOPT_API shardopt_status_t shardopt_load_metadata(shardopt_optimizer_t opt, const char* key,
                                                      char* value, size_t value_size) {
  return guard("shardopt_load_metadata", [&] {
    OptimizerObject& o = optimizer_of(opt);
    const std::string k = string_of(key, "key");
    check_out(value, "value");
    const auto it = o.loaded_metadata.find(k);
    if (it == o.loaded_metadata.end())
      SHARDOPT_THROW(invalid_argument, "the last checkpoint loaded has no metadata key '" + k + "'",
                     "load a checkpoint saved with that key first (shardopt_save's metadata)");
    copy_out(it->second, value, value_size, "value");
  });
}

SHARDOPT_API shardopt_status_t shardopt_export(shardopt_optimizer_t opt, const char* path,
                                               int fp32) {
  return guard("shardopt_export", [&] {
    OptimizerObject& o = optimizer_of(opt);
    o.opt->export_params(string_of(path, "path"), ExportOptions{fp32 != 0});
  });
}

}  // extern "C"
