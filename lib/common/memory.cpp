#include "shardopt/memory.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/check.hpp"
#include "common/log.hpp"

namespace shardopt {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kPage = 4096;
}  // namespace

HostBuffer::HostBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  const bool huge = settings().huge_pages;
  const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Map one extra huge page so the buffer can start on a 2 MiB boundary,
  // then give back the unaligned head and the unused tail.
  const std::size_t span = rounded + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    SHARDOPT_THROW(
        out_of_memory,
        "HostBuffer: cannot map " + std::to_string(bytes) + " bytes: " + std::strerror(errno),
        "reduce the problem size per rank, use more ranks, or raise the job's memory "
        "limit (ulimit -v, the Slurm --mem option)");
  }
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  const std::size_t head = aligned - base;
  const std::size_t tail = span - head - rounded;
  if (head) munmap(raw, head);
  if (tail) munmap(reinterpret_cast<void*>(aligned + rounded), tail);
  data_ = reinterpret_cast<void*>(aligned);
  bytes_ = bytes;
  mapped_ = rounded;
  if (huge) {
    huge_ = madvise(data_, mapped_, MADV_HUGEPAGE) == 0;
    if (!huge_) SHARDOPT_LOG(info, "madvise(MADV_HUGEPAGE) refused: " << std::strerror(errno));
  }
  // Touch every page now, so later use pays no page faults.
  auto* p = static_cast<volatile unsigned char*>(data_);
  for (std::size_t off = 0; off < mapped_; off += kPage) p[off] = 0;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      huge_(std::exchange(other.huge_, false)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    huge_ = std::exchange(other.huge_, false);
  }
  return *this;
}

HostBuffer::~HostBuffer() { release(); }

void HostBuffer::release() noexcept {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  bytes_ = mapped_ = 0;
  huge_ = false;
}

}  // namespace shardopt
