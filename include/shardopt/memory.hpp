// shardopt: large host buffers, allocated once and reused.
//
// Page faults are expensive (on many clusters a first touch costs more than
// the data movement that follows, and it decides the NUMA placement). A
// HostBuffer maps its memory aligned to 2 MiB, asks the kernel for
// transparent huge pages (madvise MADV_HUGEPAGE, unless SHARDOPT_HUGE_PAGES=0)
// and touches every page at construction, from the calling thread, so later
// use pays no faults. Local; move-only.
#pragma once

#include <cstddef>

#include "shardopt/export.h"

namespace shardopt {

class SHARDOPT_API HostBuffer {
 public:
  HostBuffer() noexcept = default;
  // Allocates `bytes` (zero-filled). Throws Error(out_of_memory) on failure.
  explicit HostBuffer(std::size_t bytes);
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() noexcept { return data_; }
  const void* data() const noexcept { return data_; }
  template <class T>
  T* as() noexcept {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* as() const noexcept {
    return static_cast<const T*>(data_);
  }
  std::size_t size() const noexcept { return bytes_; }
  // True if the kernel was asked for huge pages for this buffer.
  bool huge_pages_requested() const noexcept { return huge_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t mapped_ = 0;
  bool huge_ = false;
};

}  // namespace shardopt
