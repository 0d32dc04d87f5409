// Checkpoint errors: every kind of bad or mismatched file, failed writes
// and bad save arguments, reported on every rank with the optimizer (or the
// previous file) intact.
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

// The gradient reduction is recorded in the file; a load by an optimizer
// that reduces the other way is an error on every rank and changes nothing.
// A file without the key (older shardopt) loads into either.
TEST_CASE("a checkpoint of the other gradient reduction is refused on every rank", "[ckpt]") {
  TempDir dir;
  const Layout& l = ckpt_layout();
  Model ma(l, DType::f32, false, false, 14);
  ZeroRedundancyOptimizer avg(world(), ma.params(), Adam{.lr = 0.01}, ZeroOptions{.stage = 2});
  Model ms(l, DType::f32, false, false, 15);
  ZeroRedundancyOptimizer sum(world(), ms.params(), Adam{.lr = 0.01},
                              ZeroOptions{.stage = 1, .reduction = GradReduction::sum});
  train(avg, ma, nullptr, 14, 0, 2, world_size(), world_rank());
  train(sum, ms, nullptr, 15, 0, 1, world_size(), world_rank());
  const std::string avg_file = dir.file("avg.safetensors"), sum_file = dir.file("sum.safetensors");
  avg.save(avg_file);
  sum.save(sum_file);
  for (const auto& [file, want] : {std::pair{avg_file, "avg"}, std::pair{sum_file, "sum"}}) {
    ckpt::Reader rd(world(), file);
    const auto it = rd.header().metadata.find("shardopt.grad_reduction");
    INFO(file << " must record shardopt.grad_reduction " << want);
    CHECK(all_ranks_true(it != rd.header().metadata.end() && it->second == want));
  }
  check_load_fails<CheckpointError>(sum, ms, avg_file, ErrorCode::checkpoint,
                                    "the run that saved it averaged its gradients over the ranks "
                                    "(GradReduction::avg), this optimizer sums them "
                                    "(GradReduction::sum)");
  check_load_fails<CheckpointError>(avg, ma, sum_file, ErrorCode::checkpoint,
                                    "the run that saved it summed its gradients over the ranks "
                                    "(GradReduction::sum), this optimizer averages them "
                                    "(GradReduction::avg)");
  // Not even a non-strict load takes it.
  check_load_fails<CheckpointError>(avg, ma, sum_file, ErrorCode::checkpoint, "GradReduction::sum",
                                    LoadOptions{.strict = false});
  // Without the key: accepted by both.
  const std::string old_file = dir.file("old.safetensors");
  if (world_rank() == 0) {
    const std::string bytes = read_file(avg_file);
    nlohmann::ordered_json h = header_of(bytes);
    h["__metadata__"].erase("shardopt.grad_reduction");
    write_file(old_file, with_header(bytes, h.dump()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(all_ranks_true(no_throw([&] { sum.load(old_file); })));
  CHECK(all_ranks_true(no_throw([&] { avg.load(old_file); })));
  CHECK(all_ranks_true(sum.steps() == 2 && avg.steps() == 2));
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
    // Ranks on other nodes (scripts/netns-cluster's, each with its own
    // mounts) do not see rank 0's tmpfs but the directory under it: there
    // the save must fail at once, on every rank, naming a rank that does not
    // see the file, and leave nothing behind.
    bool sees = true;
    if (mounted) {
      if (world_rank() == 0) write_file(mnt + "/mark", "x");
      MPI_Barrier(MPI_COMM_WORLD);
      sees = fs::exists(mnt + "/mark");
      MPI_Barrier(MPI_COMM_WORLD);
      if (world_rank() == 0) fs::remove(mnt + "/mark");
    }
    if (mounted && !all_ranks_true(sees)) {
      Model small(make_layout({100}), DType::f32, false, false, 1);
      ZeroRedundancyOptimizer s(world(), small.params(), SGD{.lr = 0.1}, ZeroOptions{.stage = 1});
      CHECK(all_ranks_true(throws_error<IoError>([&] { s.save(mnt + "/c.safetensors"); },
                                                 ErrorCode::io,
                                                 "the ranks do not see the same file at")));
      CHECK(all_ranks_true(fs::is_empty(mnt)));
      MPI_Barrier(MPI_COMM_WORLD);
      if (world_rank() == 0) ::umount(mnt.c_str());
    } else if (mounted) {
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

namespace {

// Every rank's host name, in rank order.
std::vector<std::string> host_names() {
  char mine[256] = {};
  ::gethostname(mine, sizeof mine - 1);
  std::vector<char> all(256 * static_cast<std::size_t>(world_size()));
  MPI_Allgather(mine, 256, MPI_CHAR, all.data(), 256, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int r = 0; r < world_size(); ++r) out.emplace_back(all.data() + 256 * r);
  return out;
}

// Collective: f() must throw an IoError on every rank whose message holds
// each of `needles` and whose hint sends checkpoints to a shared file system.
template <class F>
bool throws_not_shared(F&& f, const std::vector<std::string>& needles) {
  bool ok = false;
  try {
    f();
    UNSCOPED_INFO("rank " << world_rank() << ": no error");
  } catch (const IoError& e) {
    ok = e.hint().find("not in /tmp or node-local scratch") != std::string::npos;
    for (const std::string& n : needles) ok = ok && e.message().find(n) != std::string::npos;
    if (!ok) UNSCOPED_INFO("rank " << world_rank() << ": " << e.what());
  }
  return all_ranks_true(ok);
}

}  // namespace

TEST_CASE("ranks that do not see the same file: save and load are errors on every rank, no hang",
          "[ckpt]") {
  if (world_size() < 2) {
    SUCCEED("one rank: every rank sees the same file");
    return;
  }
  // A node-local directory (/tmp, local scratch) at the same path on every
  // node is another directory on each. Here, on one machine: each process's
  // /proc/self/fd/N is its own descriptor N, which the ranks below
  // size/2 open on one directory ("node 1") and the others on another.
  TempDir dir;
  const std::string node1 = dir.file("node1"), node2 = dir.file("node2");
  if (world_rank() == 0) {
    fs::create_directory(node1);
    fs::create_directory(node2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const int second = world_size() / 2;  // the first rank of "node 2"
  const bool on_second = world_rank() >= second;
  constexpr int kFd = 999;
  bool fd_ok = ::fcntl(kFd, F_GETFD) == -1;  // free, so that dup2 closes nothing
  const int opened = ::open((on_second ? node2 : node1).c_str(), O_RDONLY | O_DIRECTORY);
  fd_ok = fd_ok && opened >= 0 && ::dup2(opened, kFd) == kFd;
  if (opened >= 0) ::close(opened);
  REQUIRE(all_ranks_true(fd_ok));
  const std::string path = "/proc/self/fd/" + std::to_string(kFd) + "/c.safetensors";
  const std::vector<std::string> hosts = host_names();
  const std::string ranks_not = world_size() - second > 1
                                    ? " (" + std::to_string(world_size() - second) + " of " +
                                          std::to_string(world_size()) + " ranks do not see it)"
                                    : "";

  Model m(ckpt_layout(), DType::f32, false, false, 31);
  ZeroRedundancyOptimizer opt(world(), m.params(), Adam{.lr = 0.01}, ZeroOptions{.stage = 2});
  train(opt, m, nullptr, 31, 0, 1, world_size(), world_rank());
  // The previous checkpoint, at node 1's path (every rank sees node1 itself).
  opt.save(node1 + "/c.safetensors");
  const std::string before = world_rank() == 0 ? read_file(node1 + "/c.safetensors") : "";
  train(opt, m, nullptr, 31, 1, 1, world_size(), world_rank());
  const auto listing = [](const std::string& d) {
    std::string out;
    for (const auto& e : fs::directory_iterator(d)) out += e.path().filename().string() + " ";
    return out;
  };

  // Save: rank 0 creates the temporary file in node 1; the ranks of node 2
  // cannot open it.
  CHECK(throws_not_shared([&] { opt.save(path); },
                          {"the ranks do not see the same file at '" + path + "': rank 0 (host " +
                               hosts[0] + ") created the temporary file '" + path + ".tmp-",
                           "' there, but rank " + std::to_string(second) + " (host " +
                               hosts[second] + ") cannot open '" + path + ".tmp-",
                           "': No such file or directory" + ranks_not}));
  // The temporary file is gone, the previous checkpoint as it was.
  if (world_rank() == 0) {
    CHECK(listing(node1) == "c.safetensors ");
    CHECK(listing(node2).empty());
    CHECK(read_file(node1 + "/c.safetensors") == before);
  }

  // Load: node 2 has no file there, then another checkpoint (of the
  // state one step later), then a copy of node 1's, which is not the same
  // file either (Open MPI's MPI_File_open would hang on it).
  const Snapshot saved = snapshot(opt, m);
  const std::string read_it = "the ranks do not see the same file at '" + path +
                              "': rank 0 (host " + hosts[0] + ") read a checkpoint of " +
                              std::to_string(fs::file_size(node1 + "/c.safetensors")) +
                              " bytes there and wrote '" + path + ".probe-";
  const std::string but =
      "' beside it, but rank " + std::to_string(second) + " (host " + hosts[second] + ") ";
  CHECK(
      throws_not_shared([&] { opt.load(path); },
                        {read_it, but + "cannot open it: No such file or directory" + ranks_not}));
  opt.save(node2 + "/c.safetensors");
  CHECK(throws_not_shared([&] { opt.load(path); }, {read_it, but + "finds another file there"}));
  if (world_rank() == 0)
    fs::copy_file(node1 + "/c.safetensors", node2 + "/c.safetensors",
                  fs::copy_options::overwrite_existing);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(throws_not_shared([&] { opt.load(path); },
                          {read_it, but + "cannot open '" + path + ".probe-"}));
  CHECK(all_ranks_true(compare_snapshots(saved, snapshot(opt, m)).empty()));
  // Nothing left beside the files; node 1's file loads through its own path.
  if (world_rank() == 0) {
    CHECK(listing(node1) == "c.safetensors ");
    CHECK(listing(node2) == "c.safetensors ");
  }
  CHECK(all_ranks_true(no_throw([&] { opt.load(node1 + "/c.safetensors"); })));
  CHECK(opt.steps() == 1);
  // And on a shared path, saving works as ever.
  CHECK(all_ranks_true(no_throw([&] { opt.save(node1 + "/c.safetensors"); })));
  ::close(kFd);
}

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
