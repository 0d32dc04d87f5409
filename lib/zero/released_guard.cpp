// shardopt: stage 3's check of released units (lib/zero/released_guard.hpp).
#include "zero/released_guard.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>

#include "common/check.hpp"

namespace shardopt::detail {

namespace {

// The guards alive, for the handler; a fixed table, read without locks.
constexpr int kSlots = 64;
std::atomic<const ReleasedGuard*> g_guards[kSlots];
struct sigaction g_previous;
std::once_flag g_installed;

void on_segv(int sig, siginfo_t* info, void*) {
  for (auto& slot : g_guards) {
    const ReleasedGuard* g = slot.load(std::memory_order_acquire);
    if (g != nullptr && g->holds(info->si_addr)) {
      const char* m = g->message(info->si_addr);
      [[maybe_unused]] const ssize_t w = write(STDERR_FILENO, m, std::strlen(m));
      break;
    }
  }
  // The handler before ours takes the fault when the access runs again.
  sigaction(sig, &g_previous, nullptr);
}

void install() {
  struct sigaction a;
  std::memset(&a, 0, sizeof a);
  a.sa_sigaction = on_segv;
  a.sa_flags = SA_SIGINFO;
  sigemptyset(&a.sa_mask);
  sigaction(SIGSEGV, &a, &g_previous);
}

void protect(std::byte* p, std::size_t bytes, int prot) {
  if (bytes > 0 && mprotect(p, bytes, prot) != 0)
    throw_error(ErrorCode::internal,
                "stage 3's check of released units (SHARDOPT_CHECK_ARGS): mprotect failed: " +
                    std::string(std::strerror(errno)),
                "run without SHARDOPT_CHECK_ARGS, and report the failure", __FILE__, __LINE__);
}

}  // namespace

std::size_t ReleasedGuard::page() {
  static const std::size_t p = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

ReleasedGuard::ReleasedGuard(std::byte* base, std::size_t bytes,
                             std::vector<std::string> unit_names)
    : base_(base), bytes_(bytes), page_unit_(bytes / page(), -1) {
  for (const std::string& n : unit_names)
    messages_.push_back("shardopt: " + n +
                        " read or written after its release() (SHARDOPT_CHECK_ARGS makes a "
                        "released unit's memory inaccessible): gather() the unit again before "
                        "using it, and use the pointers data() returns after that gather\n");
  std::call_once(g_installed, install);
  for (int s = 0; s < kSlots && slot_ < 0; ++s) {
    const ReleasedGuard* none = nullptr;
    if (g_guards[s].compare_exchange_strong(none, this)) slot_ = s;
  }
  protect(base_, bytes_, PROT_NONE);
}

ReleasedGuard::~ReleasedGuard() {
  if (slot_ >= 0) g_guards[slot_].store(nullptr, std::memory_order_release);
  if (bytes_ > 0) mprotect(base_, bytes_, PROT_READ | PROT_WRITE);
}

void ReleasedGuard::open(std::size_t offset, std::size_t bytes) {
  protect(base_ + offset, bytes, PROT_READ | PROT_WRITE);
}

void ReleasedGuard::close(std::size_t offset, std::size_t bytes, std::size_t unit) {
  protect(base_ + offset, bytes, PROT_NONE);
  for (std::size_t p = offset / page(); p < (offset + bytes) / page(); ++p)
    page_unit_[p] = static_cast<std::int32_t>(unit);
}

bool ReleasedGuard::holds(const void* addr) const noexcept {
  const auto* a = static_cast<const std::byte*>(addr);
  return a >= base_ && a < base_ + bytes_;
}

const char* ReleasedGuard::message(const void* addr) const noexcept {
  const std::size_t p =
      static_cast<std::size_t>(static_cast<const std::byte*>(addr) - base_) / page();
  const std::int32_t u = page_unit_[p];
  return u >= 0 ? messages_[std::size_t(u)].c_str()
                : "shardopt: the pool of gathered units read or written where no unit was ever "
                  "gathered (SHARDOPT_CHECK_ARGS): use only the pointers data() returns, while "
                  "their unit is gathered\n";
}

}  // namespace shardopt::detail
