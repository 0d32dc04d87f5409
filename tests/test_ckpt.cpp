// Checkpoints of the ZeRO engine: exact restarts at another rank count and
// stage, exports and rotation. Bad files and failed writes:
// test_ckpt_errors.cpp.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt_helpers.hpp"
#include "shardopt/checkpoint.hpp"
#include "zero_helpers.hpp"

namespace shardopt::test::zero {
namespace {

namespace fs = std::filesystem;

// The first n ranks of MPI_COMM_WORLD (null on the others).
std::unique_ptr<Communicator> first_ranks(int n) {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  if (sub == MPI_COMM_NULL) return nullptr;
  auto c = std::make_unique<Communicator>(sub);
  MPI_Comm_free(&sub);
  return c;
}

// "" or what differs between the engine and the reference.
std::string against_reference(ZeroRedundancyOptimizer& opt, Model& model, const Reference& ref) {
  model.pull();
  for (std::size_t i = 0; i < model.layout().size(); ++i) {
    std::string d = compare_bits(model.all_bits(i), ref.param_bits(i));
    if (!d.empty()) return "parameter " + model.layout().names[i] + ": " + d;
    for (const std::string& name : opt.state_names()) {
      const std::vector<float> want = name == "master" ? ref.master(i) : ref.state(name, i);
      d = compare_floats(opt.gather_state(name, i), want, Tolerance{});
      if (!d.empty()) return "state " + name + " of " + model.layout().names[i] + ": " + d;
    }
  }
  return "";
}

struct Restart {
  OptimizerConfig cfg;
  Precision precision = Precision::f32;
  int save_stage = 1, load_stage = 2;
  int save_ranks = 1, load_ranks = 1;
  std::uint64_t chunk_bytes = 1 << 20;
  bool scaler = false;
};

std::string describe_restart(const Restart& t) {
  std::ostringstream s;
  s << zero::describe(t.cfg) << " " << precision_name(t.precision) << ": saved at stage "
    << t.save_stage << " on " << t.save_ranks << " rank(s), loaded at stage " << t.load_stage
    << " on " << t.load_ranks << " rank(s), chunks of " << t.chunk_bytes << " bytes"
    << (t.scaler ? ", loss scaler" : "");
  return s.str();
}

// Collective over MPI_COMM_WORLD: k steps, save, load elsewhere, the other
// steps; bitwise against the single-process reference of the same steps.
void check_restart(const Restart& t, const std::string& path) {
  INFO(describe_restart(t));
  const int k = 3, total = 6;
  const std::uint64_t key = 41;
  const DType dtype = param_dtype(t.precision);
  const Layout& l = ckpt_layout();
  ZeroOptions o;
  o.bucket_mb = 0.0002;  // several buckets
  o.param_remainders = t.precision == Precision::bf16_rem;
  if (t.scaler) o.loss_scaler = LossScaler{.init_scale = 1.0, .growth_interval = 2};
  std::string failure;
  double scale_saved = 0.0;
  Model init(l, dtype, false, false, key);
  Reference ref(init, t.precision, {t.cfg});
  if (auto comm = first_ranks(t.save_ranks)) {
    const bool ok = no_throw([&] {
      Model m(l, dtype, false, false, key);
      o.stage = t.save_stage;
      ZeroRedundancyOptimizer opt(*comm, m.params(), t.cfg, o);
      train(opt, m, nullptr, key, 0, k, t.save_ranks, comm->rank());
      scale_saved = opt.loss_scale();
      opt.save(path, {.keep_last = 1,
                      .chunk_bytes = t.chunk_bytes,
                      .metadata = {{"next_batch", std::to_string(k)}}});
    });
    if (!ok) failure = "training or saving threw";
  }
  double scale = scale_saved;
  MPI_Bcast(&scale, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  for (int s = 0; s < k; ++s)
    ref.step(reduced_grads(l, dtype, GradKind::exact, key, s, t.save_ranks), 1.0 / t.save_ranks);
  // The reference continues on the loading rank count.
  Reference* r = &ref;
  if (auto comm = first_ranks(t.load_ranks)) {
    const bool ok = no_throw([&] {
      Model m(l, dtype, true, false, key + 99);  // other values, which load replaces
      o.stage = t.load_stage;
      ZeroRedundancyOptimizer opt(*comm, m.params(), t.cfg, o);
      const LoadReport rep = opt.load(path);
      if (rep.step != k || opt.steps() != k || rep.saved_ranks != t.save_ranks)
        failure = "the step count or saved rank count is wrong: " + rep.summary();
      if (rep.metadata.size() != 1 || rep.metadata.at("next_batch") != std::to_string(k))
        failure = "the application's metadata did not come back";
      if (!rep.missing.empty() || !rep.unexpected.empty() || !rep.mismatched.empty())
        failure = "a strict load reported differences: " + rep.summary();
      if (opt.loss_scale() != scale) failure = "the loss scale was not restored";
      // Right after the load: the masters and parameters of step k.
      Reference at_k = *r;
      const std::string d0 = against_reference(opt, m, at_k);
      if (!d0.empty() && failure.empty()) failure = "right after load: " + d0;
      train(opt, m, r, key, k, total - k, t.load_ranks, comm->rank());
      const std::string d = against_reference(opt, m, *r);
      if (!d.empty() && failure.empty()) failure = "after the remaining steps: " + d;
    });
    if (!ok) failure = "loading or training threw";
  } else {
    for (int s = k; s < total; ++s)
      ref.step(reduced_grads(l, dtype, GradKind::exact, key, s, t.load_ranks), 1.0 / t.load_ranks);
  }
  if (!failure.empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << failure);
  CHECK(all_ranks_true(failure.empty()));
}

// The names of the files in folder `dir`, sorted.
std::vector<std::string> file_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("restart from a checkpoint is exact at another rank count and stage", "[ckpt]") {
  TempDir dir;
  const int w = world_size();
  std::vector<std::pair<int, int>> counts = {{w, 1}, {1, w}, {w, w}};
  if (w > 2) counts.push_back({w, w - 1});
  if (w > 2) counts.push_back({w - 1, w});
  const std::vector<OptimizerConfig> cfgs = {
      AdamW{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true},
      SGD{.lr = 0.1, .momentum = 0.9, .nesterov = true},
      Adagrad{.lr = 0.05, .lr_decay = 0.01, .initial_accumulator_value = 0.1},
      RMSprop{.lr = 0.01, .momentum = 0.5, .centered = true},
      Lion{.lr = 0.001, .weight_decay = 0.1},
  };
  int n = 0;
  for (const auto& [a, b] : counts) {
    for (std::size_t c = 0; c < cfgs.size(); ++c) {
      const Precision p = c == 0 ? Precision::f32 : Precision::bf16;
      Restart t{.cfg = cfgs[c], .precision = p};
      t.save_ranks = a;
      t.load_ranks = b;
      t.save_stage = n % 3;
      t.load_stage = (n + 1) % 3;
      t.chunk_bytes = n % 2 == 0 ? 100 : 1 << 20;  // 100: chunks straddle every shard
      ++n;
      check_restart(t, dir.file("c.safetensors"));
    }
  }
  // Every precision, with a loss scaler whose state must come back.
  for (Precision p : all_precisions()) {
    Restart t{.cfg = Adam{.lr = 0.01}, .precision = p, .save_stage = 2, .load_stage = 1};
    t.save_ranks = w;
    t.load_ranks = w > 1 ? w - 1 : 1;
    t.chunk_bytes = 64;
    t.scaler = true;
    check_restart(t, dir.file("p.safetensors"));
  }
}

TEST_CASE("restart of LAMB is exact at the same rank count", "[ckpt]") {
  TempDir dir;
  const Layout& l = ckpt_layout();
  const std::uint64_t key = 5;
  const OptimizerConfig cfg = Lamb{.lr = 0.01};
  std::string failure;
  for (int stage = 0; stage < 3; ++stage) {
    ZeroOptions o{.stage = stage, .bucket_mb = 0.0002};
    Model straight(l, DType::f32, false, false, key), resumed(l, DType::f32, false, false, key);
    ZeroRedundancyOptimizer a(world(), straight.params(), cfg, o);
    train(a, straight, nullptr, key, 0, 6, world_size(), world_rank());
    {
      Model first(l, DType::f32, false, false, key);
      ZeroRedundancyOptimizer b(world(), first.params(), cfg, o);
      train(b, first, nullptr, key, 0, 3, world_size(), world_rank());
      b.save(dir.file("lamb.safetensors"), {.chunk_bytes = 96});
    }
    ZeroRedundancyOptimizer c(world(), resumed.params(), cfg, o);
    c.load(dir.file("lamb.safetensors"));
    train(c, resumed, nullptr, key, 3, 3, world_size(), world_rank());
    const std::string d = compare_snapshots(snapshot(a, straight), snapshot(c, resumed));
    if (!d.empty() && failure.empty()) failure = "stage " + std::to_string(stage) + ": " + d;
  }
  if (!failure.empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << failure);
  CHECK(all_ranks_true(failure.empty()));
}

TEST_CASE("a checkpoint holds the canonical tensors; an export the parameters", "[ckpt]") {
  TempDir dir;
  const Layout& l = ckpt_layout();
  const std::uint64_t key = 8;
  for (Precision p : {Precision::f32, Precision::bf16, Precision::bf16_rem}) {
    INFO(precision_name(p));
    const DType dtype = param_dtype(p);
    Model m(l, dtype, false, false, key);
    ZeroOptions o{.stage = 2, .bucket_mb = 0.0002, .param_remainders = p == Precision::bf16_rem};
    std::vector<Param> params = m.params();
    params[2].shape = {10, 30};
    ZeroRedundancyOptimizer opt(world(), params, Adam{.lr = 0.01}, o);
    train(opt, m, nullptr, key, 0, 2, world_size(), world_rank());
    opt.save(dir.file("c.safetensors"),
             {.chunk_bytes = 128, .metadata = {{"epoch", "7"}, {"data.offset", "12345"}}});
    opt.export_params(dir.file("e32.safetensors"));
    opt.export_params(dir.file("e.safetensors"), {.fp32 = false});
    m.pull();
    std::string failure;
    const auto fail = [&](const std::string& s) {
      if (failure.empty()) failure = s;
    };
    {
      ckpt::Reader rd(world(), dir.file("c.safetensors"));
      const ckpt::Header& h = rd.header();
      if (h.metadata.at("shardopt.content") != "checkpoint" ||
          h.metadata.at("shardopt.step") != "2" || h.metadata.at("shardopt.optimizer") != "adam" ||
          h.metadata.at("shardopt.ranks") != std::to_string(world_size()))
        fail("checkpoint metadata");
      if (h.metadata.at("user.epoch") != "7" || h.metadata.at("user.data.offset") != "12345")
        fail("user metadata");
      if (h.tensors.size() != 3 * l.size())
        fail("checkpoint has " + std::to_string(h.tensors.size()) + " tensors");
      const ckpt::TensorInfo* t = h.find(l.names[2] + ".exp_avg_sq");
      if (!t || t->shape != std::vector<std::uint64_t>{10, 30} || t->dtype != "F32")
        fail("the shape of " + l.names[2] + ".exp_avg_sq");
      // Every rank reads whole tensors (all of them, as a reader at one rank
      // would) and compares with the gathered state.
      for (const std::string& name : opt.state_names()) {
        for (std::size_t i = 0; i < l.size(); ++i) {
          const std::string tn = name == "master" ? l.names[i] : l.names[i] + "." + name;
          const ckpt::TensorInfo* ti = h.find(tn);
          std::vector<float> got(l.sizes[i]);
          if (!ti) {
            fail("no tensor " + tn);
            rd.read({});
            continue;
          }
          rd.read({{static_cast<std::size_t>(ti - h.tensors.data()), 0, ti->bytes(), got.data()}});
          const std::string d = compare_floats(got, opt.gather_state(name, i), Tolerance{});
          if (!d.empty()) fail(tn + ": " + d);
        }
      }
    }
    for (const char* f : {"e32.safetensors", "e.safetensors"}) {
      ckpt::Reader rd(world(), dir.file(f));
      const ckpt::Header& h = rd.header();
      const bool fp32 = std::string(f) == "e32.safetensors";
      if (h.metadata.at("shardopt.content") != "export" || h.tensors.size() != l.size())
        fail(std::string(f) + ": metadata or tensor count");
      for (std::size_t i = 0; i < l.size() && failure.empty(); ++i) {
        const ckpt::TensorInfo* ti = h.find(l.names[i]);
        const std::size_t es = fp32 ? 4 : dtype_size(dtype);
        std::vector<std::byte> got(l.sizes[i] * es);
        if (!ti || ti->dtype != (fp32 ? "F32" : ckpt::dtype_name(dtype))) {
          fail(std::string(f) + ": tensor " + l.names[i]);
          rd.read({});
          continue;
        }
        rd.read({{static_cast<std::size_t>(ti - h.tensors.data()), 0, ti->bytes(), got.data()}});
        if (fp32) {
          std::vector<float> v(l.sizes[i]);
          if (!got.empty()) std::memcpy(v.data(), got.data(), got.size());
          const std::string d = compare_floats(v, opt.gather_state("master", i), Tolerance{});
          if (!d.empty()) fail(std::string(f) + " " + l.names[i] + ": " + d);
        } else if (!got.empty() && std::memcmp(got.data(), m.param_data(i), got.size()) != 0) {
          fail(std::string(f) + " " + l.names[i] + ": not the parameter buffer");
        }
      }
    }
    if (!failure.empty()) UNSCOPED_INFO("rank " << world_rank() << ": " << failure);
    CHECK(all_ranks_true(failure.empty()));
  }
}

TEST_CASE("keep_last rotates checkpoints and leaves no temporary file", "[ckpt]") {
  TempDir dir;
  Model m(ckpt_layout(), DType::f32, false, false, 3);
  ZeroRedundancyOptimizer opt(world(), m.params(), SGD{.lr = 0.1}, ZeroOptions{.stage = 1});
  for (int s = 0; s < 5; ++s) {
    train(opt, m, nullptr, 3, s, 1, world_size(), world_rank());
    opt.save(dir.file("r.safetensors"), {.keep_last = 3});
  }
  std::string failure;
  if (world_rank() == 0) {
    const std::vector<std::string> names = file_names(dir.path());
    const std::vector<std::string> want = {"r.safetensors", "r.safetensors.1", "r.safetensors.2"};
    if (names != want) {
      failure = "the directory holds:";
      for (const auto& n : names) failure += " " + n;
    }
  }
  // Each holds its step: 5, 4, 3.
  for (int i = 0; i < 3; ++i) {
    const std::string f = dir.file(i == 0 ? "r.safetensors" : "r.safetensors." + std::to_string(i));
    ckpt::Reader rd(world(), f);
    if (rd.header().metadata.at("shardopt.step") != std::to_string(5 - i))
      failure = f + " holds step " + rd.header().metadata.at("shardopt.step");
  }
  if (!failure.empty()) UNSCOPED_INFO(failure);
  CHECK(all_ranks_true(failure.empty()));
}

// A damaged file at the path (a truncated copy, say) is not a checkpoint to
// keep: the save replaces it, and path.1 keeps the last valid one instead
// of the damaged file.
TEST_CASE("keep_last never rotates a damaged file over the last valid checkpoint", "[ckpt]") {
  TempDir dir;
  Model m(ckpt_layout(), DType::f32, false, false, 4);
  ZeroRedundancyOptimizer opt(world(), m.params(), SGD{.lr = 0.1}, ZeroOptions{.stage = 1});
  const std::string path = dir.file("r.safetensors");
  for (int s = 0; s < 2; ++s) {
    train(opt, m, nullptr, 4, s, 1, world_size(), world_rank());
    opt.save(path, {.keep_last = 2});
  }
  if (world_rank() == 0) fs::resize_file(path, fs::file_size(path) / 2);
  MPI_Barrier(MPI_COMM_WORLD);
  train(opt, m, nullptr, 4, 2, 1, world_size(), world_rank());
  opt.save(path, {.keep_last = 2});
  std::string failure;
  if (world_rank() == 0) {
    const std::vector<std::string> names = file_names(dir.path());
    if (names != std::vector<std::string>{"r.safetensors", "r.safetensors.1"}) {
      failure = "the directory holds:";
      for (const auto& n : names) failure += " " + n;
    }
  }
  // path holds step 3, path.1 the last valid one, step 1 (not the
  // truncated step 2).
  for (int i = 0; i < 2; ++i) {
    const std::string f = i == 0 ? path : path + ".1";
    try {
      ckpt::Reader rd(world(), f);
      if (rd.header().metadata.at("shardopt.step") != std::to_string(i == 0 ? 3 : 1))
        failure = f + " holds step " + rd.header().metadata.at("shardopt.step");
    } catch (const Error& e) {
      failure = f + " is not a valid checkpoint: " + e.what();
    }
  }
  if (!failure.empty()) UNSCOPED_INFO(failure);
  CHECK(all_ranks_true(failure.empty()));
}

}  // namespace shardopt::test::zero
