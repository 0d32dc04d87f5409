// shardopt-ckpt bench: times ZeroRedundancyOptimizer::save and load beside
// raw pwrite+fsync and pread of as many bytes in the same directory.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../support/cli.hpp"
#include "../support/machine.hpp"
#include "../support/report.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "shardopt/agree.hpp"

namespace ckpt_tool {
namespace {

using cli::human_count;

constexpr u64 kRawBlock = u64{16} << 20;  // bytes per pwrite/pread call
constexpr double kGoalRatio = 0.8;
constexpr double kBusyFraction = 0.05;

const char* fs_name(long type) {
  switch (static_cast<unsigned long>(type)) {
    case 0xEF53:
      return "ext4";
    case 0x01021994:
      return "tmpfs";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x6969:
      return "nfs";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    case 0x794c7630:
      return "overlayfs";
    case 0x65735546:
      return "fuse";
    default:
      return "unknown";
  }
}

// The model: 4 layers, each a weight (rows of 1024 where the count allows)
// and a bias, adding up to psi.
struct BenchTensor {
  std::string name;
  std::size_t numel;
  std::vector<std::size_t> shape;
};

std::vector<BenchTensor> bench_layout(std::size_t psi) {
  constexpr std::size_t kLayers = 4;
  const std::size_t bias = std::min<std::size_t>(1024, psi / (8 * kLayers));
  std::vector<BenchTensor> t;
  std::size_t used = 0;
  for (std::size_t l = 0; l < kLayers; ++l) {
    const std::size_t weight =
        l + 1 < kLayers ? (psi - kLayers * bias) / kLayers : psi - used - bias;
    BenchTensor wt{"layers." + std::to_string(l) + ".weight", weight, {}};
    if (weight % 1024 == 0 && weight > 0) wt.shape = {weight / 1024, 1024};
    t.push_back(std::move(wt));
    t.push_back({"layers." + std::to_string(l) + ".bias", bias, {}});
    used += weight + bias;
  }
  return t;
}

struct BenchRow {
  std::size_t params = 0;
  int ranks = 0;
  u64 bytes = 0;
  int iters = 0;
  double save_s = 0, raw_write_s = 0, load_s = 0, raw_read_s = 0;
  double other_load = -1;
  double gbps(double s) const { return s > 0 ? double(bytes) / s / 1e9 : 0; }
  double save_ratio() const { return raw_write_s > 0 ? raw_write_s / save_s : 0; }
  double load_ratio() const { return raw_read_s > 0 ? raw_read_s / load_s : 0; }
  bool busy() const { return other_load > kBusyFraction; }
};

// Collective: the slowest rank's seconds for fn, started together.
template <class Fn>
double timed(const World& w, Fn&& fn) {
  MPI_Barrier(w.comm);
  const double t0 = MPI_Wtime();
  fn();
  return shardopt::max_over_ranks(*w.tool, MPI_Wtime() - t0);
}

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

// Local: moves `bytes` at `offset` of the open file fd in kRawBlock calls
// io(done, length) (a pread or a pwrite of bytes [done, done + length));
// "" or failed(n) for a call that moved n <= 0 bytes.
template <class Io, class Failed>
std::string in_blocks(u64 bytes, Io&& io, Failed&& failed) {
  for (u64 done = 0; done < bytes;) {
    const ssize_t n = io(done, static_cast<std::size_t>(std::min(kRawBlock, bytes - done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failed(n);
    done += static_cast<u64>(n);
  }
  return {};
}

// Local: writes `bytes` of buf at `offset` of path in kRawBlock calls, then
// fsyncs; "" or the error.
std::string raw_write(const std::string& path, const unsigned char* buf, u64 offset, u64 bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errno_text("cannot open", path);
  std::string err = in_blocks(
      bytes,
      [&](u64 done, std::size_t length) {
        return ::pwrite(fd, buf + done, length, static_cast<off_t>(offset + done));
      },
      [&](ssize_t) { return errno_text("cannot write", path); });
  if (err.empty() && ::fsync(fd) != 0) err = errno_text("cannot sync", path);
  ::close(fd);
  return err;
}

std::string raw_read(const std::string& path, unsigned char* buf, u64 offset, u64 bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_text("cannot open", path);
  const std::string err = in_blocks(
      bytes,
      [&](u64 done, std::size_t length) {
        return ::pread(fd, buf + done, length, static_cast<off_t>(offset + done));
      },
      [&](ssize_t n) {
        return n < 0 ? errno_text("cannot read", path) : "'" + path + "' is shorter than expected";
      });
  ::close(fd);
  return err;
}

// Local: drops the file's pages from the page cache (they are clean: the
// writes were synced).
void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// User CPU seconds of the whole machine (/proc/stat: user and nice) and of
// this process. Others' computing shows in the difference; the kernel's
// work for this benchmark's I/O (writeback, the page cache), which is
// system time and partly done by kernel threads, does not, so that it is
// not taken for a busy machine. ok is false when /proc/stat could not be
// read.
struct UserTimes {
  double machine_s = 0, self_s = 0;
  bool ok = false;
};

UserTimes user_times() {
  UserTimes t;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  t.self_s =
      static_cast<double>(ru.ru_utime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec);
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return t;
  unsigned long long user = 0, nice = 0;
  t.ok = std::fscanf(f, "cpu %llu %llu", &user, &nice) == 2;
  std::fclose(f);
  t.machine_s = static_cast<double>(user + nice) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return t;
}

class Bench {
 public:
  Bench(shardopt::Communicator& comm, const World& w, const BenchOptions& o, std::string base)
      : comm_(comm), w_(w), o_(o), ckpt_(base + ".safetensors"), raw_(base + ".raw") {}
  ~Bench() { remove_files(); }

  void remove_files() {
    if (w_.rank != 0) return;
    ::unlink(ckpt_.c_str());
    ::unlink(raw_.c_str());
  }

  BenchRow run(std::size_t psi) {
    const std::vector<BenchTensor> layout = bench_layout(psi);
    shardopt::HostBuffer params, grads;
    local(w_, [&] {
      params = shardopt::HostBuffer(psi * 4);
      grads = shardopt::HostBuffer(psi * 4);
      float* p = params.as<float>();
      float* g = grads.as<float>();
      std::mt19937 gen(1234);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (std::size_t i = 0; i < psi; ++i) {
        p[i] = u(gen);
        g[i] = 1e-2f * u(gen) * static_cast<float>(w_.rank + 1);
      }
    });
    std::vector<shardopt::Param> ps;
    std::size_t at = 0;
    for (const BenchTensor& t : layout) {
      shardopt::Param p;
      p.name = t.name;
      p.data = params.as<float>() + at;
      p.grad = grads.as<float>() + at;
      p.numel = t.numel;
      p.dtype = DType::f32;
      p.shape = t.shape;
      ps.push_back(std::move(p));
      at += t.numel;
    }
    shardopt::ZeroOptions zo;
    zo.stage = 1;
    shardopt::ZeroRedundancyOptimizer opt(comm_, ps, shardopt::AdamW{}, zo);
    opt.step();  // states that are not zero
    const std::uint64_t hash = report::fnv1a(params.data(), psi * 4);

    // The checkpoint's size, then the raw buffers: each rank its share.
    opt.save(ckpt_);
    u64 bytes = 0;
    if (w_.rank == 0) {
      struct stat st {};
      if (::stat(ckpt_.c_str(), &st) == 0) bytes = static_cast<u64>(st.st_size);
    }
    MPI_Bcast(&bytes, 1, MPI_UINT64_T, 0, w_.comm);
    const u64 n = static_cast<u64>(w_.size);
    const u64 share = (bytes + n - 1) / n;
    const u64 offset = std::min(bytes, share * static_cast<u64>(w_.rank));
    const u64 mine = std::min(share, bytes - offset);
    shardopt::HostBuffer raw;
    local(w_, [&] {
      if (bytes == 0) throw Failure("cannot stat the checkpoint written to " + ckpt_);
      raw = shardopt::HostBuffer(static_cast<std::size_t>(std::max<u64>(mine, 1)));
      std::memset(raw.data(), 0x5a, raw.size());
    });

    std::mt19937 order(777);  // the same draws on every rank
    std::vector<double> save_t, write_t, load_t, read_t;
    const UserTimes before = user_times();
    const double wall0 = MPI_Wtime();
    for (int it = 0; it < o_.warmup + o_.iters; ++it) {
      const bool timed_iter = it >= o_.warmup;
      // Both writes start from no file; the reads from the cache state
      // --cold asks for.
      auto fresh = [&](const std::string& path) {
        if (w_.rank == 0) ::unlink(path.c_str());
        MPI_Barrier(w_.comm);
      };
      auto settle = [&](const std::string& path) {
        if (o_.cold && w_.rank == 0) drop_cache(path);
        MPI_Barrier(w_.comm);
      };
      // a then b, or b then a, as drawn (the same draw on every rank).
      auto in_drawn_order = [&](auto& a, auto& b) {
        if (order() % 2) {
          a();
          b();
        } else {
          b();
          a();
        }
      };
      double s = 0, rw = 0, l = 0, rr = 0;
      std::string err;
      auto do_save = [&] {
        fresh(ckpt_);
        s = timed(w_, [&] { opt.save(ckpt_); });
      };
      auto do_raw_write = [&] {
        fresh(raw_);
        rw = timed(w_, [&] { err = raw_write(raw_, raw.as<unsigned char>(), offset, mine); });
        agree(w_, err);
      };
      in_drawn_order(do_save, do_raw_write);
      shardopt::LoadReport rep;
      auto do_load = [&] {
        settle(ckpt_);
        l = timed(w_, [&] { rep = opt.load(ckpt_); });
      };
      auto do_raw_read = [&] {
        settle(raw_);
        rr = timed(w_, [&] { err = raw_read(raw_, raw.as<unsigned char>(), offset, mine); });
        agree(w_, err);
      };
      in_drawn_order(do_load, do_raw_read);
      if (!rep.missing.empty() || !rep.unexpected.empty() || !rep.mismatched.empty()) {
        throw Failure("load() did not restore every tensor: " + rep.summary());
      }
      if (timed_iter) {
        save_t.push_back(s);
        write_t.push_back(rw);
        load_t.push_back(l);
        read_t.push_back(rr);
      }
    }
    const UserTimes after = user_times();
    const double wall = MPI_Wtime() - wall0;
    // Other processes' share of the CPUs while the row ran (this node's
    // ranks' own time taken out).
    double self = after.self_s - before.self_s;
    MPI_Allreduce(MPI_IN_PLACE, &self, 1, MPI_DOUBLE, MPI_SUM, w_.comm);
    const double cores = static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN));
    double other = -1;
    if (before.ok && after.ok && wall > 0) {
      other = std::max(0.0, (after.machine_s - before.machine_s - self) / (wall * cores));
    }
    MPI_Bcast(&other, 1, MPI_DOUBLE, 0, w_.comm);

    // The parameters after the last load are the ones saved.
    const std::uint64_t again = report::fnv1a(params.data(), psi * 4);
    if (shardopt::any_rank(*w_.tool, again != hash))
      throw Failure("the parameters after load() differ from those saved");

    BenchRow r;
    r.params = psi;
    r.ranks = w_.size;
    r.bytes = bytes;
    r.iters = o_.iters;
    r.save_s = report::median(save_t);
    r.raw_write_s = report::median(write_t);
    r.load_s = report::median(load_t);
    r.raw_read_s = report::median(read_t);
    r.other_load = other;
    remove_files();
    return r;
  }

 private:
  shardopt::Communicator& comm_;
  const World& w_;
  const BenchOptions& o_;
  std::string ckpt_, raw_;
};

void print_bench_header(const BenchOptions& o, const World& w, const std::string& dir_fs,
                        int local_ranks) {
  FILE* f = o.json ? stderr : stdout;
  std::fprintf(f,
               "# %s bench: ZeroRedundancyOptimizer::save/load beside raw pwrite+fsync/pread of "
               "the same bytes in the same directory\n",
               kProgram);
  std::fprintf(f, "# %s\n", shardopt::build_info_string().c_str());
  std::fprintf(f, "# machine: %s, %ld cores online, %d rank%s here\n", machine::cpu_model().c_str(),
               sysconf(_SC_NPROCESSORS_ONLN), local_ranks, local_ranks == 1 ? "" : "s");
  std::fprintf(f,
               "# dir %s (%s); model: AdamW, stage 1, f32, 8 tensors; ranks %d; iters %d "
               "(median), warmup %d; raw: each rank its 1/%d of the checkpoint's bytes at "
               "disjoint offsets of one file, %llu MiB per call, then fsync; reads %s\n",
               o.dir.c_str(), dir_fs.c_str(), w.size, o.iters, o.warmup, w.size,
               static_cast<unsigned long long>(kRawBlock >> 20),
               o.cold ? "after dropping the file's pages (--cold): from the device"
                      : "right after the write and sync: from the page cache");
  std::fprintf(
      f,
      "# times: slowest rank, after a barrier; GB/s = bytes / time (1e9 B); ratio = "
      "raw time / shardopt time (1: as fast as the raw I/O); other: user CPU time of other "
      "processes, a share of all cores (over 5%%: marked *)\n");
  if (!o.json) {
    std::printf("#\n# %5s %8s %12s %9s %9s %6s %9s %9s %6s %9s %9s  %6s\n", "ranks", "params",
                "bytes", "save", "raw_wr", "ratio", "load", "raw_rd", "ratio", "save", "load",
                "other");
    std::printf("# %5s %8s %12s %9s %9s %6s %9s %9s %6s %9s %9s\n", "", "", "(B)", "(GB/s)",
                "(GB/s)", "", "(GB/s)", "(GB/s)", "", "(ms)", "(ms)");
  }
  std::fflush(f);
}

void print_bench_row(const BenchOptions& o, const BenchRow& r) {
  if (o.json) {
    Json j;
    j["ranks"] = r.ranks;
    j["params"] = r.params;
    j["bytes"] = r.bytes;
    j["save_gbps"] = r.gbps(r.save_s);
    j["raw_write_gbps"] = r.gbps(r.raw_write_s);
    j["save_ratio"] = r.save_ratio();
    j["load_gbps"] = r.gbps(r.load_s);
    j["raw_read_gbps"] = r.gbps(r.raw_read_s);
    j["load_ratio"] = r.load_ratio();
    j["save_s"] = r.save_s;
    j["raw_write_s"] = r.raw_write_s;
    j["load_s"] = r.load_s;
    j["raw_read_s"] = r.raw_read_s;
    j["iters"] = r.iters;
    j["dir"] = o.dir;
    j["cold"] = o.cold;
    j["other_load"] = r.other_load >= 0 ? Json(r.other_load) : Json();
    std::printf("%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  } else {
    char other[16] = "?";
    if (r.other_load >= 0) {
      std::snprintf(other, sizeof other, "%3.0f%%%s", 100 * r.other_load, r.busy() ? "*" : "");
    }
    std::printf("  %5d %8s %12llu %9.3f %9.3f %6.3f %9.3f %9.3f %6.3f %9.1f %9.1f  %6s\n", r.ranks,
                human_count(r.params).c_str(), static_cast<unsigned long long>(r.bytes),
                r.gbps(r.save_s), r.gbps(r.raw_write_s), r.save_ratio(), r.gbps(r.load_s),
                r.gbps(r.raw_read_s), r.load_ratio(), 1e3 * r.save_s, 1e3 * r.load_s, other);
  }
  std::fflush(stdout);
}

void print_bench_goals(const BenchOptions& o, const std::vector<BenchRow>& rows) {
  FILE* f = o.json ? stderr : stdout;
  std::fprintf(f,
               "#\n# goal: save >= %.1fx the raw write bandwidth, load >= %.1fx the raw read "
               "bandwidth (ratio >= %.1f)\n",
               kGoalRatio, kGoalRatio, kGoalRatio);
  for (const BenchRow& r : rows) {
    std::fprintf(f, "#   %s params, %d rank%s: save %.3f: %s; load %.3f: %s%s\n",
                 human_count(r.params).c_str(), r.ranks, r.ranks == 1 ? "" : "s", r.save_ratio(),
                 r.save_ratio() >= kGoalRatio ? "met" : "not met", r.load_ratio(),
                 r.load_ratio() >= kGoalRatio ? "met" : "not met",
                 r.busy() ? " (busy machine: other processes used the CPUs, rerun it)" : "");
  }
  std::fflush(f);
}

}  // namespace

int run_bench(shardopt::Communicator& comm, const World& w, const BenchOptions& o) {
  // The directory, as every rank sees it.
  std::string dir_fs = "unknown";
  std::string base;
  const bool dir_ok = guarded(w, "bench", [&] {
    local(w, [&] {
      struct stat st {};
      if (::stat(o.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        throw Failure("-D (--dir) '" + o.dir + "' is not a directory",
                      "pass an existing directory to write the benchmark's files in");
      }
      if (::access(o.dir.c_str(), W_OK) != 0) {
        throw Failure("-D (--dir) '" + o.dir + "' is not writable",
                      "pass a directory you may write in");
      }
      struct statfs fs {};
      if (::statfs(o.dir.c_str(), &fs) == 0) dir_fs = fs_name(static_cast<long>(fs.f_type));
      base = o.dir + "/shardopt-ckpt-bench-" + std::to_string(::getpid());
    });
  });
  if (!dir_ok) return 1;
  auto bcast_string = [&](std::string& s) {
    int n = static_cast<int>(s.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, w.comm);
    s.resize(static_cast<std::size_t>(n));
    MPI_Bcast(s.data(), n, MPI_CHAR, 0, w.comm);
  };
  bcast_string(dir_fs);
  bcast_string(base);

  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(w.comm, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node);
  int local_ranks = 1;
  MPI_Comm_size(node, &local_ranks);
  MPI_Comm_free(&node);
  const double available =
      shardopt::min_over_ranks(*w.tool, static_cast<double>(machine::mem_available_bytes()));

  if (w.rank == 0) print_bench_header(o, w, dir_fs, local_ranks);
  std::vector<BenchRow> rows;
  bool ok = true;
  for (std::size_t psi : o.params) {
    // Parameters and gradients per rank, master weights and two states
    // sharded, the raw buffer (the checkpoint's share), and load()'s reads.
    const double per_rank = 8.0 * double(psi) + 2.0 * 12.0 * double(psi) / w.size;
    if (available > 0 && per_rank * local_ranks > 0.9 * available) {
      if (w.rank == 0) {
        std::fprintf(o.json ? stderr : stdout,
                     "# skipping %s params: %d ranks here need about %.1f GiB, %.1f GiB "
                     "available\n",
                     human_count(psi).c_str(), local_ranks, per_rank * local_ranks / (1 << 30),
                     available / (1 << 30));
      }
      continue;
    }
    ok = guarded(w, "bench " + human_count(psi) + " params", [&] {
      Bench bench(comm, w, o, base);
      const BenchRow r = bench.run(psi);
      if (w.rank == 0) print_bench_row(o, r);
      rows.push_back(r);
    });
    if (!ok) break;
  }
  if (w.rank == 0) print_bench_goals(o, rows);
  return ok ? 0 : 1;
}

}  // namespace ckpt_tool
