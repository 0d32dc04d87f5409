// shardopt internal: how the caller numbers parameters and groups.
#include "common/language.hpp"

#include <atomic>

namespace shardopt::detail {
namespace {
std::atomic<int> base{0};
}  // namespace

int index_base() noexcept { return base.load(std::memory_order_relaxed); }
void set_index_base(int b) noexcept { base.store(b, std::memory_order_relaxed); }

std::string index_text(long long i) { return std::to_string(i + index_base()); }

}  // namespace shardopt::detail
