// shardopt tests: the simulated device (sim_device.hpp).
#include "simdevice/sim_device.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "comm/backend.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "common/check.hpp"
#include "shardopt/half.hpp"

namespace shardopt::sim {

namespace {

using detail::EventHandle;
using detail::MemoryKind;
using detail::MemoryLocation;
using detail::StreamHandle;

constexpr std::size_t kDeviceSpan = std::size_t(16) << 30;  // address space per device
constexpr std::size_t kAlign = 256;
constexpr std::size_t kDefaultDelayUs = 5;  // SHARDOPT_SIM_DELAY_US unset

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return static_cast<std::size_t>(std::strtoull(v, nullptr, 10));
}

// The calling thread's device, and whether the thread chose it: a thread
// that never did works on device 0, as CUDA's do (and makes a context
// there on a GPU).
thread_local int current = 0;
thread_local bool chosen = false;

// The rank's place on its node, as the launcher says (Open MPI, Slurm,
// MPICH/Hydra); 0 when none says.
std::size_t local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (const char* s = std::getenv(v); s != nullptr && *s != '\0')
      return static_cast<std::size_t>(std::strtoull(s, nullptr, 10));
  return 0;
}

// An event is its latest record (as CUDA's: waits and queries refer to the
// record made last before them, whichever stream completes first).
struct Record {
  bool done = false;  // under the event's mutex
};
struct Event {
  explicit Event(int d) : device(d) {}
  const int device;  // the device current when it was made
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<Record> latest;  // null: never recorded
};

class Stream {
 public:
  Stream(int device, unsigned max_delay_us, std::uint64_t seed)
      : device_(device), max_delay_(max_delay_us), rng_(seed) {
    worker_ = std::thread([this] { run(); });
  }
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  int device() const noexcept { return device_; }

  void enqueue(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
      ++enqueued_;
    }
    cv_.notify_all();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t ticket = enqueued_;
    done_cv_.wait(lock, [&] { return done_ >= ticket; });
  }

 private:
  // Holds the stream back for about `d`, yielding the core meanwhile:
  // a sleep of a few microseconds costs a context switch and the timer's
  // slack, ten times the delay asked for.
  static void delay(std::chrono::microseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
  }

  void run() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      if (max_delay_ > 0) delay(std::chrono::microseconds(rng_() % (max_delay_ + 1)));
      op();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++done_;
      }
      done_cv_.notify_all();
    }
  }

  int device_;
  unsigned max_delay_;
  std::mt19937_64 rng_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t enqueued_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

class SimDevice final : public detail::DeviceRuntime {
 public:
  SimDevice() {
    devices_ = static_cast<int>(std::clamp<std::size_t>(env_size("SHARDOPT_SIM_DEVICES", 1), 1, 8));
    // Delays by default: a run without them would let a missing wait pass.
    max_delay_ = static_cast<unsigned>(env_size("SHARDOPT_SIM_DELAY_US", kDefaultDelayUs));
    if (max_delay_ > 0) {
      seed_ = env_size("SHARDOPT_SIM_SEED", 0);
      if (seed_ == 0) seed_ = std::random_device{}() | 1u;
      std::fprintf(stderr,
                   "simulated device: random delays of up to %u us per operation, seed %llu "
                   "(SHARDOPT_SIM_SEED=%llu repeats them)\n",
                   max_delay_, static_cast<unsigned long long>(seed_),
                   static_cast<unsigned long long>(seed_));
    }
    const std::size_t span = kDeviceSpan * std::size_t(devices_);
    // The device addresses: reserved, never accessible. The worker's view:
    // the same span, readable and writable, at a fixed offset.
    void* dev =
        ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* alias = ::mmap(nullptr, span, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (dev == MAP_FAILED || alias == MAP_FAILED) {
      std::fprintf(stderr, "simulated device: cannot reserve %zu bytes of address space\n", span);
      std::abort();
    }
    base_ = static_cast<char*>(dev);
    alias_ = static_cast<char*>(alias);
    free_.resize(std::size_t(devices_));
    for (int d = 0; d < devices_; ++d) free_[std::size_t(d)][0] = kDeviceSpan;
    for (int d = 0; d < devices_; ++d) default_.push_back(new_stream(d));
    // SHARDOPT_SIM_DEVICE_PER_RANK=1: the process starts on its local
    // rank's device, as a job whose ranks each call cudaSetDevice(local
    // rank) first (this constructor runs on the main thread, before main).
    if (env_size("SHARDOPT_SIM_DEVICE_PER_RANK", 0) != 0) {
      current = static_cast<int>(local_rank() % std::size_t(devices_));
      chosen = true;
    }
  }

  const char* name() const noexcept override { return "simulated device"; }
  int device_count() const noexcept override { return devices_; }

  MemoryLocation locate(const void* p) const noexcept override {
    const auto* c = static_cast<const char*>(p);
    if (c < base_ || c >= base_ + kDeviceSpan * std::size_t(devices_)) return {};
    return {MemoryKind::device, static_cast<int>(std::size_t(c - base_) / kDeviceSpan)};
  }
  int current_device() const override { return current; }
  void set_current_device(int d) override {
    current = d;
    chosen = true;
  }

  void* allocate(std::size_t bytes, const char* what) override {
    raise_sticky();
    if (bytes == 0) return nullptr;
    const std::size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
    const int d = current;
    std::size_t off = 0;
    {
      std::lock_guard<std::mutex> lock(alloc_mu_);
      auto& fl = free_[std::size_t(d)];
      auto it = std::find_if(fl.begin(), fl.end(), [&](const auto& b) { return b.second >= size; });
      if (it == fl.end())
        detail::throw_error(ErrorCode::out_of_memory,
                            "cannot allocate " + std::to_string(bytes) +
                                " bytes of simulated device memory for " + what,
                            "the simulated device has " + std::to_string(kDeviceSpan) +
                                " bytes per device; free some",
                            __FILE__, __LINE__);
      off = it->first;
      const std::size_t left = it->second - size;
      fl.erase(it);
      if (left > 0) fl[off + size] = left;
      off += std::size_t(d) * kDeviceSpan;
      used_[off] = size;
    }
    std::memset(alias_ + off, 0xFF, size);  // what cudaMalloc leaves: not zeros
    return base_ + off;
  }

  void release(void* p) noexcept override {
    if (p == nullptr) return;
    synchronize_all();  // as cudaFree: the device is idle first
    std::lock_guard<std::mutex> lock(alloc_mu_);
    const std::size_t off = std::size_t(static_cast<char*>(p) - base_);
    const auto it = used_.find(off);
    if (it == used_.end()) {
      std::fprintf(stderr, "simulated device: release of %p, which is not an allocation\n", p);
      std::abort();
    }
    const std::size_t size = it->second;
    used_.erase(it);
    ::madvise(alias_ + off, size, MADV_DONTNEED);
    const std::size_t d = off / kDeviceSpan;
    auto& fl = free_[d];
    std::size_t lo = off - d * kDeviceSpan, len = size;
    auto next = fl.lower_bound(lo);
    if (next != fl.end() && next->first == lo + len) {
      len += next->second;
      next = fl.erase(next);
    }
    if (next != fl.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == lo) {
        lo = prev->first;
        len += prev->second;
        fl.erase(prev);
      }
    }
    fl[lo] = len;
  }

  void* allocate_pinned(std::size_t bytes, const char* what) override {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr)
      detail::throw_error(
          ErrorCode::out_of_memory,
          "cannot allocate " + std::to_string(bytes) + " bytes of pinned host memory for " + what,
          "free host memory", __FILE__, __LINE__);
    std::lock_guard<std::mutex> lock(alloc_mu_);
    pinned_[static_cast<char*>(p)] = bytes;
    return p;
  }
  void release_pinned(void* p) noexcept override {
    if (p == nullptr) return;
    synchronize_all();
    {
      std::lock_guard<std::mutex> lock(alloc_mu_);
      pinned_.erase(static_cast<char*>(p));
    }
    std::free(p);
  }

  StreamHandle create_stream() override { return new_stream(current); }
  void destroy_stream(StreamHandle s) noexcept override {
    if (s == nullptr) return;
    Stream* st = static_cast<Stream*>(s);
    st->synchronize();
    std::lock_guard<std::mutex> lock(streams_mu_);
    std::erase_if(streams_, [&](const std::unique_ptr<Stream>& x) { return x.get() == st; });
  }
  int stream_device(StreamHandle s) const override {
    return s == nullptr ? current : static_cast<Stream*>(s)->device();
  }
  void synchronize(StreamHandle s) override {
    stream(s).synchronize();
    raise_sticky();
  }

  // Events live on while queued operations use them, as CUDA's do after
  // cudaEventDestroy.
  EventHandle create_event() override {
    raise_sticky();
    auto ev = std::make_shared<Event>(current);
    std::lock_guard<std::mutex> lock(events_mu_);
    events_[ev.get()] = ev;
    return ev.get();
  }
  void destroy_event(EventHandle e) noexcept override {
    std::lock_guard<std::mutex> lock(events_mu_);
    events_.erase(static_cast<Event*>(e));
  }
  void record(EventHandle e, StreamHandle s) override {
    std::shared_ptr<Event> ev = event(e);
    auto r = std::make_shared<Record>();
    {
      std::lock_guard<std::mutex> lock(ev->mu);
      ev->latest = r;
    }
    stream(s).enqueue([ev, r] {
      {
        std::lock_guard<std::mutex> lock(ev->mu);
        r->done = true;
      }
      ev->cv.notify_all();
    });
  }
  void wait_event(StreamHandle s, EventHandle e) override {
    std::shared_ptr<Event> ev = event(e);
    std::shared_ptr<Record> r;
    {
      std::lock_guard<std::mutex> lock(ev->mu);
      r = ev->latest;
    }
    if (r == nullptr) return;  // never recorded: nothing to wait for
    stream(s).enqueue([ev, r] {
      std::unique_lock<std::mutex> lock(ev->mu);
      ev->cv.wait(lock, [&] { return r->done; });
    });
  }
  bool query(EventHandle e) override {
    std::shared_ptr<Event> ev = event(e);
    bool done;
    {
      std::lock_guard<std::mutex> lock(ev->mu);
      done = ev->latest == nullptr || ev->latest->done;
    }
    if (done) raise_sticky();
    return done;
  }
  void synchronize_event(EventHandle e) override {
    std::shared_ptr<Event> ev = event(e);
    std::unique_lock<std::mutex> lock(ev->mu);
    const std::shared_ptr<Record> r = ev->latest;
    if (r != nullptr) ev->cv.wait(lock, [&] { return r->done; });
    lock.unlock();
    raise_sticky();
  }

  void copy(void* dst, const void* src, std::size_t bytes, StreamHandle s) override {
    if (bytes == 0) return;
    check_range(dst, bytes, "copy destination");
    check_range(src, bytes, "copy source");
    Stream& st = stream(s);
    char* d = translate(dst);
    if (is_pageable(src)) {
      // CUDA takes a pageable source's bytes before the call returns.
      auto snapshot = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                          static_cast<const char*>(src) + bytes);
      st.enqueue([d, snapshot] { std::memcpy(d, snapshot->data(), snapshot->size()); });
    } else {
      const char* from = translate(src);
      st.enqueue([d, from, bytes] { std::memcpy(d, from, bytes); });
    }
    // A pageable destination: the copy is complete on return.
    if (is_pageable(dst)) st.synchronize();
  }
  void zero(void* dst, std::size_t bytes, StreamHandle s) override {
    if (bytes == 0) return;
    check_range(dst, bytes, "fill destination");
    char* d = translate(dst);
    stream(s).enqueue([d, bytes] { std::memset(d, 0, bytes); });
  }

  std::uint32_t* allocate_flags(std::size_t count) override {
    auto* f = static_cast<std::uint32_t*>(allocate_pinned(count * sizeof(std::uint32_t), "flags"));
    std::memset(f, 0, count * sizeof(std::uint32_t));
    return f;
  }
  void release_flags(std::uint32_t* flags) noexcept override { release_pinned(flags); }
  void wait_flag(StreamHandle s, const std::uint32_t* flag, std::uint32_t value) override {
    auto* f = const_cast<std::uint32_t*>(flag);
    stream(s).enqueue([f, value] {
      std::atomic_ref<std::uint32_t> a(*f);
      for (std::uint32_t v = a.load(std::memory_order_acquire); v < value;
           v = a.load(std::memory_order_acquire))
        a.wait(v, std::memory_order_acquire);
    });
  }
  void set_flag(std::uint32_t* flag, std::uint32_t value) noexcept override {
    std::atomic_ref<std::uint32_t> a(*flag);
    a.store(value, std::memory_order_release);
    a.notify_all();
  }

  bool has_collectives() const noexcept override { return true; }
  const char* collectives_name() const noexcept override { return "nccl (simulated)"; }
  std::unique_ptr<detail::DeviceCollectives> collectives(MPI_Comm comm,
                                                         std::size_t max_chunk) override;
  // Named as a GPU's are (the job is one host): ranks on the same device
  // number share it, and the device's own collectives refuse them, as
  // NCCL's do. SHARDOPT_SIM_NAMED_DEVICES=0 leaves the devices unnamed:
  // the simulated collectives take any number of ranks per device.
  std::string device_identity() const override {
    if (env_size("SHARDOPT_SIM_NAMED_DEVICES", 1) == 0) return {};
    return "simulated device " + std::to_string(current);
  }

  bool emulated() const noexcept override { return true; }
  // MPI reaches host memory of any kind itself.
  void* mpi_view(const void* p) const noexcept override { return translate(p); }
  void divide(void* buf, std::size_t count, DType t, int divisor, StreamHandle s) override {
    stream(s).enqueue([this, buf, count, t, divisor] {
      detail::divide_elements(reach(buf, "the division of avg"), count, t, divisor);
    });
  }
  void emulate(StreamHandle s, std::function<void(const detail::Translate&)> f) override {
    stream(s).enqueue([this, f = std::move(f)] {
      f([this](const void* p) -> void* { return reach(p, "a kernel"); });
    });
  }

  // What a kernel or collective running on the device reaches at p: device
  // memory through the worker's view, pinned host memory as it is (mapped
  // for the device). Pageable host memory a GPU cannot reach: the access is
  // an illegal address there, which poisons the context; here it sets the
  // same sticky error, and every later call of the runtime throws it.
  char* reach(const void* p, const char* who) {
    if (p != nullptr && is_pageable(p)) {
      std::lock_guard<std::mutex> lock(sticky_mu_);
      if (sticky_.empty()) {
        char where[32];
        std::snprintf(where, sizeof where, "%p", p);
        sticky_ = std::string(who) + " on the device was given pageable host memory (" + where +
                  "), which a GPU cannot reach: an illegal address there";
      }
    }
    return translate(p);
  }
  // Throws the sticky error, if a kernel or collective has set one: as on
  // a GPU after an illegal address, every later call fails with it.
  void raise_sticky() {
    std::string e;
    {
      std::lock_guard<std::mutex> lock(sticky_mu_);
      e = sticky_;
    }
    if (!e.empty())
      detail::throw_error(ErrorCode::cuda, "simulated device: " + e,
                          "pass device memory or pinned host memory (allocate_pinned) to work "
                          "that runs on the device; the device is unusable after this error, "
                          "as a GPU's context is",
                          __FILE__, __LINE__);
  }
  // Tests of the simulated device only: forgets the sticky error.
  void clear_sticky() {
    std::lock_guard<std::mutex> lock(sticky_mu_);
    sticky_.clear();
  }

  // The worker's view of p.
  char* translate(const void* p) const noexcept {
    const auto* c = static_cast<const char*>(p);
    if (c >= base_ && c < base_ + kDeviceSpan * std::size_t(devices_)) return alias_ + (c - base_);
    return const_cast<char*>(c);
  }
  // s (null: the calling thread's device's default stream), checked as a
  // GPU would need: the thread works on the stream's device.
  Stream& stream(StreamHandle s) {
    raise_sticky();
    if (s == nullptr) return *default_[std::size_t(current)];
    Stream& st = *static_cast<Stream*>(s);
    check_thread(st.device(), "a stream");
    return st;
  }
  std::uint64_t seed() const noexcept { return max_delay_ > 0 ? seed_ : 0; }

 private:
  std::shared_ptr<Event> event(EventHandle e) {
    std::shared_ptr<Event> ev;
    {
      std::lock_guard<std::mutex> lock(events_mu_);
      const auto it = events_.find(static_cast<Event*>(e));
      if (it == events_.end()) {
        std::fprintf(stderr, "simulated device: use of event %p, which does not exist\n", e);
        std::abort();
      }
      ev = it->second;
    }
    check_thread(ev->device, "an event");
    return ev;
  }
  // A thread that never chose its device works on device 0: on a node with
  // several GPUs, a helper thread (a progress thread, a worker) that forgot
  // to choose makes a context on GPU 0 and puts its work there. Here its
  // use of another device's stream or event is that error.
  static void check_thread(int device, const char* what) {
    if (chosen || device == 0) return;
    detail::throw_error(
        ErrorCode::cuda,
        std::string("simulated device: ") + what + " of device " + std::to_string(device) +
            " used by a thread that never chose its device (it works on device 0, and on a GPU "
            "makes a context there)",
        "call set_current_device (cudaSetDevice) in every thread that calls the device "
        "runtime, before its first call",
        __FILE__, __LINE__);
  }
  Stream* new_stream(int device) {
    std::lock_guard<std::mutex> lock(streams_mu_);
    const std::uint64_t seed = seed_ + 0x9E3779B97F4A7C15ull * (++stream_count_);
    streams_.push_back(std::make_unique<Stream>(device, max_delay_, seed));
    return streams_.back().get();
  }
  void synchronize_all() {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (const auto& s : streams_) s->synchronize();
  }
  bool is_pageable(const void* p) {
    if (locate(p).kind != MemoryKind::host) return false;
    std::lock_guard<std::mutex> lock(alloc_mu_);
    const auto* c = static_cast<const char*>(p);
    auto it = pinned_.upper_bound(c);
    if (it == pinned_.begin()) return true;
    --it;
    return c >= it->first + it->second;
  }
  // A device range must lie inside one allocation: a copy past its end is
  // what cudaMemcpyAsync rejects with an invalid-value error.
  void check_range(const void* p, std::size_t bytes, const char* which) {
    if (locate(p).kind != MemoryKind::device) return;
    std::lock_guard<std::mutex> lock(alloc_mu_);
    const std::size_t off = std::size_t(static_cast<const char*>(p) - base_);
    auto it = used_.upper_bound(off);
    if (it != used_.begin()) {
      --it;
      if (off + bytes <= it->first + it->second) return;
    }
    detail::throw_error(ErrorCode::cuda,
                        std::string("simulated device: ") + which + " [" + std::to_string(bytes) +
                            " bytes] is outside any allocation",
                        "pass device ranges inside the buffers allocated", __FILE__, __LINE__);
  }

  int devices_ = 1;
  unsigned max_delay_ = 0;
  std::mutex sticky_mu_;
  std::string sticky_;
  std::uint64_t seed_ = 1;
  char* base_ = nullptr;
  char* alias_ = nullptr;
  std::mutex alloc_mu_;
  std::vector<std::map<std::size_t, std::size_t>> free_;  // per device: offset -> bytes
  std::map<std::size_t, std::size_t> used_;               // offset -> bytes
  std::map<const char*, std::size_t> pinned_;
  std::mutex events_mu_;
  std::map<Event*, std::shared_ptr<Event>> events_;
  std::mutex streams_mu_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<Stream*> default_;
  std::uint64_t stream_count_ = 0;
};

// NCCL's shape on the simulated device: each collective is an operation of
// its stream, which runs it with MPI (the host backend, on a duplicate of
// the communicator) on the worker's view of the buffers, blocking the
// stream, not the host, until every rank's stream has reached it.
// fail_collective_after(): collectives still to enqueue before the one
// that fails; -1 for none.
std::atomic<int> collectives_to_fail_after{-1};

class SimCollectives final : public detail::DeviceCollectives {
 public:
  SimCollectives(SimDevice& d, MPI_Comm comm, std::size_t max_chunk)
      : d_(d), wire_(detail::make_mpi_host_backend(comm, max_chunk)) {
    // As NCCL's are aborted when the watchdog ends the process; here the
    // abort only says so.
    if (detail::watchdog_armed())
      detail::on_watchdog_exit(
          this, [] { std::fputs("simulated device: its collectives aborted\n", stderr); });
  }
  ~SimCollectives() override {
    detail::forget_watchdog_exit(this);
    std::unique_lock<std::mutex> lock(mu_);  // the streams hold `this` until then
    idle_.wait(lock, [&] { return pending_ == 0; });
  }

  const char* name() const noexcept override { return "nccl (simulated)"; }

  // avg as NCCL computes it for floating types (ncclAvg): each rank's
  // input multiplied by 1/n first, then summed, which is not bitwise the
  // host transports' sum-then-divide. shardopt never asks for it (it sums,
  // then divides on the stream); a caller that did would see NCCL's result.
  void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                 StreamHandle s) override {
    enqueue("allreduce", s, [=, this](SimDevice& d, detail::Backend& w) {
      std::vector<char> scaled;
      const void* in = premultiplied(d.reach(send, "a collective"), count, dtype, op, scaled);
      void* out = d.reach(recv, "a collective");
      if (!in_own_order(dtype, op)) {
        detail::complete_yielding(w.allreduce(in, out, count, dtype, op, false, nullptr));
        return;
      }
      // Every rank's input, then their sum in this collective's order.
      std::vector<char> all(std::size_t(w.size()) * count * dtype_size(dtype));
      detail::complete_yielding(w.allgather(in, all.data(), count, dtype, false, false, nullptr));
      sum_in_own_order(all.data(), count, 0, out, count, dtype);
    });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      StreamHandle s) override {
    const auto place = recv == block(send, count, dtype) ? detail::ScatterPlace::at_own_block
                                                         : detail::ScatterPlace::separate;
    enqueue("reduce_scatter", s, [=, this](SimDevice& d, detail::Backend& w) {
      std::vector<char> scaled;
      const std::size_t all_count = count * std::size_t(w.size());
      void* out = d.reach(recv, "a collective");
      const void* in = premultiplied(d.reach(send, "a collective"), all_count, dtype, op, scaled);
      if (!in_own_order(dtype, op)) {
        detail::complete_yielding(
            w.reduce_scatter(in, out, count, dtype, op, place, false, nullptr));
        return;
      }
      // Every rank's whole input, then the sum of this rank's blocks.
      std::vector<char> all(std::size_t(w.size()) * all_count * dtype_size(dtype));
      detail::complete_yielding(
          w.allgather(in, all.data(), all_count, dtype, false, false, nullptr));
      sum_in_own_order(all.data(), all_count, std::size_t(w.rank()) * count, out, count, dtype);
    });
  }
  void allgather(const void* send, void* recv, std::size_t count, DType dtype,
                 StreamHandle s) override {
    const bool in_place = send == block(recv, count, dtype);
    enqueue("allgather", s, [=](SimDevice& d, detail::Backend& w) {
      detail::complete_yielding(w.allgather(d.reach(send, "a collective"),
                                            d.reach(recv, "a collective"), count, dtype, in_place,
                                            false, nullptr));
    });
  }
  void broadcast(void* buf, std::size_t count, DType dtype, int root, StreamHandle s) override {
    enqueue("broadcast", s, [=](SimDevice& d, detail::Backend& w) {
      detail::complete_yielding(
          w.broadcast(d.reach(buf, "a collective"), count, dtype, root, false, nullptr));
    });
  }

  void check(const char* op) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) return;
    try {
      std::rethrow_exception(error_);
    } catch (const Error& e) {
      detail::throw_error(
          e.code(),
          std::string(op) + ": an earlier collective on device buffers failed: " + e.message(),
          "the communicator cannot be used for device buffers after such a "
          "failure: " +
              e.hint(),
          __FILE__, __LINE__);
    }
  }

  void free() noexcept override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      idle_.wait(lock, [&] { return pending_ == 0; });
    }
    try {
      wire_->free();
    } catch (...) {  // as ncclCommDestroy: nothing to report to
    }
  }

 private:
  // NCCL picks its own order of additions (rings, trees; by size and
  // topology), not the host transports'. So that no test relies on the
  // host's order where NCCL would not keep it, these collectives add
  // floating-point values in an order the host never uses: the last rank's
  // first, then each lower rank's. (avg: the inputs premultiplied, then
  // summed so.)
  static bool in_own_order(DType t, ReduceOp op) {
    return is_floating(t) && (op == ReduceOp::sum || op == ReduceOp::avg);
  }
  // out = the sum over ranks r = n-1 .. 0 of the `count` elements at
  // `first` of rank r's block of `per_rank` elements in `all`, each
  // addition the host's (MPI_Reduce_local with shardopt's operation).
  void sum_in_own_order(const char* all, std::size_t per_rank, std::size_t first, void* out,
                        std::size_t count, DType t) const {
    const int n = wire_->size();
    const std::size_t es = dtype_size(t);
    auto at = [&](int r) { return all + (std::size_t(r) * per_rank + first) * es; };
    std::memcpy(out, at(n - 1), count * es);
    constexpr std::size_t kMost = std::size_t(1) << 30;  // an MPI count
    for (int r = n - 2; r >= 0; --r)
      for (std::size_t done = 0; done < count; done += kMost)
        MPI_Reduce_local(at(r) + done * es, static_cast<char*>(out) + done * es,
                         static_cast<int>(std::min(kMost, count - done)), detail::mpi_datatype(t),
                         detail::mpi_op(t, ReduceOp::sum));
  }
  // For avg: n elements of `in` times 1/size() in `scaled`, rounded to the
  // dtype as NCCL's pre-multiplication rounds; for other ops `in` itself.
  const void* premultiplied(const void* in, std::size_t n, DType t, ReduceOp op,
                            std::vector<char>& scaled) const {
    if (op != ReduceOp::avg) return in;
    scaled.resize(n * dtype_size(t));
    const int size = wire_->size();
    auto each = [&](auto tag, auto scale) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(in);
      T* y = reinterpret_cast<T*>(scaled.data());
      for (std::size_t k = 0; k < n; ++k) {
        if constexpr (std::is_same_v<T, bfloat16>)
          y[k] = bf16_from_float(to_float(x[k]) * scale);
        else if constexpr (std::is_same_v<T, float16>)
          y[k] = f16_from_float(to_float(x[k]) * scale);
        else
          y[k] = static_cast<T>(x[k] * scale);
      }
    };
    switch (t) {
      case DType::f64:
        each(double{}, 1.0 / size);
        break;
      case DType::f32:
        each(float{}, 1.0f / static_cast<float>(size));
        break;
      case DType::bf16:
        each(bfloat16{}, 1.0f / static_cast<float>(size));
        break;
      case DType::f16:
        each(float16{}, 1.0f / static_cast<float>(size));
        break;
      default:
        return in;  // integers: avg of integers is refused before it gets here
    }
    return scaled.data();
  }

  const void* block(const void* p, std::size_t count, DType dtype) const {
    return static_cast<const char*>(p) + std::size_t(wire_->rank()) * count * dtype_size(dtype);
  }

  template <class F>
  void enqueue(const char* op, StreamHandle s, F f) {
    if (!threads_checked_) {
      int level = MPI_THREAD_SINGLE;
      MPI_Query_thread(&level);
      if (level < MPI_THREAD_MULTIPLE)
        detail::throw_error(ErrorCode::unsupported,
                            std::string(op) +
                                " on device buffers: the simulated device runs its collectives "
                                "on its stream threads, which needs MPI_THREAD_MULTIPLE",
                            "initialize MPI with MPI_THREAD_MULTIPLE, or use "
                            "SHARDOPT_DEVICE_COMM=staged",
                            __FILE__, __LINE__);
      threads_checked_ = true;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++pending_;
    }
    const bool inject =
        collectives_to_fail_after.load() >= 0 && collectives_to_fail_after.fetch_sub(1) == 0;
    d_.stream(s).enqueue([this, f, inject, op] {
      bool failed;
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed = static_cast<bool>(error_);
      }
      if (!failed) {
        try {
          if (inject)
            detail::throw_error(ErrorCode::nccl,
                                std::string("simulated failure of the device's ") + op,
                                "a device collective failed (simulated)", __FILE__, __LINE__);
          f(d_, *wire_);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu_);
          if (!error_) error_ = std::current_exception();
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) idle_.notify_all();
    });
  }

  SimDevice& d_;
  std::unique_ptr<detail::Backend> wire_;
  bool threads_checked_ = false;
  std::mutex mu_;
  std::condition_variable idle_;
  std::size_t pending_ = 0;
  std::exception_ptr error_;
};

std::unique_ptr<detail::DeviceCollectives> SimDevice::collectives(MPI_Comm comm,
                                                                  std::size_t max_chunk) {
  return std::make_unique<SimCollectives>(*this, comm, max_chunk);
}

// Never destroyed: streams may be in use until the process ends.
SimDevice& device() {
  static SimDevice* d = new SimDevice;
  return *d;
}

// SHARDOPT_SIM_DEVICES=0: this process has no device (a rank without one).
struct Installer {
  Installer() {
    if (env_size("SHARDOPT_SIM_DEVICES", 1) > 0) detail::install_device_runtime(&device());
  }
} installer;

}  // namespace

detail::DeviceRuntime& runtime() { return device(); }

void set_device(int d) {
  if (d < 0 || d >= device().device_count())
    detail::throw_error(ErrorCode::invalid_argument,
                        "set_device(" + std::to_string(d) + "): the simulated device has " +
                            std::to_string(device().device_count()) + " device(s)",
                        "set SHARDOPT_SIM_DEVICES", __FILE__, __LINE__);
  device().set_current_device(d);
}

std::uint64_t delay_seed() { return device().seed(); }

void fail_collective_after(int n) { collectives_to_fail_after = n; }

void clear_sticky_error() { device().clear_sticky(); }

}  // namespace shardopt::sim
