// shardopt apps: facts about the machine a program runs on, read from /proc
// (Linux), for the headers of the benchmarks and their checks.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace machine {

// MemAvailable of /proc/meminfo in bytes; 0 if unknown.
inline std::size_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::size_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// The first "model name" of /proc/cpuinfo; "unknown CPU" if there is none.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("model name")) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

// CPU seconds this process has used (user + system), and the seconds all
// the machine's CPUs have been busy (/proc/stat: user, nice, system, irq,
// softirq). Two samples with the wall time between them give the share of
// the CPUs that other processes used. ok is false when /proc/stat could not
// be read (busy_s is then 0 or incomplete).
struct CpuTimes {
  double self_s = 0, busy_s = 0;
  bool ok = false;
};

inline CpuTimes cpu_times() {
  CpuTimes t;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  t.self_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  std::ifstream in("/proc/stat");
  std::string cpu;
  std::uint64_t v[8] = {};
  if (!(in >> cpu) || cpu != "cpu") return t;
  for (auto& x : v) in >> x;  // user nice system idle iowait irq softirq steal
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  t.busy_s = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6]) / hz;
  t.ok = static_cast<bool>(in);
  return t;
}

// After a benchmark's table: when `busy` of its `rows` rows ran while other
// processes used more than `fraction` of the CPUs, a line saying so, how
// they are `marked` and that `whose` times they are not.
inline void print_busy_rows(FILE* f, std::size_t busy, std::size_t rows, double fraction,
                            const char* marked, const char* whose) {
  if (busy == 0) return;
  std::fprintf(f,
               "# %zu of %zu rows ran while other processes used more than %.0f%% of the CPUs"
               " (%s): their times are not %s; rerun them on a quiet machine\n",
               busy, rows, 100 * fraction, marked, whose);
}

}  // namespace machine
