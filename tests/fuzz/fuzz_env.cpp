// libFuzzer target of the SHARDOPT_* environment parser (tests/fuzz/run.sh
// --target env builds and runs it). The input is an environment, one
// NAME=VALUE per line (a value may hold any byte but a newline). Every
// variable the input sets is looked up through parse_settings' lookup, the
// way getenv would find it. The parser must either accept the environment,
// with every setting within its documented range, or throw ConfigError
// naming a SHARDOPT_* variable and what it accepts. Anything else (a crash,
// another exception, a sanitizer report, a setting out of range) is a bug.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "common/settings.hpp"
#include "shardopt/config.hpp"
#include "shardopt/error.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_env: invariant broken: %s\n", what);
  std::abort();
}

void check_ranges(const shardopt::Settings& s) {
  if (s.comm_max_chunk < 1 || s.comm_max_chunk > static_cast<std::size_t>(INT_MAX))
    fail("comm_max_chunk outside [1, INT_MAX]");
  if (!(s.bucket_mb > 0.0) || s.bucket_mb > 65536.0) fail("bucket_mb outside (0, 65536]");
  if (!(s.timeout >= 0.0) || s.timeout > 604800.0) fail("timeout outside [0, 604800]");
  if (s.check_sync < 0) fail("check_sync negative");
  const int level = static_cast<int>(s.debug);
  if (level < static_cast<int>(shardopt::LogLevel::none) ||
      level > static_cast<int>(shardopt::LogLevel::trace))
    fail("debug level out of range");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::map<std::string, std::string> env;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::size_t at = 0;
  while (at <= text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    const std::size_t eq = line.find('=');
    // getenv cannot return a value with a NUL in it: cut there.
    if (eq != std::string::npos && eq > 0) env[line.substr(0, eq)] = line.substr(eq + 1).c_str();
    at = end + 1;
  }
  try {
    const shardopt::Settings s = shardopt::detail::parse_settings([&](const char* name) {
      const auto it = env.find(name);
      return it == env.end() ? static_cast<const char*>(nullptr) : it->second.c_str();
    });
    check_ranges(s);
  } catch (const shardopt::ConfigError& e) {
    const std::string what = e.what();
    if (what.find("SHARDOPT_") == std::string::npos) fail("a ConfigError that names no variable");
    if (what.find("accepted") == std::string::npos && what.find("accept") == std::string::npos)
      fail("a ConfigError that does not say what is accepted");
  } catch (...) {
    fail("an exception other than ConfigError");
  }
  return 0;
}
