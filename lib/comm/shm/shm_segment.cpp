#include "comm/shm/shm_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "common/check.hpp"

namespace shardopt::detail {

namespace {

std::string mib(double bytes) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << bytes / (1024.0 * 1024.0) << " MiB";
  return s.str();
}

std::string free_space_note() {
  struct statvfs st {};
  if (statvfs(kShmDir, &st) != 0) return "";
  return " (" + mib(static_cast<double>(st.f_bavail) * st.f_frsize) + " free of " +
         mib(static_cast<double>(st.f_blocks) * st.f_frsize) + ")";
}

std::string fresh_name() {
  std::random_device rd;
  const unsigned long long token = (static_cast<unsigned long long>(rd()) << 32) ^ rd();
  char name[96];
  std::snprintf(name, sizeof name, "/%s%u-%ld-%016llx", kShmPrefix, static_cast<unsigned>(getuid()),
                static_cast<long>(getpid()), token);
  return name;
}

// Node rank 0: the segment, or "" and a reason in `error`.
std::string create_named(std::size_t bytes, int& fd, std::string& error) {
  remove_stale_segments();
  const std::string name = fresh_name();
  fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    error = "cannot create shared memory for the node's ranks in " + std::string(kShmDir) + ": " +
            std::strerror(errno);
    return "";
  }
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    error = "cannot reserve " + mib(static_cast<double>(bytes)) +
            " of shared memory for the node's ranks in " + kShmDir + free_space_note() + ": " +
            std::strerror(rc);
    close(fd);
    fd = -1;
    shm_unlink(name.c_str());
    return "";
  }
  return name;
}

}  // namespace

void remove_stale_segments() noexcept {
  DIR* dir = opendir(kShmDir);
  if (dir == nullptr) return;
  const std::string mine = std::string(kShmPrefix) + std::to_string(getuid()) + "-";
  while (const dirent* e = readdir(dir)) {
    const std::string n = e->d_name;
    if (n.compare(0, mine.size(), mine) != 0) continue;
    const long pid = std::strtol(n.c_str() + mine.size(), nullptr, 10);
    if (pid <= 0 || pid == getpid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or unknown)
    shm_unlink(("/" + n).c_str());
  }
  closedir(dir);
}

std::unique_ptr<NodeSegment> NodeSegment::create(MPI_Comm node_comm, std::size_t bytes,
                                                 std::string& error) {
  int node_rank = 0;
  SHARDOPT_CHECK_MPI(MPI_Comm_rank(node_comm, &node_rank), "querying the node rank");
  // Node rank 0 creates and sends the name, or its error, to the others.
  std::array<char, 1024> msg{};
  int fd = -1;
  std::string name;
  if (node_rank == 0) {
    name = create_named(bytes, fd, error);
    const std::string& text = name.empty() ? error : name;
    std::snprintf(msg.data(), msg.size(), "%c%s", name.empty() ? 'E' : 'N', text.c_str());
  }
  SHARDOPT_CHECK_MPI(MPI_Bcast(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, 0, node_comm),
                     "sending the shared memory's name to the node's ranks");
  if (node_rank != 0) {
    if (msg[0] == 'E') {
      error = "node rank 0: " + std::string(msg.data() + 1);
    } else {
      name = msg.data() + 1;
      fd = shm_open(name.c_str(), O_RDWR, 0);
      if (fd < 0)
        error = "cannot open the node's shared memory " + name + ": " + std::strerror(errno);
    }
  }
  void* p = MAP_FAILED;
  if (fd >= 0) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      error = "cannot map " + mib(static_cast<double>(bytes)) +
              " of the node's shared memory: " + std::strerror(errno);
    }
    close(fd);
  }
  // Every rank has mapped (or failed): the name can go.
  int failed = p == MAP_FAILED ? 1 : 0;
  SHARDOPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, node_comm),
                     "agreeing on the node's shared memory");
  if (node_rank == 0 && !name.empty()) shm_unlink(name.c_str());
  if (failed) {
    if (p != MAP_FAILED) munmap(p, bytes);
    if (error.empty()) error = "another rank of this node could not map the shared memory";
    return nullptr;
  }
  return std::unique_ptr<NodeSegment>(new NodeSegment(static_cast<std::byte*>(p), bytes));
}

NodeSegment::~NodeSegment() { munmap(data_, size_); }

}  // namespace shardopt::detail
