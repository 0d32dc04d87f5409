// Checkpoints of the ZeRO engine: exact restarts at another rank count and
// stage, exports, rotation, and every kind of bad file or failed write,
// reported on every rank with the optimizer (or the previous file) intact.
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

#include "shardopt/checkpoint.hpp"
#include "zero_helpers.hpp"

namespace shardopt::test::zero {
namespace {

namespace fs = std::filesystem;

// A directory every rank sees, removed at the end of the test case.
class TempDir {
 public:
  TempDir() {
    char buf[256] = {};
    if (world_rank() == 0) {
      std::snprintf(buf, sizeof buf, "%s/shardopt-ckpt-XXXXXX", fs::temp_directory_path().c_str());
      if (::mkdtemp(buf) == nullptr) buf[0] = '\0';
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = buf;
  }
  ~TempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0 && !path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The first n ranks of MPI_COMM_WORLD (null on the others).
std::unique_ptr<Communicator> first_ranks(int n) {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  if (sub == MPI_COMM_NULL) return nullptr;
  auto c = std::make_unique<Communicator>(sub);
  MPI_Comm_free(&sub);
  return c;
}

const Layout& ckpt_layout() {
  static const Layout l = make_layout({37, 1, 300, 0, 129, 64, 5});
  return l;
}

// `count` steps from step `first` on n ranks (this one rank r) with exact
// gradients; the reference, if any, takes the same steps.
void train(ZeroRedundancyOptimizer& opt, Model& model, Reference* ref, std::uint64_t key, int first,
           int count, int n, int r) {
  const Layout& l = model.layout();
  for (int s = first; s < first + count; ++s) {
    opt.zero_grad();
    for (std::size_t i = l.size(); i-- > 0;) {
      // Scaled by the loss scale (a power of 2: exact), which step() undoes.
      fill_grad(model.grad_data(i), model.dtype(), l.sizes[i], GradKind::exact, key, s, r, i, false,
                static_cast<float>(opt.loss_scale()));
      opt.grad_ready(i);
    }
    opt.step();
    if (ref) ref->step(reduced_grads(l, model.dtype(), GradKind::exact, key, s, n), 1.0 / n);
  }
}

Snapshot snapshot(ZeroRedundancyOptimizer& opt, Model& model) {
  Snapshot s;
  for (std::size_t i = 0; i < model.layout().size(); ++i) s.params.push_back(model.all_bits(i));
  for (const std::string& name : opt.state_names())
    for (std::size_t i = 0; i < model.layout().size(); ++i)
      s.states[name].push_back(opt.gather_state(name, i));
  return s;
}

// "" or what differs between the engine and the reference.
std::string against_reference(ZeroRedundancyOptimizer& opt, Model& model, const Reference& ref) {
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
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path()))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
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

namespace {

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// The header of a file as JSON, and the file rebuilt from a changed one.
nlohmann::ordered_json header_of(const std::string& file) {
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return nlohmann::ordered_json::parse(file.substr(8, n));
}
std::string with_header(const std::string& file, const std::string& json) {
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::string h = json;
  while ((8 + h.size()) % 8 != 0) h += ' ';
  std::uint64_t m = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &m, 8);
  return out + h + file.substr(8 + n);
}

// Collective: load(path) must fail on every rank with `code` and a message
// containing `needle`, leaving the optimizer as it was; afterwards a step
// must still work.
template <class E>
void check_load_fails(ZeroRedundancyOptimizer& opt, Model& m, const std::string& path,
                      ErrorCode code, const std::string& needle, LoadOptions lo = {}) {
  INFO("load of " << path << " must fail with '" << needle << "'");
  const Snapshot before = snapshot(opt, m);
  const std::int64_t steps = opt.steps();
  CHECK(all_ranks_true(throws_error<E>([&] { opt.load(path, lo); }, code, needle)));
  const std::string d = compare_snapshots(before, snapshot(opt, m));
  if (!d.empty()) UNSCOPED_INFO("rank " << world_rank() << ": state changed: " << d);
  CHECK(all_ranks_true(d.empty() && opt.steps() == steps));
}

}  // namespace

TEST_CASE("a bad or mismatched checkpoint is an error on every rank, nothing changes", "[ckpt]") {
  TempDir dir;
  const Layout& l = ckpt_layout();
  Model m(l, DType::f32, false, false, 12);
  const ZeroOptions o{.stage = 2, .bucket_mb = 0.0002};
  ZeroRedundancyOptimizer opt(world(), m.params(), Adam{.lr = 0.01}, o);
  train(opt, m, nullptr, 12, 0, 2, world_size(), world_rank());
  const std::string good = dir.file("good.safetensors");
  opt.save(good, {.chunk_bytes = 256});
  opt.export_params(dir.file("export.safetensors"));
  train(opt, m, nullptr, 12, 2, 1, world_size(), world_rank());  // differ from the file

  const std::string bytes = world_rank() == 0 ? read_file(good) : std::string();
  const auto make = [&](const std::string& name, const std::function<std::string()>& f) {
    if (world_rank() == 0) write_file(dir.file(name), f());
    MPI_Barrier(MPI_COMM_WORLD);
    return dir.file(name);
  };
  const auto hdr = [&] { return header_of(bytes); };
  const auto data_start = [&] {
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    return 8 + n;
  };
  const ErrorCode ck = ErrorCode::checkpoint;

  check_load_fails<IoError>(opt, m, dir.file("missing.safetensors"), ErrorCode::io, "cannot open");
  check_load_fails<CheckpointError>(
      opt, m, make("trunc", [&] { return bytes.substr(0, bytes.size() / 2); }), ck, "past the end");
  check_load_fails<CheckpointError>(opt, m, make("short", [&] { return bytes.substr(0, 5); }), ck,
                                    "too short");
  check_load_fails<CheckpointError>(
      opt, m,
      make("flip",
           [&] {
             std::string b = bytes;
             b[b.size() - 7] ^= 0x10;  // in the last tensor's data
             return b;
           }),
      ck, "checksum mismatch in tensor '" + l.names.back() + ".exp_avg_sq'");
  check_load_fails<CheckpointError>(opt, m,
                                    make("hdrlen",
                                         [&] {
                                           std::string b = bytes;
                                           b[6] = 0x7f;  // a header length far past the end
                                           return b;
                                         }),
                                    ck, "header");
  check_load_fails<CheckpointError>(opt, m,
                                    make("garbage",
                                         [&] {
                                           std::string b = bytes;
                                           for (std::size_t i = 8; i < 40; ++i)
                                             b[i] = static_cast<char>(0xff - i);
                                           return b;
                                         }),
                                    ck, "");
  check_load_fails<CheckpointError>(
      opt, m,
      make("json",
           [&] {
             std::string b = bytes;
             b[data_start() - 1] = '{';  // padding or the closing brace turned into an opening one
             b[data_start() - 2] = '{';
             return b;
           }),
      ck, "");
  check_load_fails<CheckpointError>(
      opt, m,
      make("offsets",
           [&] {
             auto j = hdr();
             j[l.names[0]]["data_offsets"][1] =
                 j[l.names[0]]["data_offsets"][1].get<std::uint64_t>() + 4;
             return with_header(bytes, j.dump());
           }),
      ck, "");
  check_load_fails<CheckpointError>(
      opt, m,
      make("range",
           [&] {
             auto j = hdr();
             const std::string last = l.names.back() + ".exp_avg_sq";
             j[last]["data_offsets"][1] = j[last]["data_offsets"][1].get<std::uint64_t>() + 1000;
             j[last]["shape"][0] = j[last]["shape"][0].get<std::uint64_t>() + 250;
             return with_header(bytes, j.dump());
           }),
      ck, "");
  check_load_fails<CheckpointError>(opt, m,
                                    make("newer",
                                         [&] {
                                           auto j = hdr();
                                           j["__metadata__"]["shardopt.format_version"] = "2";
                                           return with_header(bytes, j.dump());
                                         }),
                                    ck, "newer");
  check_load_fails<CheckpointError>(opt, m,
                                    make("kind",
                                         [&] {
                                           auto j = hdr();
                                           j["__metadata__"]["shardopt.optimizer"] = "sgd";
                                           return with_header(bytes, j.dump());
                                         }),
                                    ck, "saved by optimizer 'sgd'");
  check_load_fails<CheckpointError>(opt, m, dir.file("export.safetensors"), ck, "not a checkpoint");
  check_load_fails<CheckpointError>(opt, m,
                                    make("plain",
                                         [&] {
                                           auto j = hdr();
                                           j.erase("__metadata__");
                                           return with_header(bytes, j.dump());
                                         }),
                                    ck, "no shardopt metadata");

  // Another layout: a parameter more, one of another size, one of another
  // shape; strictly an error listing them; otherwise the rest loads.
  Layout l2 = l;
  l2.names.push_back("extra");
  l2.sizes.push_back(9);
  l2.sizes[4] = 130;
  Model m2(l2, DType::f32, false, false, 13);
  std::vector<Param> p2 = m2.params();
  p2[2].shape = {3, 100};
  ZeroRedundancyOptimizer opt2(world(), p2, Adam{.lr = 0.01}, o);
  check_load_fails<CheckpointError>(opt2, m2, good, ck, "tensor(s) of this optimizer missing");
  check_load_fails<CheckpointError>(opt2, m2, good, ck, l2.names[2] + ": F32 [300] in the file");
  // One step first, so that the state the non-strict load must leave alone
  // is not zero.
  train(opt2, m2, nullptr, 13, 0, 1, world_size(), world_rank());
  const std::vector<float> kept_state = opt2.gather_state("exp_avg", 2);
  const std::vector<float> kept_extra = opt2.gather_state("exp_avg_sq", l2.size() - 1);
  CHECK(std::any_of(kept_state.begin(), kept_state.end(), [](float v) { return v != 0; }));
  LoadReport rep;
  CHECK(all_ranks_true(no_throw([&] { rep = opt2.load(good, {.strict = false}); })));
  CHECK(opt2.gather_state("exp_avg", 2) == kept_state);
  CHECK(opt2.gather_state("exp_avg_sq", l2.size() - 1) == kept_extra);
  CHECK(rep.missing.size() == 3);     // extra and its two states
  CHECK(rep.mismatched.size() == 6);  // two parameters, three tensors each
  CHECK(rep.unexpected.empty());
  CHECK(rep.loaded.size() == 3 * l.size() - 6);
  CHECK(rep.step == 2);
  // What loaded holds the file's values.
  ckpt::Reader rd(world(), good);
  std::vector<float> want(l.sizes[0]);
  const ckpt::TensorInfo* t = rd.header().find(l.names[0] + ".exp_avg");
  rd.read({{static_cast<std::size_t>(t - rd.header().tensors.data()), 0, t->bytes(), want.data()}});
  CHECK(compare_floats(opt2.gather_state("exp_avg", 0), want, Tolerance{}).empty());
  // The original optimizer still steps after all these failures.
  CHECK(all_ranks_true(
      no_throw([&] { train(opt, m, nullptr, 12, 3, 1, world_size(), world_rank()); })));
}

TEST_CASE("a failed save is an error on every rank; the previous checkpoint stays", "[ckpt]") {
  TempDir dir;
  Model m(ckpt_layout(), DType::f32, false, false, 21);
  ZeroRedundancyOptimizer opt(world(), m.params(), AdamW{.lr = 0.01}, ZeroOptions{.stage = 1});
  train(opt, m, nullptr, 21, 0, 1, world_size(), world_rank());
  const std::string path = dir.file("keep.safetensors");
  opt.save(path);
  const std::string before = world_rank() == 0 ? read_file(path) : std::string();
  train(opt, m, nullptr, 21, 1, 1, world_size(), world_rank());
  const auto unchanged = [&] {
    bool same = world_rank() != 0 || read_file(path) == before;
    if (world_rank() == 0) {
      for (const auto& e : fs::directory_iterator(dir.path()))
        if (e.path().filename().string().find(".tmp-") != std::string::npos) same = false;
    }
    return all_ranks_true(same);
  };

  SECTION("a directory that does not exist") {
    CHECK(all_ranks_true(
        throws_error<IoError>([&] { opt.save(dir.file("no/such/dir/c.safetensors")); },
                              ErrorCode::io, "No such file or directory")));
  }
  SECTION("a directory that cannot be written") {
    // Root writes anywhere a permission allows: use /sys, which refuses.
    std::string target = dir.file("ro");
    if (::geteuid() == 0) {
      target = "/sys";
    } else if (world_rank() == 0) {
      fs::create_directory(target);
      fs::permissions(target, fs::perms::owner_read | fs::perms::owner_exec);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(all_ranks_true(throws_error<IoError>([&] { opt.save(target + "/c.safetensors"); },
                                               ErrorCode::io, "cannot create")));
  }
  SECTION("a file size limit (RLIMIT_FSIZE) below the checkpoint's size") {
    // The kernel then refuses the writes (EFBIG) as a full disk does.
    rlimit old{};
    ::getrlimit(RLIMIT_FSIZE, &old);
    rlimit lim = old;
    lim.rlim_cur = 4096;
    auto prev = std::signal(SIGXFSZ, SIG_IGN);
    ::setrlimit(RLIMIT_FSIZE, &lim);
    const bool failed =
        throws_error<IoError>([&] { opt.save(path); }, ErrorCode::io, "cannot reserve");
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, prev);
    CHECK(all_ranks_true(failed));
  }
  SECTION("a full file system (a small tmpfs, where this process may mount one)") {
    const std::string mnt = dir.file("small");
    int mounted = 0;
    if (world_rank() == 0) {
      fs::create_directory(mnt);
      mounted = ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") == 0 ? 1 : 0;
    }
    MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (mounted) {
      // A small checkpoint that fits, then a larger one that does not.
      Model small(make_layout({100}), DType::f32, false, false, 1);
      ZeroRedundancyOptimizer s(world(), small.params(), SGD{.lr = 0.1}, ZeroOptions{.stage = 1});
      s.save(mnt + "/c.safetensors");
      const std::string prev = world_rank() == 0 ? read_file(mnt + "/c.safetensors") : "";
      Model big(make_layout({20000}), DType::f32, false, false, 2);
      ZeroRedundancyOptimizer b(world(), big.params(), Adam{.lr = 0.1}, ZeroOptions{.stage = 1});
      CHECK(all_ranks_true(
          throws_error<IoError>([&] { b.save(mnt + "/c.safetensors"); }, ErrorCode::io, "")));
      bool same = world_rank() != 0 || read_file(mnt + "/c.safetensors") == prev;
      if (world_rank() == 0)
        for (const auto& e : fs::directory_iterator(mnt))
          same = same && e.path().filename() == "c.safetensors";
      CHECK(all_ranks_true(same));
      MPI_Barrier(MPI_COMM_WORLD);
      if (world_rank() == 0) ::umount(mnt.c_str());
    } else {
      WARN(
          "a tmpfs cannot be mounted here (no privilege): the full disk is covered by the "
          "RLIMIT_FSIZE section only");
    }
  }
  CHECK(unchanged());
  // The optimizer is fine: it saves and loads afterwards.
  CHECK(all_ranks_true(no_throw([&] {
    opt.save(path);
    opt.load(path);
  })));
}

}  // namespace shardopt::test::zero

namespace shardopt::test::zero {

TEST_CASE("bad save arguments are errors on every rank", "[ckpt]") {
  TempDir dir;
  Model m(ckpt_layout(), DType::f32, false, false, 4);
  ZeroRedundancyOptimizer opt(world(), m.params(), Adam{.lr = 0.01}, ZeroOptions{.stage = 2});
  const ErrorCode bad = ErrorCode::invalid_argument;
  const std::string path = dir.file("a.safetensors");
  CHECK(all_ranks_true(
      throws_error<InvalidArgument>([&] { opt.save(path, {.keep_last = 0}); }, bad, "keep_last")));
  CHECK(all_ranks_true(throws_error<InvalidArgument>([&] { opt.save(path, {.chunk_bytes = 0}); },
                                                     bad, "chunk_bytes")));
  // On one rank only: every rank still throws.
  const int keep = world_rank() == world_size() - 1 ? 0 : 1;
  CHECK(all_ranks_true(
      throws_error<InvalidArgument>([&] { opt.save(path, {.keep_last = keep}); }, bad, "")));
  if (world_size() > 1) {
    const std::uint64_t chunk = world_rank() == 0 ? 4096 : 8192;
    CHECK(all_ranks_true(throws_error<InvalidArgument>(
        [&] { opt.save(path, {.chunk_bytes = chunk}); }, bad, "different")));
  }
  // A path that differs between ranks: one file per rank is not a
  // checkpoint. Save and load both refuse it, naming the ranks.
  if (world_size() > 1) {
    const std::string mine = dir.file("r" + std::to_string(world_rank()) + ".safetensors");
    CHECK(all_ranks_true(
        throws_error<InvalidArgument>([&] { opt.save(mine); }, bad, "the file path is '")));
    CHECK(all_ranks_true(throws_error<InvalidArgument>([&] { opt.load(mine); }, bad, "on rank")));
    CHECK(all_ranks_true(!fs::exists(mine)));
  }
  // A parameter whose name is another's plus ".exp_avg": two tensors would
  // share a name.
  std::vector<float> a(4), b(4), ga(4), gb(4);
  ZeroRedundancyOptimizer clash(
      world(),
      {{.name = "w", .data = a.data(), .numel = 4, .grad = ga.data()},
       {.name = "w.exp_avg", .data = b.data(), .numel = 4, .grad = gb.data()}},
      Adam{.lr = 0.01});
  CHECK(
      all_ranks_true(throws_error<InvalidArgument>([&] { clash.save(path); }, bad, "'w.exp_avg'")));
  // Nothing was written, and the optimizer still saves.
  CHECK(all_ranks_true(!fs::exists(path)));
  CHECK(all_ranks_true(no_throw([&] { opt.save(path); })));
}

}  // namespace shardopt::test::zero
