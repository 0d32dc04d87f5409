// shardopt: the ZeRO engine's memory space (lib/zero/space.hpp).
#include "zero/space.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "build_config.hpp"
#include "kernels/finite.hpp"
#include "kernels/norm.hpp"
#include "zero/convert.hpp"

namespace shardopt::detail {

// lib/zero/space_cuda.cu; never called (so never needed) without CUDA.
namespace cuda_space {
void fill(float* dst, std::size_t n, float value, void* stream);
void convert(const void* src, DType st, void* dst, DType dt, std::size_t n, float mul,
             void* stream);
void accumulate(const void* src, DType st, float* acc, std::size_t n, void* stream);
}  // namespace cuda_space

SpaceBuffer& SpaceBuffer::operator=(SpaceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    host_ = std::move(o.host_);
    rt_ = std::exchange(o.rt_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void SpaceBuffer::release() noexcept {
  if (rt_ != nullptr && data_ != nullptr) rt_->release(data_);
  host_ = HostBuffer();
  rt_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

SpaceBuffer Space::allocate(std::size_t bytes, const char* what) const {
  SpaceBuffer b;
  if (bytes == 0) return b;
  if (!on_device()) {
    b.host_ = HostBuffer(bytes);
    b.data_ = b.host_.data();
  } else {
    b.data_ = rt_->allocate(bytes, what);
    b.rt_ = rt_;
    rt_->zero(b.data_, bytes, stream_);
  }
  b.bytes_ = bytes;
  return b;
}

void Space::copy(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0 || dst == src) return;
  if (!on_device())
    std::memcpy(dst, src, bytes);
  else
    rt_->copy(dst, src, bytes, stream_);
}

void Space::zero(void* dst, std::size_t bytes) const {
  if (bytes == 0) return;
  if (!on_device())
    std::memset(dst, 0, bytes);
  else
    rt_->zero(dst, bytes, stream_);
}

void Space::fill(float* dst, std::size_t n, float value) const {
  if (n == 0) return;
  if (!on_device()) {
    std::fill_n(dst, n, value);
    return;
  }
  launch_kernel(
      "the ZeRO engine", stream_, [&] { cuda_space::fill(dst, n, value, stream_); },
      [=](const Translate& tr) { std::fill_n(translated(dst, tr), n, value); });
}

void Space::convert(const void* src, DType st, void* dst, DType dt, std::size_t n,
                    float mul) const {
  if (n == 0) return;
  if (!on_device()) {
    detail::convert(static_cast<const std::byte*>(src), st, static_cast<std::byte*>(dst), dt, n,
                    mul);
    return;
  }
  if (st == dt && mul == 1.0f) return copy(dst, src, n * dtype_size(st));
  launch_kernel(
      "the ZeRO engine", stream_, [&] { cuda_space::convert(src, st, dst, dt, n, mul, stream_); },
      [=](const Translate& tr) {
        detail::convert(static_cast<const std::byte*>(tr(src)), st,
                        static_cast<std::byte*>(tr(dst)), dt, n, mul);
      });
}

void Space::accumulate(const void* src, DType st, float* acc, std::size_t n) const {
  if (n == 0) return;
  if (!on_device()) {
    detail::accumulate(static_cast<const std::byte*>(src), st, acc, n);
    return;
  }
  launch_kernel(
      "the ZeRO engine", stream_, [&] { cuda_space::accumulate(src, st, acc, n, stream_); },
      [=](const Translate& tr) {
        detail::accumulate(static_cast<const std::byte*>(tr(src)), st, translated(acc, tr), n);
      });
}

double Space::sum_squares(const void* x, DType type, std::size_t n) const {
  if (n == 0) return 0.0;
  if (!on_device()) return kernels::cpu::sum_squares(x, type, n);
  const WatchScope waiting = wait_scope();
  return device_kernel(
      "the gradient norm", stream_, [&] { return kernels::cuda::sum_squares(x, type, n, stream_); },
      [&](const Translate& tr) { return kernels::cpu::sum_squares(tr(x), type, n); });
}

kernels::LambNorms Space::lamb_direction(const kernels::LambBuffers& b,
                                         const kernels::LambScalars& s) const {
  if (!on_device()) return kernels::cpu::lamb_direction(b, s);
  const WatchScope waiting = wait_scope();
  return device_kernel(
      "LAMB", stream_, [&] { return kernels::cuda::lamb_direction(b, s, stream_); },
      [&](const Translate& tr) {
        return kernels::cpu::lamb_direction(translated_buffers(b, tr), s);
      });
}

void Space::lamb_apply(const kernels::LambApplyBuffers& a, float neg_step) const {
  if (!on_device()) return kernels::cpu::lamb_apply(a, neg_step);
  const WatchScope waiting = wait_scope();
  device_kernel(
      "LAMB", stream_, [&] { kernels::cuda::lamb_apply(a, neg_step, stream_); },
      [&](const Translate& tr) { kernels::cpu::lamb_apply(translated_buffers(a, tr), neg_step); });
}

bool Space::all_finite(const void* x, DType type, std::size_t n, float mul) const {
  if (n == 0) return true;
  if (!on_device()) return kernels::cpu::all_finite(x, type, n, mul);
  const WatchScope waiting = wait_scope();
  return device_kernel(
      "the check for non-finite gradients", stream_,
      [&] { return kernels::cuda::all_finite(x, type, n, mul, stream_); },
      [&](const Translate& tr) { return kernels::cpu::all_finite(tr(x), type, n, mul); });
}

void Space::flag_nonfinite(const void* x, DType type, std::size_t n, float mul,
                           std::uint32_t* flag) const {
  if (n == 0) return;
  if (!on_device()) {
    if (!kernels::cpu::all_finite(x, type, n, mul)) *flag = 1;
    return;
  }
  launch_kernel(
      "the check for non-finite gradients", stream_,
      [&] {
        kernels::cuda::flag_nonfinite(x, type, n, mul, reinterpret_cast<unsigned*>(flag), stream_);
      },
      [=](const Translate& tr) {
        if (!kernels::cpu::all_finite(tr(x), type, n, mul)) *translated(flag, tr) = 1;
      });
}

void Space::transfer(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0) return;
  if (!on_device()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const WatchScope waiting = wait_scope();
  rt_->copy(dst, src, bytes, stream_);
  rt_->synchronize(stream_);
}

void Space::synchronize() const {
  if (!on_device()) return;
  const WatchScope waiting = wait_scope();
  rt_->synchronize(stream_);
}

Space Space::device(int device, StreamHandle stream, int ranks) {
  return Space(*device_runtime(), stream, device, ranks);
}

int Space::device_of(StreamHandle stream) { return device_runtime()->stream_device(stream); }

SpaceEvent::~SpaceEvent() {
  if (e_ != nullptr) rt_->destroy_event(e_);
}

SpaceEvent Space::event() const {
  SpaceEvent e;
  if (!on_device()) return e;
  e.rt_ = rt_;
  e.e_ = rt_->create_event();
  return e;
}

void Space::order_after(StreamHandle producer, SpaceEvent& e) const {
  if (!on_device() || producer == stream_) return;
  if (!e) e = event();
  rt_->record(e.e_, producer);
  rt_->wait_event(stream_, e.e_);
}

int Space::stream_device(StreamHandle stream) const {
  return on_device() ? rt_->stream_device(stream) : -1;
}

HostWord Space::host_word(const char* what) const {
  HostWord w;
  w.space_ = this;
  w.word_ = static_cast<std::uint32_t*>(rt_->allocate_pinned(4, what));
  w.copied_ = event();
  return w;
}

HostWord::~HostWord() {
  if (word_ != nullptr) space_->rt_->release_pinned(word_);
}

void HostWord::fetch(const std::uint32_t* word) {
  space_->rt_->copy(word_, word, 4, space_->stream_);
  space_->rt_->record(copied_.e_, space_->stream_);
}

std::uint32_t HostWord::wait() {
  const WatchScope waiting = space_->wait_scope();
  space_->rt_->synchronize_event(copied_.e_);
  return *word_;
}

}  // namespace shardopt::detail
