#include "comm/shm/shm_peer.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>

namespace shardopt::detail {

bool read_process(pid_t pid, std::vector<iovec>& local, std::vector<iovec>& remote) {
  for (std::size_t at = 0; at < local.size(); at += IOV_MAX) {
    const std::size_t n = std::min<std::size_t>(IOV_MAX, local.size() - at);
    std::size_t want = 0;
    for (std::size_t k = at; k < at + n; ++k) want += local[k].iov_len;
    const ssize_t got = process_vm_readv(pid, local.data() + at, n, remote.data() + at, n, 0);
    if (got < 0) return false;
    if (static_cast<std::size_t>(got) != want) {
      errno = EFAULT;
      return false;
    }
  }
  return true;
}

bool read_process(pid_t pid, void* local, const void* remote, std::size_t bytes) {
  if (bytes == 0) return true;
  const iovec l{local, bytes};
  const iovec r{const_cast<void*>(remote), bytes};
  const ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
  if (got < 0) return false;
  if (static_cast<std::size_t>(got) != bytes) {
    errno = EFAULT;
    return false;
  }
  return true;
}

}  // namespace shardopt::detail
