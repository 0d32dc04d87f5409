// shardopt internal: reading another process's memory on the same node
// (Linux cross-memory attach, process_vm_readv): one copy, made by the
// kernel, from the other process's pages into this one's. Used by the
// shared-memory collectives' single-copy path and by ZeRO's fused update on
// the user's gradient buffers. The kernel allows it where this process
// could ptrace the other (same user; Yama's ptrace_scope 0, or a process
// that made this one its tracer; both dumpable, or CAP_SYS_PTRACE) and no
// seccomp filter forbids the call.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <vector>

namespace shardopt::detail {

// Reads the (local[k], remote[k]) pairs of process `pid`'s memory, all of
// them; false with errno set if any byte could not be read (a short read
// sets EFAULT).
bool read_process(pid_t pid, std::vector<iovec>& local, std::vector<iovec>& remote);

// The same for one range.
bool read_process(pid_t pid, void* local, const void* remote, std::size_t bytes);

}  // namespace shardopt::detail
