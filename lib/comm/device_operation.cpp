// shardopt: which memory a collective's buffers are in, for the backends
// that take device buffers (staged, native).
#include <string>

#include "comm/backend.hpp"
#include "common/check.hpp"

namespace shardopt::detail {

bool device_operation(DeviceRuntime* rt, const char* op, std::initializer_list<const void*> bufs,
                      std::size_t count, StreamHandle s) {
  if (count == 0 || rt == nullptr) return false;
  int device = -1;
  bool host = false;
  for (const void* p : bufs) {
    const MemoryLocation where = locate(p);
    if (where.kind == MemoryKind::device) {
      if (device >= 0 && where.device != device)
        throw_error(ErrorCode::wrong_device,
                    std::string(op) + ": the buffers are on devices " + std::to_string(device) +
                        " and " + std::to_string(where.device),
                    "pass buffers of one device, the one this rank works on", __FILE__, __LINE__);
      device = where.device;
    } else {
      host = true;
    }
  }
  if (device < 0) return false;
  if (host)
    throw_error(ErrorCode::wrong_device,
                std::string(op) + ": one buffer is in host memory and another in " +
                    location_name({MemoryKind::device, device}),
                "pass both buffers in one memory: copy the host data to the device first (or "
                "the device data to the host)",
                __FILE__, __LINE__);
  const int sd = rt->stream_device(s);
  if (sd != device)
    throw_error(ErrorCode::wrong_device,
                std::string(op) + ": the buffers are on device " + std::to_string(device) +
                    " but the stream (CommOptions::stream) belongs to device " + std::to_string(sd),
                "give the communicator a stream of the buffers' device (or none: the "
                "device's default stream)",
                __FILE__, __LINE__);
  return true;
}

}  // namespace shardopt::detail
