// The simulated device itself (sim_device.hpp), one process, no MPI: what
// the device tests rely on it to catch. The host cannot touch device
// memory; streams run in order and asynchronously; events, stream waits and
// host flags order work across streams; copies from pageable host memory
// take their bytes at the call; fresh allocations are not zeros; a copy
// past an allocation's end is an error. Run with SHARDOPT_SIM_DELAY_US set,
// so that an ordering the simulation failed to keep shows as a wrong value.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/error.hpp"
#include "simdevice/sim_device.hpp"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

shardopt::detail::DeviceRuntime& rt() { return shardopt::sim::runtime(); }

// A host read of device memory must crash (in a child process).
void host_cannot_touch_device_memory() {
  auto* dev = static_cast<volatile int*>(rt().allocate(4096, "probe"));
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    struct sigaction sa {};
    sa.sa_handler = [](int) { _exit(57); };  // the crash we expect
    sigaction(SIGSEGV, &sa, nullptr);
    const int v = dev[0];
    std::printf("the host read device memory: %d\n", v);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  check((WIFEXITED(status) && WEXITSTATUS(status) == 57) ||
            (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV),
        "a host read of a device address faults");
  rt().release(const_cast<int*>(dev));
}

void streams_events_and_flags() {
  const std::size_t n = 1 << 16;
  std::vector<float> src(n), out(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f;
  auto* a = static_cast<float*>(rt().allocate(n * 4, "a"));
  auto* b = static_cast<float*>(rt().allocate(n * 4, "b"));
  // Fresh memory is not zeros (0xFF bytes, a NaN).
  rt().copy(out.data(), a, 4, nullptr);
  std::uint32_t bits = 0;
  std::memcpy(&bits, out.data(), 4);
  check(bits == 0xFFFFFFFFu, "a fresh allocation holds 0xFF bytes");

  void* s1 = rt().create_stream();
  void* s2 = rt().create_stream();
  void* e = rt().create_event();
  // A pageable source is taken at the call: overwriting it after does not
  // change what arrives.
  rt().copy(a, src.data(), n * 4, s1);
  std::vector<float> saved = src;
  std::fill(src.begin(), src.end(), -1.0f);
  rt().record(e, s1);
  rt().wait_event(s2, e);  // s2's copy must see s1's
  rt().copy(b, a, n * 4, s2);
  rt().copy(out.data(), b, n * 4, s2);  // pageable destination: complete on return
  check(out == saved, "event: a second stream sees the first one's copy");

  // A host flag: s1 waits on it; a host thread raises it later.
  std::uint32_t* flag = rt().allocate_flags(1);
  std::vector<float> ones(n, 1.0f);
  float* pinned = static_cast<float*>(rt().allocate_pinned(n * 4, "pinned"));
  std::memcpy(pinned, ones.data(), n * 4);
  rt().wait_flag(s1, flag, 3);
  rt().copy(a, pinned, n * 4, s1);
  rt().record(e, s1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  check(!rt().query(e), "a stream waiting on a host flag does not run past it");
  std::thread raiser([&] { rt().set_flag(flag, 3); });
  rt().synchronize_event(e);
  raiser.join();
  rt().copy(out.data(), a, n * 4, s1);
  check(out == ones, "the flag released the stream, and it ran what followed in order");

  // An event recorded on a slow stream, then again on a fast one: a wait
  // made between the two records waits for the first (the slow one), as
  // CUDA's does, even though the second completes first.
  {
    void* s3 = rt().create_stream();
    std::vector<float> twos(n, 2.0f);
    rt().emulate(s1, [](const shardopt::detail::Translate&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    });
    rt().copy(a, twos.data(), n * 4, s1);
    rt().record(e, s1);
    rt().wait_event(s3, e);
    rt().record(e, s2);  // s2 is idle: this record completes at once
    rt().copy(b, a, n * 4, s3);
    rt().copy(out.data(), b, n * 4, s3);
    check(out == twos, "a wait refers to the record made before it, not a later one");
    rt().destroy_stream(s3);
  }

  // A copy past an allocation's end is an error.
  bool threw = false;
  try {
    rt().copy(out.data(), a + 1, n * 4, s1);
  } catch (const shardopt::Error& err) {
    threw = std::strstr(err.what(), "outside any allocation") != nullptr;
  }
  check(threw, "a copy past an allocation's end throws");

  rt().release_pinned(pinned);
  rt().release_flags(flag);
  rt().destroy_event(e);
  rt().destroy_stream(s1);
  rt().destroy_stream(s2);
  rt().release(a);
  rt().release(b);
}

// What a GPU refuses, refused here too: a kernel that reaches pageable host
// memory (an illegal address on a GPU, a sticky error every later call
// returns), and a thread that never chose its device using another
// device's stream (on a GPU it works on, and makes a context on, device 0).
void what_a_gpu_refuses() {
  std::vector<float> pageable(64, 1.0f);
  float* pinned = static_cast<float*>(rt().allocate_pinned(64 * 4, "pinned"));
  void* s = rt().create_stream();
  float seen = 0.0f;
  pinned[0] = 2.0f;
  rt().emulate(s, [&](const shardopt::detail::Translate& tr) {
    seen = *shardopt::detail::translated(pinned, tr);  // pinned memory is mapped: fine
  });
  rt().synchronize(s);
  check(seen == 2.0f, "a kernel reaches pinned host memory");

  rt().emulate(s, [&](const shardopt::detail::Translate& tr) {
    seen = *shardopt::detail::translated(pageable.data(), tr);
  });
  bool threw = false;
  try {
    rt().synchronize(s);
  } catch (const shardopt::Error& err) {
    threw = err.code() == shardopt::ErrorCode::cuda &&
            std::strstr(err.what(), "pageable host memory") != nullptr;
  }
  check(threw, "a kernel given pageable host memory fails at the next synchronization");
  threw = false;
  try {
    rt().zero(pinned, 4, s);
  } catch (const shardopt::Error& err) {
    threw = std::strstr(err.what(), "pageable host memory") != nullptr;
  }
  check(threw, "the error is sticky: the next call fails with it too");
  shardopt::sim::clear_sticky_error();

  if (rt().device_count() >= 2) {
    shardopt::sim::set_device(1);
    void* on1 = rt().create_stream();
    shardopt::sim::set_device(0);
    std::string error;
    std::thread helper([&] {  // never chooses its device
      try {
        rt().zero(pinned, 4, on1);
      } catch (const shardopt::Error& err) {
        error = err.what();
      }
    });
    helper.join();
    check(error.find("never chose its device") != std::string::npos,
          "a thread that never chose its device cannot use device 1's stream");
    error.clear();
    std::thread chooser([&] {
      try {
        shardopt::sim::set_device(1);
        rt().zero(pinned, 4, on1);
        rt().synchronize(on1);
      } catch (const shardopt::Error& err) {
        error = err.what();
      }
    });
    chooser.join();
    if (!error.empty()) std::printf("  %s\n", error.c_str());
    check(error.empty(), "a thread that chose device 1 uses its stream");
    rt().destroy_stream(on1);
  } else {
    std::printf("skip: one device (SHARDOPT_SIM_DEVICES=2 checks the threads)\n");
  }
  rt().destroy_stream(s);
  rt().release_pinned(pinned);
}

}  // namespace

int main() {
  std::printf("simulated device: %d device(s), delay seed %llu\n", rt().device_count(),
              static_cast<unsigned long long>(shardopt::sim::delay_seed()));
  host_cannot_touch_device_memory();
  streams_events_and_flags();
  what_a_gpu_refuses();
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
