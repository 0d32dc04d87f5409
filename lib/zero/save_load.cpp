// shardopt: checkpoints of the ZeRO engine (save, load, export_params).
//
// A checkpoint holds every tensor in its canonical, unsharded layout, so the
// shards of the saving run are invisible in it: each segment (one
// parameter's part of one rank's piece of one bucket) is one contiguous run
// of each of its tensors. Saving, every rank writes its segments; loading,
// at any rank count, every rank reads the segments of its own new layout.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ckpt/format.hpp"
#include "comm/agree.hpp"
#include "common/check.hpp"
#include "shardopt/cast.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/version.hpp"
#include "zero/engine.hpp"

namespace shardopt::detail {
namespace {

using json = nlohmann::ordered_json;

constexpr const char* kScalerTensor = "shardopt.loss_scaler";

std::string hex64(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::vector<std::uint64_t> shape_of(const Param& p) {
  if (p.shape.empty()) return {p.numel};
  return {p.shape.begin(), p.shape.end()};
}

std::string shape_text(const std::vector<std::uint64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// What must match for a checkpoint to load, independent of the rank count,
// the stage and the bucket size.
std::string layout_fingerprint(const std::vector<Param>& params, DType dtype, const char* kind) {
  std::ostringstream s;
  s << "kind=" << kind << "\ndtype=" << dtype_name(dtype) << "\n";
  for (const Param& p : params)
    s << p.name << " " << p.numel << " " << shape_text(shape_of(p)) << " " << p.group << "\n";
  const std::string t = s.str();
  return hex64(ckpt::checksum(t.data(), t.size()));
}

std::string list(const std::vector<std::string>& v, std::size_t max = 8) {
  std::string t;
  for (std::size_t i = 0; i < v.size() && i < max; ++i) t += (i ? ", " : "") + v[i];
  if (v.size() > max) t += ", ... (" + std::to_string(v.size() - max) + " more)";
  return t;
}

const std::string& meta(const ckpt::Header& h, const std::string& path, const char* key) {
  const auto it = h.metadata.find(key);
  if (it == h.metadata.end())
    SHARDOPT_THROW(checkpoint,
                   "'" + path + "' has no '" + key +
                       "' in its metadata: it is not a complete "
                       "shardopt checkpoint",
                   "load a file written by ZeroRedundancyOptimizer::save()");
  return it->second;
}

std::int64_t meta_int(const ckpt::Header& h, const std::string& path, const char* key) {
  const std::string& v = meta(h, path, key);
  std::size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty())
    SHARDOPT_THROW(checkpoint,
                   "'" + path + "': metadata '" + key + "' is '" + v + "', not an integer",
                   "the header is corrupted; load another checkpoint");
  return x;
}

json meta_json(const ckpt::Header& h, const std::string& path, const char* key) {
  try {
    return json::parse(meta(h, path, key));
  } catch (const json::exception& e) {
    SHARDOPT_THROW(checkpoint,
                   "'" + path + "': metadata '" + key + "' is not valid JSON (" + e.what() + ")",
                   "the header is corrupted; load another checkpoint");
  }
}

// The value of "shardopt.grad_reduction".
const char* reduction_key(GradReduction r) { return r == GradReduction::sum ? "sum" : "avg"; }

}  // namespace

std::map<std::string, std::string> ZeroEngine::checkpoint_metadata(const char* content) const {
  std::map<std::string, std::string> m;
  m["format"] = "pt";
  m[ckpt::detail::kKeyFormatVersion] = std::to_string(ckpt::kFormatVersion);
  m[ckpt::detail::kKeyVersion] = SHARDOPT_VERSION_STRING;
  m["shardopt.content"] = content;
  m["shardopt.dtype"] = dtype_name(dtype_);
  m["shardopt.step"] = std::to_string(steps_);
  return m;
}

// The pieces of tensor `first + p` for each parameter p, from every rank's
// segments: `bytes` bytes an element, this rank's data from `data(s)`.
void ZeroEngine::add_pieces(std::size_t first, std::size_t bytes,
                            const std::function<const void*(const Segment&)>& data,
                            std::vector<ckpt::Piece>& pieces) const {
  for (const Segment& s : layout_.segments) {
    if (s.count == 0) continue;
    pieces.push_back({first + s.param, s.offset * bytes, s.count * bytes, s.rank,
                      s.rank == rank_ ? data(s) : nullptr});
  }
}

// This rank's fp32 master values of segment s: the master buffer, the fp32
// parameters, or (remainders) decoded into `decoded`.
std::function<const void*(const Segment&)> ZeroEngine::master_source(
    std::vector<float>& decoded, std::deque<std::vector<std::byte>>& store) const {
  if (remainders_) {
    std::size_t n = 0;
    for (const Segment& s : layout_.segments)
      if (s.rank == rank_) n += s.count;
    decoded.resize(n);
    std::size_t at = 0;
    for (const Segment& s : layout_.segments) {
      if (s.rank != rank_) continue;
      shard().read_master(s, decoded.data() + at);
      at += s.count;
    }
  }
  // Segments are visited in the same order by add_pieces.
  auto cursor = std::make_shared<std::size_t>(0);
  if (remainders_)
    return [&decoded, cursor](const Segment& s) -> const void* {
      const float* p = decoded.data() + *cursor;
      *cursor += s.count;
      return p;
    };
  return on_host(
      [this](const Segment& s) -> const void* {
        if (master_) return shard().master_buffer().as<float>() + s.storage;
        return shard().user_param(s);
      },
      4, store);
}

ZeroEngine::Source ZeroEngine::on_host(Source source, std::size_t bytes,
                                       std::deque<std::vector<std::byte>>& store) const {
  if (!space_.on_device()) return source;
  return [this, source = std::move(source), bytes, &store](const Segment& s) -> const void* {
    store.emplace_back(s.count * bytes);
    space_.download(store.back().data(), source(s), s.count * bytes);
    return store.back().data();
  };
}

void ZeroEngine::save(const std::string& path, const SaveOptions& o) {
  require_comm("save()");
  settle();
  const std::size_t np = params_.size();
  std::vector<ckpt::WriteTensor> tensors;
  std::set<std::string> names;
  std::string error;
  const auto add = [&](std::string name, const char* dtype, std::vector<std::uint64_t> shape) {
    if (!names.insert(name).second && error.empty())
      error = "two tensors of the checkpoint would be named '" + name +
              "' (a parameter's name equals another's name plus '.<state>')";
    tensors.push_back({std::move(name), dtype, std::move(shape)});
  };
  for (const Param& p : params_) add(p.name, "F32", shape_of(p));
  for (const std::string& slot : shard().slots())
    for (const Param& p : params_) add(p.name + "." + slot, "F32", shape_of(p));
  if (opt_.loss_scaler) add(kScalerTensor, "F64", {3});
  if (!error.empty())
    throw_error(ErrorCode::invalid_argument, "save('" + path + "'): " + error,
                "rename the parameter so that no tensor name repeats", __FILE__, __LINE__);

  std::vector<ckpt::Piece> pieces;
  std::vector<float> decoded;
  std::deque<std::vector<std::byte>> store;  // device data staged in host memory
  add_pieces(0, 4, master_source(decoded, store), pieces);
  for (std::size_t k = 0; k < shard().slots().size(); ++k)
    add_pieces((k + 1) * np, 4,
               on_host([&, k](const Segment& s)
                           -> const void* { return shard().state(k).as<float>() + s.storage; },
                       4, store),
               pieces);
  const double scaler[3] = {scale_, static_cast<double>(good_steps_),
                            static_cast<double>(hysteresis_left_)};
  if (opt_.loss_scaler)
    pieces.push_back({tensors.size() - 1, 0, sizeof scaler, 0, rank_ == 0 ? scaler : nullptr});

  auto m = checkpoint_metadata("checkpoint");
  m["shardopt.optimizer"] = kind_key(groups_[0]);
  json groups = json::array();
  for (const OptimizerConfig& g : groups_) groups.push_back(hypers_json(g));
  m["shardopt.groups"] = groups.dump();
  json plist = json::array();
  for (const Param& p : params_)
    plist.push_back({{"name", p.name}, {"group", p.group}, {"numel", p.numel}});
  m["shardopt.params"] = plist.dump();
  m["shardopt.states"] = json(shard().slots()).dump();
  m["shardopt.stage"] = std::to_string(opt_.stage);
  m["shardopt.ranks"] = std::to_string(nranks_);
  m["shardopt.param_remainders"] = remainders_ ? "true" : "false";
  m["shardopt.grad_reduction"] = reduction_key(opt_.reduction);
  m["shardopt.layout_fingerprint"] = layout_fingerprint(params_, dtype_, kind_key(groups_[0]));
  for (const auto& [k, v] : o.metadata) m["user." + k] = v;
  ckpt::WriteOptions w;
  w.chunk_bytes = o.chunk_bytes;
  w.keep_last = o.keep_last;
  ckpt::write_file(ctl_, path, tensors, pieces, m, w);
}

void ZeroEngine::export_params(const std::string& path, const ExportOptions& o) {
  require_comm("export_params()");
  settle();
  const bool fp32 = o.fp32 || dtype_ == DType::f32;
  std::vector<ckpt::WriteTensor> tensors;
  for (const Param& p : params_)
    tensors.push_back({p.name, fp32 ? "F32" : ckpt::dtype_name(dtype_), shape_of(p)});
  std::vector<ckpt::Piece> pieces;
  std::vector<float> decoded;
  std::deque<std::vector<std::byte>> store;
  if (fp32)
    add_pieces(0, 4, master_source(decoded, store), pieces);
  else
    add_pieces(0, elem_,
               on_host([this](const Segment& s) -> const void* { return shard().user_param(s); },
                       elem_, store),
               pieces);
  auto m = checkpoint_metadata("export");
  ckpt::write_file(ctl_, path, tensors, pieces, m, {});
}

namespace {

// A tensor this optimizer has, and the file's tensor of that name when its
// dtype and shape match.
struct Want {
  std::string name;
  std::size_t slot;  // 0 master, k state k-1, npos the loss scaler
  std::size_t param;
  const ckpt::TensorInfo* have = nullptr;
};

[[noreturn]] void fail_load(const std::string& path, const std::string& what, const char* hint) {
  throw_error(ErrorCode::checkpoint, "cannot load '" + path + "': " + what, hint, __FILE__,
              __LINE__);
}

// Checks that h is a shardopt checkpoint; the report's step, ranks and user
// metadata.
LoadReport read_report(const ckpt::Header& h, const std::string& path) {
  if (h.format_version == 0)
    fail_load(path,
              "it has no shardopt metadata (a plain safetensors file, not a shardopt checkpoint)",
              "load a file written by ZeroRedundancyOptimizer::save()");
  const std::string& content = meta(h, path, "shardopt.content");
  if (content != "checkpoint")
    fail_load(path,
              "it is a shardopt " + content + ", not a checkpoint (it holds " +
                  (content == "export" ? "the parameters only" : "something else") + ")",
              "load a file written by save(); an export is read by inference codes directly");
  LoadReport report;
  report.step = meta_int(h, path, "shardopt.step");
  report.saved_ranks = static_cast<int>(meta_int(h, path, "shardopt.ranks"));
  for (const auto& [k, v] : h.metadata)
    if (k.rfind("user.", 0) == 0) report.metadata[k.substr(5)] = v;
  return report;
}

// A checkpoint's moments and step count belong to gradients reduced one
// way: averaged gradients are 1/N of summed ones at N ranks, so the state
// of one does not fit a run of the other (the update's scale, Adam's
// epsilon against the second moment). A file without the key (written
// before it existed) is taken as it is.
void check_reduction(const ckpt::Header& h, const std::string& path, GradReduction here) {
  const auto it = h.metadata.find("shardopt.grad_reduction");
  if (it == h.metadata.end()) return;
  const std::string& saved = it->second;
  if (saved != "avg" && saved != "sum")
    fail_load(path, "metadata 'shardopt.grad_reduction' is '" + saved + "', not 'avg' or 'sum'",
              "the header is corrupted; load another checkpoint");
  if (saved == reduction_key(here)) return;
  const bool summed = saved == "sum";
  fail_load(path,
            std::string("the run that saved it ") +
                (summed ? "summed its gradients over the ranks (GradReduction::sum)"
                        : "averaged its gradients over the ranks (GradReduction::avg)") +
                ", this optimizer " +
                (summed ? "averages them (GradReduction::avg)" : "sums them (GradReduction::sum)"),
            summed
                ? "construct the optimizer with ZeroOptions::reduction = GradReduction::sum, as "
                  "the run that saved it"
                : "construct the optimizer with ZeroOptions::reduction = GradReduction::avg (the "
                  "default), as the run that saved it");
}

// The tensors of an optimizer with these parameters and state slots
// (and the loss scaler's), matched against h's; the report's loaded,
// missing, unexpected and mismatched lists, and the problems they make.
std::vector<Want> match_tensors(const ckpt::Header& h, const std::vector<Param>& params,
                                const std::vector<std::string>& slots, bool scaler,
                                LoadReport& report, std::vector<std::string>& problems) {
  std::vector<Want> want;
  for (std::size_t k = 0; k <= slots.size(); ++k)
    for (std::size_t i = 0; i < params.size(); ++i)
      want.push_back({k == 0 ? params[i].name : params[i].name + "." + slots[k - 1], k, i});
  if (scaler) want.push_back({kScalerTensor, std::string::npos, 0});
  std::set<std::string> wanted;
  for (Want& w : want) {
    wanted.insert(w.name);
    const ckpt::TensorInfo* t = h.find(w.name);
    if (t == nullptr) {
      report.missing.push_back(w.name);
      continue;
    }
    const bool is_scaler = w.slot == std::string::npos;
    const std::vector<std::uint64_t> shape =
        is_scaler ? std::vector<std::uint64_t>{3} : shape_of(params[w.param]);
    const std::string dtype = is_scaler ? "F64" : "F32";
    if (t->dtype != dtype || t->shape != shape) {
      report.mismatched.push_back(w.name + ": " + t->dtype + " " + shape_text(t->shape) +
                                  " in the file, " + dtype + " " + shape_text(shape) + " here");
      continue;
    }
    w.have = t;
    report.loaded.push_back(w.name);
  }
  for (const ckpt::TensorInfo& t : h.tensors)
    if (!wanted.count(t.name)) report.unexpected.push_back(t.name);
  if (!report.missing.empty())
    problems.push_back(
        std::to_string(report.missing.size()) +
        " tensor(s) of this optimizer missing from the file: " + list(report.missing));
  if (!report.unexpected.empty())
    problems.push_back(
        std::to_string(report.unexpected.size()) +
        " tensor(s) of the file this optimizer does not have: " + list(report.unexpected));
  if (!report.mismatched.empty())
    problems.push_back(std::to_string(report.mismatched.size()) +
                       " tensor(s) of another dtype or shape: " + list(report.mismatched, 4));
  return want;
}

}  // namespace

LoadReport ZeroEngine::load(const std::string& path, const LoadOptions& o) {
  require_comm("load()");
  settle();
  check_released("load()");  // stage 3: a gathered unit would keep the old values
  if (!all_equal(ctl_, {o.strict ? 1 : 0, o.hyper_parameters ? 1 : 0}))
    agree_or_throw(ctl_, "LoadOptions differ between ranks", ErrorCode::invalid_argument,
                   "pass the same LoadOptions on every rank");
  ckpt::Reader reader(ctl_, path);
  const ckpt::Header& h = reader.header();
  // From here on every decision depends on the header and the agreed
  // layout only, so every rank takes it alike without communicating.
  LoadReport report = read_report(h, path);
  check_reduction(h, path, opt_.reduction);
  const std::string kind = meta(h, path, "shardopt.optimizer");
  const json groups = meta_json(h, path, "shardopt.groups");
  std::vector<std::string> problems;
  if (kind != kind_key(groups_[0]))
    problems.push_back("it was saved by optimizer '" + kind + "', this one is '" +
                       kind_key(groups_[0]) + "'");
  if (!groups.is_array() || groups.size() != groups_.size())
    problems.push_back("it has " + std::to_string(groups.is_array() ? groups.size() : 0) +
                       " parameter group(s), this optimizer " + std::to_string(groups_.size()));
  const std::vector<std::string>& slots = shard().slots();
  const std::vector<Want> want =
      match_tensors(h, params_, slots, opt_.loss_scaler.has_value(), report, problems);
  if (o.strict && !problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += "\n  " + p;
    fail_load(path, "it does not match this optimizer:" + all,
              "register the same parameters (names, shapes, dtype) and optimizer as the run that "
              "saved it, or load with LoadOptions::strict = false to take the tensors that match");
  }
  const bool restore_groups = o.hyper_parameters && kind == kind_key(groups_[0]) &&
                              groups.is_array() && groups.size() == groups_.size();
  std::vector<OptimizerConfig> new_groups = groups_;
  if (restore_groups) {
    try {
      for (std::size_t g = 0; g < groups_.size(); ++g) apply_hypers_json(new_groups[g], groups[g]);
    } catch (const json::exception& e) {
      fail_load(path, std::string("its group hyper-parameters are malformed (") + e.what() + ")",
                "the header is corrupted; load another checkpoint");
    }
  }

  // Read this rank's segments of every tensor to load into staging buffers
  // laid out like the state (huge pages, touched once), verified, before
  // anything changes: staging[k] for slot k (0 the master), and which
  // parameters each slot loads.
  std::vector<HostBuffer> staging(slots.size() + 1);
  std::vector<std::vector<char>> loaded(slots.size() + 1, std::vector<char>(params_.size(), 0));
  std::vector<const ckpt::TensorInfo*> tensor_of((slots.size() + 1) * params_.size(), nullptr);
  const ckpt::TensorInfo* scaler_tensor = nullptr;
  for (const Want& w : want) {
    if (w.have == nullptr) continue;
    if (w.slot == std::string::npos) {
      scaler_tensor = w.have;
      continue;
    }
    if (staging[w.slot].data() == nullptr) staging[w.slot] = HostBuffer(layout_.storage * 4);
    loaded[w.slot][w.param] = 1;
    tensor_of[w.slot * params_.size() + w.param] = w.have;
  }
  const auto index_of = [&](const ckpt::TensorInfo* t) {
    return static_cast<std::size_t>(t - h.tensors.data());
  };
  std::vector<ckpt::ReadRange> ranges;
  for (std::size_t si : layout_.mine) {
    const Segment& s = layout_.segments[si];
    for (std::size_t k = 0; k <= slots.size(); ++k) {
      const ckpt::TensorInfo* t = tensor_of[k * params_.size() + s.param];
      if (t == nullptr || s.count == 0) continue;
      ranges.push_back(
          {index_of(t), s.offset * 4, s.count * 4, staging[k].as<float>() + s.storage});
    }
  }
  double scaler[3] = {0, 0, 0};
  if (scaler_tensor) ranges.push_back({index_of(scaler_tensor), 0, sizeof scaler, scaler});
  reader.read(ranges);

  // Everything is read and verified on every rank: commit.
  reducer().discard();
  shard().load(staging, loaded);
  if (opt_.stage == 1 || opt_.stage == 2) reducer().gather_params();
  refresh_persistent();
  steps_ = report.step;
  if (scaler_tensor) {
    scale_ = scaler[0];
    good_steps_ = static_cast<int>(scaler[1]);
    hysteresis_left_ = static_cast<int>(scaler[2]);
  }
  if (restore_groups) {
    groups_ = std::move(new_groups);
    report.hyper_parameters = true;
  }
  clip_coef_ = 1.0;
  grad_norm_ = -1.0;
  return report;
}

}  // namespace shardopt::detail
