// shardopt: stage 3's check of released units (internal). Under
// SHARDOPT_CHECK_ARGS the host pages of a released unit are made
// inaccessible (mprotect), and a read or write of them ends the process
// with a message naming the unit, instead of reading whatever the pool
// holds there next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shardopt::detail {

class ReleasedGuard {
 public:
  // The page size offsets and sizes are aligned to.
  static std::size_t page();
  // Guards [base, base + bytes) (page-aligned), inaccessible at first;
  // unit_names[u] names unit u in the message.
  ReleasedGuard(std::byte* base, std::size_t bytes, std::vector<std::string> unit_names);
  ~ReleasedGuard();
  ReleasedGuard(const ReleasedGuard&) = delete;
  ReleasedGuard& operator=(const ReleasedGuard&) = delete;

  // Pages [offset, offset + bytes) usable, or inaccessible as released
  // unit `unit`'s.
  void open(std::size_t offset, std::size_t bytes);
  void close(std::size_t offset, std::size_t bytes, std::size_t unit);

  // For the signal handler: whether `addr` is guarded, and its message.
  bool holds(const void* addr) const noexcept;
  const char* message(const void* addr) const noexcept;

 private:
  std::byte* base_;
  std::size_t bytes_;
  std::vector<std::string> messages_;    // per unit
  std::vector<std::int32_t> page_unit_;  // per page: the unit released there last, or -1
  int slot_ = -1;
};

}  // namespace shardopt::detail
