// shardopt: device memory for programs without the CUDA headers
// (include/shardopt/device.hpp), on the process's device runtime.
#include <string>
#include <utility>

#include "common/check.hpp"
#include "device/device_runtime.hpp"
#include "shardopt/device.hpp"

namespace shardopt {

namespace {
detail::DeviceRuntime& runtime(const char* what) {
  detail::DeviceRuntime* rt = detail::device_runtime();
  if (rt == nullptr)
    detail::throw_error(ErrorCode::wrong_device,
                        std::string(what) + ": this process sees no device",
                        "run on a node with a GPU (and a shardopt built with CUDA), or use host "
                        "memory",
                        __FILE__, __LINE__);
  return *rt;
}
}  // namespace

int device_count() noexcept {
  const detail::DeviceRuntime* rt = detail::device_runtime();
  return rt == nullptr ? 0 : rt->device_count();
}

const char* device_runtime_name() noexcept {
  const detail::DeviceRuntime* rt = detail::device_runtime();
  return rt == nullptr ? "none" : rt->name();
}

void set_device(int device) {
  detail::DeviceRuntime& rt = runtime("set_device");
  if (device < 0 || device >= rt.device_count())
    detail::throw_error(ErrorCode::invalid_argument,
                        "set_device(" + std::to_string(device) + "): this process sees " +
                            std::to_string(rt.device_count()) + " device(s), numbered from 0",
                        "pass a number from 0 to device_count() - 1 (CUDA_VISIBLE_DEVICES "
                        "decides which devices a process sees)",
                        __FILE__, __LINE__);
  rt.set_current_device(device);
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  data_ = runtime("DeviceBuffer").allocate(bytes, "a DeviceBuffer");
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) detail::device_runtime()->release(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) detail::device_runtime()->release(data_);
}

PinnedBuffer::PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
  data_ = runtime("PinnedBuffer").allocate_pinned(bytes, "a PinnedBuffer");
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) detail::device_runtime()->release_pinned(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) detail::device_runtime()->release_pinned(data_);
}

void device_copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  detail::DeviceRuntime& rt = runtime("device_copy");
  rt.copy(dst, src, bytes, nullptr);
  rt.synchronize(nullptr);
}

}  // namespace shardopt
