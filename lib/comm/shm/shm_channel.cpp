#include "comm/shm/shm_channel.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "comm/shm/shm_peer.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "kernels/reduce.hpp"

namespace shardopt::detail {

namespace {

constexpr std::size_t kPage = 4096;
// Allreduces up to this many bytes take one step (every rank reduces the
// whole chunk); larger ones two (each reduces its part, then all copy).
constexpr std::size_t kSmallAllreduce = 16384;
// Outputs of this many bytes and more are written past the caches: they
// would not stay there, and their lines need not be read before written.
constexpr std::size_t kStreamBytes = std::size_t{4} << 20;
// A single-copy reduction reads each other rank's data a tile at a time,
// one process_vm_readv each: tiles of every rank stay in the core's cache
// while they are summed, and each read is long enough that the call's own
// cost (about a microsecond) is small beside the copy.
constexpr std::size_t kTile = std::size_t{256} << 10;
// An allreduce takes the single copy from parts of this many times the
// threshold on: below it, in place, its two steps' waits and the copy of
// this rank's own part into its tile cost more than the slots
// (docs/benchmarks.md).
constexpr std::size_t kAllreduceFactor = 8;
// A single-copy reduce-scatter writes its result past the caches from this
// size on; an allreduce and this rank's own block of an allgather never
// (they were slower so at every size measured on a 2-core Xeon,
// docs/benchmarks.md).
constexpr std::size_t kSingleCopyStreamBytes = std::size_t{16} << 20;
// MPI's in-place reduce-scatter takes the single copy from blocks of this
// many times the threshold on (1 MiB by default: the lockstep in
// reduce_scatter; below, the slots are faster).
constexpr std::size_t kLockstepFactor = 64;

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

// How long a wait spins before it yields and sleeps: a few microseconds.
// Longer spins made the steps slower, not faster, on the 2-core virtual
// machines shardopt is measured on (a spinning rank takes from the one it
// waits for what the two share): 10 us made whole ZeRO steps bimodal (40
// or 63 ms), 200 us most collectives 2-3x slower (docs/benchmarks.md).
constexpr auto kSpin = std::chrono::microseconds(3);

// Whether counter value v has reached step s (steps wrap at 2^32).
bool reached(std::uint32_t v, std::uint32_t s) { return static_cast<std::int32_t>(v - s) >= 0; }

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Futexes on the shared segment (not FUTEX_PRIVATE: other processes wait
// on the same words).
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen) {
  const timespec ms{0, 1000000};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &ms, nullptr, 0);
}
void futex_wake(std::atomic<std::uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr,
          nullptr, 0);
}

}  // namespace

// The segment's first pages: one cache line per rank, so that a rank's
// announcements never share a line with another's.
struct NodeChannel::Control {
  struct alignas(64) Line {
    std::atomic<std::uint32_t> posted;    // the last step whose slot this rank has written
    std::atomic<std::uint32_t> consumed;  // the last step whose slots this rank has read
    std::atomic<std::int64_t> pid;        // to tell a rank that ended from a slow one
    // Single copy: the buffer this rank announced for the step in progress.
    std::atomic<std::uint64_t> addr;
    // The tiles of its block it has read from every other rank in the
    // step in progress (reset before it announces the step).
    std::atomic<std::uint32_t> progress;
    std::atomic<std::uint32_t> declined;  // the last step it declined
    // The last step at which one of its reads failed: which rank it read,
    // and errno.
    std::atomic<std::uint32_t> failed;
    std::atomic<std::int32_t> failed_peer, failed_errno;
  };
  struct alignas(64) Head {
    std::atomic<std::uint32_t> sleepers;  // ranks asleep on a futex of this segment
  };
  Head head;
  Line line[1];  // ranks_ of them

  static std::size_t bytes(int ranks) {
    return round_up(sizeof(Head) + sizeof(Line) * static_cast<std::size_t>(ranks), kPage);
  }
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

std::unique_ptr<NodeChannel> NodeChannel::create(MPI_Comm node_comm, std::size_t slot_bytes,
                                                 std::size_t single_copy_bytes,
                                                 std::string& error) {
  int rank = 0, ranks = 1;
  SHARDOPT_CHECK_MPI(MPI_Comm_rank(node_comm, &rank), "querying the node rank");
  SHARDOPT_CHECK_MPI(MPI_Comm_size(node_comm, &ranks), "querying the node's ranks");
  slot_bytes = round_up(std::max<std::size_t>(slot_bytes, kPage), kPage);
  const std::size_t bytes =
      Control::bytes(ranks) + slot_bytes * 2 * static_cast<std::size_t>(ranks);
  auto seg = NodeSegment::create(node_comm, bytes, error);
  if (!seg) return nullptr;
  std::unique_ptr<NodeChannel> ch(new NodeChannel(std::move(seg), rank, ranks, slot_bytes));
  if (single_copy_bytes == SIZE_MAX || ranks == 1) return ch;
  // Every rank has announced its pid and probe: each reads the others'.
  // One rank refused turns the single copy off on every rank.
  SHARDOPT_CHECK_MPI(MPI_Barrier(node_comm), "waiting for the node's ranks to map the segment");
  const std::string refused = ch->probe_peers();
  int first = refused.empty() ? ranks : rank;
  SHARDOPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, node_comm),
                     "agreeing on the single-copy collectives");
  if (first == ranks) {
    ch->single_copy_bytes_ = single_copy_bytes;
  } else if (rank == first) {
    // Once per process: every communicator of the job would say the same.
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      SHARDOPT_LOG(warn,
                   "shared-memory collectives: the single copy is off on this node: local rank "
                       << rank << ": " << refused
                       << "; large operations go through the slots (two copies; "
                          "SHARDOPT_SHM_SINGLE_COPY_KB=off says so quietly)");
    }
  }
  return ch;
}

std::string NodeChannel::probe_peers() const {
  for (int q = 0; q < ranks_; ++q) {
    if (q == rank_) continue;
    const auto& l = control_->line[q];
    const auto pid = static_cast<pid_t>(l.pid.load(std::memory_order_relaxed));
    std::int64_t seen = 0;
    if (!read_process(pid, &seen, reinterpret_cast<const void*>(l.addr.load()), sizeof seen))
      return "reading local rank " + std::to_string(q) +
             "'s memory (process_vm_readv): " + std::strerror(errno);
    if (seen != pid) return "local rank " + std::to_string(q) + "'s memory read back wrong";
  }
  return "";
}

NodeChannel::NodeChannel(std::unique_ptr<NodeSegment> seg, int rank, int ranks,
                         std::size_t slot_bytes)
    : seg_(std::move(seg)),
      control_(reinterpret_cast<Control*>(seg_->data())),
      slots_(seg_->data() + Control::bytes(ranks)),
      rank_(rank),
      ranks_(ranks),
      slot_bytes_(slot_bytes),
      probe_(getpid()),
      srcs_(static_cast<std::size_t>(ranks)) {
  // The segment starts zeroed (a fresh file): counters at step 0.
  control_->line[rank_].pid.store(probe_, std::memory_order_relaxed);
  control_->line[rank_].addr.store(reinterpret_cast<std::uintptr_t>(&probe_));
}

NodeChannel::~NodeChannel() = default;

std::size_t NodeChannel::pieces_of(int groups) const noexcept {
  return static_cast<std::size_t>(ranks_) * static_cast<std::size_t>(groups);
}

std::byte* NodeChannel::slot(int q, std::uint32_t step) const noexcept {
  return slots_ + (static_cast<std::size_t>(q) * 2 + (step & 1u)) * slot_bytes_;
}

void NodeChannel::post(bool posted, std::uint32_t step) noexcept {
  auto& l = control_->line[rank_];
  publish(posted ? l.posted : l.consumed, step);
}

void NodeChannel::publish(std::atomic<std::uint32_t>& word, std::uint32_t value) noexcept {
  word.store(value, std::memory_order_seq_cst);
  if (control_->head.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(&word);
}

void NodeChannel::wait_one(int q, bool posted, std::uint32_t step) {
  auto& l = control_->line[q];
  wait_word(q, posted ? l.posted : l.consumed, step);
}

void NodeChannel::wait_word(int q, std::atomic<std::uint32_t>& word, std::uint32_t step) {
  const auto& l = control_->line[q];
  if (reached(word.load(std::memory_order_acquire), step)) return;
  // Spin briefly (kSpin), yield the core a few times (ranks may outnumber
  // cores), then sleep on the word (woken by the rank that posts it).
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    cpu_relax();
    if (reached(word.load(std::memory_order_acquire), step)) return;
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > kSpin) break;
  }
  for (int i = 0; i < 16; ++i) {
    sched_yield();
    if (reached(word.load(std::memory_order_acquire), step)) return;
  }
  auto last_check = std::chrono::steady_clock::now();
  // One sleep on the word (at most 1 ms); whether the step is reached.
  auto attempt = [&] {
    if (stop_.load(std::memory_order_relaxed)) {
      SHARDOPT_THROW(mpi,
                     std::string(what_) + " through shared memory was stopped while rank " +
                         std::to_string(q) + " of this node had not reached it",
                     "an earlier error on this rank stopped the communicator; see it");
    }
    control_->head.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t v = word.load(std::memory_order_seq_cst);
    if (!reached(v, step)) futex_wait(&word, v);
    control_->head.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(word.load(std::memory_order_acquire), step)) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check > std::chrono::seconds(1)) {
      last_check = now;
      const auto pid = static_cast<pid_t>(l.pid.load(std::memory_order_relaxed));
      if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) peer_gone(q);
    }
    return false;
  };
  if (waiter_ != nullptr) {
    (*waiter_)(attempt);
    return;
  }
  while (!attempt()) {
  }
}

void NodeChannel::peer_gone(int q) const {
  SHARDOPT_THROW(mpi,
                 std::string(what_) + ": rank " + std::to_string(q) + " of this node (pid " +
                     std::to_string(control_->line[q].pid.load()) +
                     ") ended while the node's other ranks waited for it in shared memory",
                 "see that rank's own output for why it ended; the job cannot continue");
}

void NodeChannel::wait_all(bool posted, std::uint32_t step) {
  for (int q = 0; q < ranks_; ++q)
    if (q != rank_) wait_one(q, posted, step);
}

template <class Fill, class Use>
void NodeChannel::step(Fill&& fill, Use&& use) {
  const std::uint32_t s = ++step_;
  // The slot this step writes was last read at step s - 2.
  if (s > 2) wait_all(false, s - 2);
  fill(slot(rank_, s));
  post(true, s);
  wait_all(true, s);
  use([&](int q) -> const std::byte* { return slot(q, s); });
  post(false, s);
}

template <class Use>
bool NodeChannel::direct_step(const void* mine, Use&& use, bool decline) {
  const std::uint32_t s = ++step_;
  auto& me = control_->line[rank_];
  me.addr.store(reinterpret_cast<std::uintptr_t>(mine), std::memory_order_relaxed);
  me.progress.store(0, std::memory_order_relaxed);
  if (decline) me.declined.store(s, std::memory_order_relaxed);
  tiles_read_ = 0;
  post(true, s);
  wait_all(true, s);
  for (int q = 0; q < ranks_; ++q) {
    if (control_->line[q].declined.load(std::memory_order_relaxed) == s) {
      post(false, s);  // nothing of this rank's was read
      return false;
    }
  }
  read_failed_ = false;
  use([this](int q) {
    return reinterpret_cast<const std::byte*>(
        control_->line[q].addr.load(std::memory_order_relaxed));
  });
  if (read_failed_) control_->line[rank_].failed.store(s, std::memory_order_relaxed);
  post(false, s);
  wait_all(false, s);
  for (int q = 0; q < ranks_; ++q) {
    const auto& l = control_->line[q];
    if (l.failed.load(std::memory_order_relaxed) != s) continue;
    SHARDOPT_THROW(mpi,
                   std::string(what_) + " through shared memory: local rank " + std::to_string(q) +
                       " could not read local rank " + std::to_string(l.failed_peer.load()) +
                       "'s buffer (process_vm_readv): " + std::strerror(l.failed_errno.load()),
                   "a buffer given to the collective is not valid on that rank (freed, unmapped "
                   "or protected, or shorter than the count); pass buffers of the full size");
  }
  return true;
}

void NodeChannel::read_peer(int q, void* to, const std::byte* from, std::size_t bytes) {
  if (read_failed_) return;
  const auto pid = static_cast<pid_t>(control_->line[q].pid.load(std::memory_order_relaxed));
  if (read_process(pid, to, from, bytes)) return;
  auto& l = control_->line[rank_];
  l.failed_peer.store(q, std::memory_order_relaxed);
  l.failed_errno.store(errno, std::memory_order_relaxed);
  read_failed_ = true;
  publish(l.progress, INT32_MAX);  // a rank waiting for its reads goes on to the error
}

template <class Base>
void NodeChannel::reduce_direct(Base&& base, std::size_t at, const std::byte* own, std::byte* out,
                                std::size_t n, DType t, ReduceOp op, bool stream, int reader) {
  const std::size_t es = dtype_size(t);
  const std::size_t tile = kTile / es;
  // One tile per rank, and one for a result that waits for `reader`.
  if (tiles_.empty()) tiles_.resize(kTile * (static_cast<std::size_t>(ranks_) + 1));
  std::byte* mine = tiles_.data() + static_cast<std::size_t>(rank_) * kTile;
  std::byte* held = tiles_.data() + static_cast<std::size_t>(ranks_) * kTile;
  // reduce_arrays' output may not be one of its sources: this rank's own
  // data (NCCL's in-place form) goes through its tile too.
  const bool alias = own < out + n * es && out < own + n * es;
  // Other ranks' buffers in node shared memory are read where they are.
  direct_.assign(static_cast<std::size_t>(ranks_), nullptr);
  for (int q = 0; q < ranks_; ++q)
    if (q != rank_) direct_[std::size_t(q)] = mapped(q, base(q) + at, n * es);
  for (std::size_t off = 0; off < n; off += tile) {
    const std::size_t len = std::min(tile, n - off);
    for (int q = 0; q < ranks_; ++q) {
      std::byte* into = tiles_.data() + static_cast<std::size_t>(q) * kTile;
      if (q != rank_ && direct_[std::size_t(q)] != nullptr) {
        srcs_[q] = direct_[std::size_t(q)] + off * es;
      } else if (q != rank_) {
        read_peer(q, into, base(q) + at + off * es, len * es);
        srcs_[q] = into;
      } else if (alias) {
        std::memcpy(mine, own + off * es, len * es);
        srcs_[q] = mine;
      } else {
        srcs_[q] = own + off * es;
      }
    }
    if (read_failed_) return;  // its progress stays past the end (read_peer)
    // Progress is published once the tile is reduced: a source read in
    // place is read by the reduction itself.
    if (reader < 0) {
      kernels::cpu::reduce_arrays(t, op, srcs_.data(), ranks_, out + off * es, len,
                                  stream && !alias);
      publish(control_->line[rank_].progress, ++tiles_read_);
      continue;
    }
    // out is what `reader` reads of this rank's `in`: written once it has
    // read this tile (it reads its block a tile at a time, as this rank).
    kernels::cpu::reduce_arrays(t, op, srcs_.data(), ranks_, held, len);
    publish(control_->line[rank_].progress, ++tiles_read_);
    wait_word(reader, control_->line[reader].progress, static_cast<std::uint32_t>(off / tile + 1));
    kernels::cpu::copy_bytes(out + off * es, held, len * es, stream);
  }
}

void NodeChannel::map_shared(const std::byte* local, std::size_t bytes,
                             std::vector<std::uintptr_t> bases) {
  const std::lock_guard lock(windows_mutex_);
  windows_.push_back(Window{local, bytes, std::move(bases)});
}

void NodeChannel::forget_shared(const std::byte* local) noexcept {
  const std::lock_guard lock(windows_mutex_);
  std::erase_if(windows_, [&](const Window& w) { return w.local == local; });
}

const std::byte* NodeChannel::mapped(int q, const std::byte* from, std::size_t bytes) const {
  const std::lock_guard lock(windows_mutex_);
  const auto at = reinterpret_cast<std::uintptr_t>(from);
  for (const Window& w : windows_) {
    const std::uintptr_t b = w.bases[std::size_t(q)];
    if (at >= b && at - b <= w.bytes && bytes <= w.bytes - (at - b)) return w.local + (at - b);
  }
  return nullptr;
}

void NodeChannel::reduce_scatter(const void* in, void* out, std::size_t n, DType t, ReduceOp op,
                                 int groups, std::span<const int> blocks) {
  const std::size_t es = dtype_size(t);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  const std::size_t pieces = pieces_of(groups);
  if (n * es >= single_copy_bytes_) {
    const bool stream = n * groups * es >= kSingleCopyStreamBytes;
    // In MPI's in-place form (groups 1), out is block 0 of in, which the
    // rank whose block that is reads: this rank writes each tile of its
    // result once that rank has read it. That lockstep costs more than the
    // slots below blocks of kLockstepFactor x the threshold: such a rank
    // declines, and every rank takes the slots.
    int reader = -1;
    if (groups == 1 && dst != src + blocks[rank_] * n * es && dst < src + pieces * n * es &&
        src < dst + n * es) {
      for (int q = 0; q < ranks_; ++q)
        if (src + blocks[q] * n * es == dst) reader = q;
    }
    const bool done = direct_step(
        in,
        [&](auto&& base) {
          for (int g = 0; g < groups; ++g) {
            const std::size_t at = blocks[static_cast<std::size_t>(rank_) * groups + g] * n * es;
            reduce_direct(base, at, src + at, dst + g * n * es, n, t, op, stream, reader);
          }
        },
        reader >= 0 && n * es < single_copy_bytes_ * kLockstepFactor);
    if (done) return;
  }
  // Elements per block per step: a whole number of cache lines.
  const std::size_t line = 64 / es;
  const std::size_t chunk = std::max(line, slot_bytes_ / (pieces * es) / line * line);
  const bool stream = n * groups * es >= kStreamBytes;
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t len = std::min(chunk, n - off);
    step(
        [&](std::byte* mine) {
          for (std::size_t p = 0; p < pieces; ++p)
            std::memcpy(mine + p * len * es, src + (blocks[p] * n + off) * es, len * es);
        },
        [&](auto&& slot_of) {
          for (int g = 0; g < groups; ++g) {
            const std::size_t p = static_cast<std::size_t>(rank_) * groups + g;
            for (int q = 0; q < ranks_; ++q) srcs_[q] = slot_of(q) + p * len * es;
            kernels::cpu::reduce_arrays(t, op, srcs_.data(), ranks_, dst + (g * n + off) * es, len,
                                        stream);
          }
        });
  }
}

void NodeChannel::allgather(const void* in, void* out, std::size_t n, DType t, int groups,
                            std::span<const int> blocks) {
  const std::size_t es = dtype_size(t);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  const bool stream = (pieces_of(groups) - 1) * n * es >= kStreamBytes;
  if (n * es >= single_copy_bytes_) {
    direct_step(in, [&](auto&& base) {
      for (int q = 0; q < ranks_; ++q) {
        for (int g = 0; g < groups; ++g) {
          std::byte* to = dst + blocks[static_cast<std::size_t>(q) * groups + g] * n * es;
          if (q == rank_) {
            if (to != src + g * n * es)
              kernels::cpu::copy_bytes(to, src + g * n * es, n * es, false);
          } else if (const std::byte* at = mapped(q, base(q) + g * n * es, n * es)) {
            kernels::cpu::copy_bytes(to, at, n * es, false);
          } else {
            read_peer(q, to, base(q) + g * n * es, n * es);
          }
        }
      }
    });
    return;
  }
  const std::size_t chunk = std::max<std::size_t>(1, slot_bytes_ / (groups * es));
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t len = std::min(chunk, n - off);
    step(
        [&](std::byte* mine) {
          for (int g = 0; g < groups; ++g)
            std::memcpy(mine + g * len * es, src + (g * n + off) * es, len * es);
        },
        [&](auto&& slot_of) {
          for (int q = 0; q < ranks_; ++q) {
            for (int g = 0; g < groups; ++g) {
              std::byte* to =
                  dst + (blocks[static_cast<std::size_t>(q) * groups + g] * n + off) * es;
              const std::byte* from = slot_of(q) + g * len * es;
              if (to != src + (g * n + off) * es)
                kernels::cpu::copy_bytes(to, from, len * es, stream);
            }
          }
        });
  }
}

void NodeChannel::allreduce(const void* in, void* out, std::size_t n, DType t, ReduceOp op) {
  const std::size_t es = dtype_size(t);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  const std::size_t chunk = slot_bytes_ / es;
  if (ranks_ == 1 || n * es <= kSmallAllreduce) {
    // One step per chunk: every rank reduces all of it.
    for (std::size_t off = 0; off < n; off += chunk) {
      const std::size_t len = std::min(chunk, n - off);
      step([&](std::byte* mine) { std::memcpy(mine, src + off * es, len * es); },
           [&](auto&& slot_of) {
             for (int q = 0; q < ranks_; ++q) srcs_[q] = slot_of(q);
             kernels::cpu::reduce_arrays(t, op, srcs_.data(), ranks_, dst + off * es, len);
           });
    }
    return;
  }
  const std::size_t line = 64 / es;
  const bool stream = n * es >= kStreamBytes;
  if (single_copy() && n * es / ranks_ >= single_copy_bytes_ * kAllreduceFactor) {
    // Each rank reduces its part of every rank's `in`, in the same order
    // as reduce_scatter, then reads the others' parts of their `out`.
    auto part = [&](int q) {
      return std::min(n, (n * static_cast<std::size_t>(q) / ranks_ + line - 1) / line * line);
    };
    const std::size_t lo = part(rank_), hi = part(rank_ + 1);
    direct_step(in, [&](auto&& base) {
      reduce_direct(base, lo * es, src + lo * es, dst + lo * es, hi - lo, t, op, false);
    });
    direct_step(out, [&](auto&& base) {
      for (int q = 0; q < ranks_; ++q) {
        if (q == rank_) continue;
        const std::size_t a = part(q), b = part(q + 1);
        read_peer(q, dst + a * es, base(q) + a * es, (b - a) * es);
      }
    });
    return;
  }
  // Two steps per chunk: each rank reduces its part of the chunk, in the
  // same order as reduce_scatter, then every rank copies the others' parts.
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t len = std::min(chunk, n - off);
    auto part = [&](int q) {
      return std::min(len, (len * static_cast<std::size_t>(q) / ranks_ + line - 1) / line * line);
    };
    const std::size_t lo = part(rank_), hi = part(rank_ + 1);
    step([&](std::byte* mine) { std::memcpy(mine, src + off * es, len * es); },
         [&](auto&& slot_of) {
           for (int q = 0; q < ranks_; ++q) srcs_[q] = slot_of(q) + lo * es;
           kernels::cpu::reduce_arrays(t, op, srcs_.data(), ranks_, dst + (off + lo) * es, hi - lo);
         });
    step(
        [&](std::byte* mine) {
          std::memcpy(mine + lo * es, dst + (off + lo) * es, (hi - lo) * es);
        },
        [&](auto&& slot_of) {
          for (int q = 0; q < ranks_; ++q) {
            if (q == rank_) continue;
            const std::size_t a = part(q), b = part(q + 1);
            kernels::cpu::copy_bytes(dst + (off + a) * es, slot_of(q) + a * es, (b - a) * es,
                                     stream);
          }
        });
  }
}

void NodeChannel::broadcast(void* buf, std::size_t bytes, int root) {
  auto* b = static_cast<std::byte*>(buf);
  const bool stream = bytes >= kStreamBytes;
  if (bytes >= single_copy_bytes_ && ranks_ > 1) {
    direct_step(buf, [&](auto&& base) {
      if (rank_ != root) read_peer(root, b, base(root), bytes);
    });
    return;
  }
  for (std::size_t off = 0; off < bytes; off += slot_bytes_) {
    const std::size_t len = std::min(slot_bytes_, bytes - off);
    step(
        [&](std::byte* mine) {
          if (rank_ == root) std::memcpy(mine, b + off, len);
        },
        [&](auto&& slot_of) {
          if (rank_ != root) kernels::cpu::copy_bytes(b + off, slot_of(root), len, stream);
        });
  }
}

void NodeChannel::barrier() {
  step([](std::byte*) {}, [](auto&&) {});
}

}  // namespace shardopt::detail
