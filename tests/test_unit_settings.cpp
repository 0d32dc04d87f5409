// SHARDOPT_* parsing: defaults, accepted values, and the error for each bad value.
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "common/settings.hpp"
#include "shardopt/error.hpp"

using shardopt::ConfigError;
using shardopt::LogLevel;
using shardopt::Settings;

namespace {

Settings parse(const std::map<std::string, std::string>& env) {
  return shardopt::detail::parse_settings([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// Parses `env`, expects a ConfigError whose message names `var` and `accepted`.
bool rejects(const std::string& var, const std::string& value, const std::string& accepted) {
  try {
    parse({{var, value}});
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    return e.code() == shardopt::ErrorCode::invalid_config && what.find(var) != std::string::npos &&
           what.find("'" + value + "'") != std::string::npos &&
           what.find(accepted) != std::string::npos && !e.hint().empty();
  }
  return false;
}

}  // namespace

TEST_CASE("settings: defaults when nothing is set", "[settings]") {
  const Settings s = parse({});
  CHECK(s.debug == LogLevel::warn);
  CHECK(s.debug_file.empty());
  CHECK(s.huge_pages);
  CHECK(s.comm_max_chunk == 2147483647u);
  CHECK_FALSE(s.check_args);
  CHECK(s.bucket_mb == 25.0);
  CHECK(parse({{"SHARDOPT_DEBUG", ""}}).debug == LogLevel::warn);  // empty = default
}

TEST_CASE("settings: accepted values", "[settings]") {
  CHECK(parse({{"SHARDOPT_DEBUG", "none"}}).debug == LogLevel::none);
  CHECK(parse({{"SHARDOPT_DEBUG", "Info"}}).debug == LogLevel::info);
  CHECK(parse({{"SHARDOPT_DEBUG", "TRACE"}}).debug == LogLevel::trace);
  CHECK(parse({{"SHARDOPT_DEBUG_FILE", "/tmp/so.%h.%p.log"}}).debug_file == "/tmp/so.%h.%p.log");
  CHECK_FALSE(parse({{"SHARDOPT_HUGE_PAGES", "0"}}).huge_pages);
  CHECK_FALSE(parse({{"SHARDOPT_HUGE_PAGES", "off"}}).huge_pages);
  CHECK(parse({{"SHARDOPT_HUGE_PAGES", "yes"}}).huge_pages);
  CHECK(parse({{"SHARDOPT_COMM_MAX_CHUNK", "1"}}).comm_max_chunk == 1u);
  CHECK(parse({}).staged_chunk_kb == 4096u);
  CHECK(parse({{"SHARDOPT_STAGED_CHUNK_KB", "4"}}).staged_chunk_kb == 4u);
  CHECK(parse({{"SHARDOPT_STAGED_CHUNK_KB", "1048576"}}).staged_chunk_kb == 1048576u);
  CHECK(parse({{"SHARDOPT_CHECK_ARGS", "1"}}).check_args);
  CHECK_FALSE(parse({{"SHARDOPT_CHECK_ARGS", "off"}}).check_args);
  CHECK(parse({{"SHARDOPT_COMM_MAX_CHUNK", "2147483647"}}).comm_max_chunk == 2147483647u);
  CHECK(parse({{"SHARDOPT_BUCKET_MB", "0.5"}}).bucket_mb == 0.5);
  CHECK(parse({{"SHARDOPT_BUCKET_MB", "100"}}).bucket_mb == 100.0);
  CHECK(parse({}).check_sync == 0);
  CHECK(parse({{"SHARDOPT_CHECK_SYNC", "0"}}).check_sync == 0);
  CHECK(parse({{"SHARDOPT_CHECK_SYNC", "100"}}).check_sync == 100);
  CHECK(parse({}).timeout == 600.0);  // armed by default
  CHECK_FALSE(parse({}).desync_check);
  CHECK(parse({}).stats_every == 100);
  CHECK(parse({{"SHARDOPT_STATS_EVERY", "0"}}).stats_every == 0);
  CHECK(parse({{"SHARDOPT_STATS_EVERY", "25"}}).stats_every == 25);
  CHECK(parse({{"SHARDOPT_DESYNC_CHECK", "1"}}).desync_check);
  CHECK_FALSE(parse({{"SHARDOPT_DESYNC_CHECK", "no"}}).desync_check);
  CHECK(parse({{"SHARDOPT_TIMEOUT", "600"}}).timeout == 600.0);
  CHECK(parse({{"SHARDOPT_TIMEOUT", "0.5"}}).timeout == 0.5);
  CHECK(parse({{"SHARDOPT_TIMEOUT", "0"}}).timeout == 0.0);
}

TEST_CASE("settings: a bad value names the variable and the accepted values", "[settings]") {
  CHECK(rejects("SHARDOPT_DEBUG", "LOUD", "NONE, WARN, INFO, TRACE"));
  CHECK(rejects("SHARDOPT_DEBUG", "1", "NONE, WARN, INFO, TRACE"));
  CHECK(rejects("SHARDOPT_HUGE_PAGES", "maybe", "1, 0"));
  CHECK(rejects("SHARDOPT_CHECK_ARGS", "2", "1, 0"));
  CHECK(rejects("SHARDOPT_DESYNC_CHECK", "always", "1, 0"));
  CHECK(rejects("SHARDOPT_STATS_EVERY", "-5", "0 to 2147483647"));
  CHECK(rejects("SHARDOPT_COMM_MAX_CHUNK", "0", "1 to 2147483647"));
  CHECK(rejects("SHARDOPT_COMM_MAX_CHUNK", "-5", "1 to 2147483647"));
  CHECK(rejects("SHARDOPT_COMM_MAX_CHUNK", "2147483648", "1 to 2147483647"));
  CHECK(rejects("SHARDOPT_COMM_MAX_CHUNK", "12abc", "1 to 2147483647"));
  CHECK(rejects("SHARDOPT_COMM_MAX_CHUNK", "99999999999999999999999", "1 to 2147483647"));
  for (const char* bad : {"0", "-1", "25MB", "nan", "inf", "1e9"})
    CHECK(rejects("SHARDOPT_BUCKET_MB", bad, "a number of MiB > 0"));
  for (const char* bad : {"-1", "1.5", "ten", "00x", "2147483648"})
    CHECK(rejects("SHARDOPT_CHECK_SYNC", bad, "0 to 2147483647"));
  for (const char* bad : {"-1", "10s", "nan", "inf", "1e9"})
    CHECK(rejects("SHARDOPT_TIMEOUT", bad, "a number of seconds >= 0"));
  for (const char* bad : {"0", "3", "1048577", "4k", "-4"})
    CHECK(rejects("SHARDOPT_STAGED_CHUNK_KB", bad, "4 to 1048576"));
  for (const char* bad : {"-1", "1048577", "16k", "of", "00x"})
    CHECK(rejects("SHARDOPT_SHM_SINGLE_COPY_KB", bad, "0 to 1048576, or off"));
  CHECK(parse({}).shm_single_copy_kb == 16);
  CHECK(parse({{"SHARDOPT_SHM_SINGLE_COPY_KB", "0"}}).shm_single_copy_kb == 0);
  CHECK(parse({{"SHARDOPT_SHM_SINGLE_COPY_KB", "Off"}}).shm_single_copy_kb == SIZE_MAX);
}

TEST_CASE("settings: every variable is listed in docs/env.md", "[settings]") {
  std::ifstream in(SHARDOPT_SOURCE_DIR "/docs/env.md");
  REQUIRE(in.good());
  std::stringstream doc;
  doc << in.rdbuf();
  const auto vars = shardopt::environment_variables();
  CHECK(vars.size() >= 5);
  for (const auto& v : vars) {
    INFO(v.name);
    CHECK(doc.str().find("`" + v.name + "`") != std::string::npos);
    CHECK_FALSE(v.description.empty());
    CHECK_FALSE(v.accepted.empty());
  }
}
