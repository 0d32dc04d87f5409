// The SHARDOPT_* variables every rank must set alike: which they are, and
// the values the ranks compare (the parsed value, so that spellings of one
// value agree). tests/cli/test_env_agree.sh runs ranks that differ.
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/settings.hpp"
#include "shardopt/config.hpp"

using shardopt::detail::AgreedSetting;

namespace {

// The agreed variables with their compared values under `env`.
std::map<std::string, AgreedSetting> agreed(const std::map<std::string, std::string>& env) {
  const auto lookup = [&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  std::map<std::string, AgreedSetting> out;
  for (const AgreedSetting& a :
       shardopt::detail::agreed_settings(shardopt::detail::parse_settings(lookup), lookup))
    out[a.name] = a;
  return out;
}

std::string value(const std::string& var, const std::string& set) {
  return agreed({{var, set}}).at(var).value;
}

}  // namespace

TEST_CASE("settings: the variables every rank must set alike", "[settings][agree]") {
  const std::set<std::string> expected = {
      "SHARDOPT_COMM_MAX_CHUNK", "SHARDOPT_CHECK_ARGS",   "SHARDOPT_BUCKET_MB",
      "SHARDOPT_TIMEOUT",        "SHARDOPT_DESYNC_CHECK", "SHARDOPT_STAGED_CHUNK_KB",
      "SHARDOPT_DEVICE_COMM",    "SHARDOPT_CHECK_SYNC",   "SHARDOPT_HOST_COMM",
      "SHARDOPT_SHM_CHUNK_KB",   "SHARDOPT_FUSED_UPDATE", "SHARDOPT_SHM_SINGLE_COPY_KB"};
  std::set<std::string> flagged;
  for (const auto& v : shardopt::environment_variables())
    if (v.same_on_every_rank) flagged.insert(v.name);
  CHECK(flagged == expected);
  std::set<std::string> listed;
  for (const auto& [name, a] : agreed({})) listed.insert(name);
  CHECK(listed == expected);
  // docs/env.md says which they are, in its paragraph on them.
  std::ifstream in(SHARDOPT_SOURCE_DIR "/docs/env.md");
  REQUIRE(in.good());
  std::stringstream doc;
  doc << in.rdbuf();
  const std::string text = doc.str();
  const std::size_t at = text.find("## Variables that must be the same on every rank");
  REQUIRE(at != std::string::npos);
  const std::string section = text.substr(at, text.find("\n## ", at + 1) - at);
  for (const std::string& name : expected) {
    INFO(name);
    CHECK(section.find("`" + name + "`") != std::string::npos);
  }
}

TEST_CASE("settings: ranks compare parsed values, not spellings", "[settings][agree]") {
  // Unset, empty and the default agree; so do spellings of one value.
  CHECK(value("SHARDOPT_BUCKET_MB", "25") == agreed({}).at("SHARDOPT_BUCKET_MB").value);
  CHECK(value("SHARDOPT_BUCKET_MB", "") == value("SHARDOPT_BUCKET_MB", "25.0"));
  CHECK(value("SHARDOPT_BUCKET_MB", "0.5") == value("SHARDOPT_BUCKET_MB", "5e-1"));
  CHECK(value("SHARDOPT_CHECK_ARGS", "1") == value("SHARDOPT_CHECK_ARGS", "TRUE"));
  CHECK(value("SHARDOPT_DESYNC_CHECK", "off") == value("SHARDOPT_DESYNC_CHECK", "0"));
  CHECK(value("SHARDOPT_DEVICE_COMM", "auto") == value("SHARDOPT_DEVICE_COMM", "AUTO"));
  CHECK(value("SHARDOPT_TIMEOUT", "600") == value("SHARDOPT_TIMEOUT", "600.0"));
  // Different values differ, down to the last bit of a number.
  CHECK(value("SHARDOPT_BUCKET_MB", "25") != value("SHARDOPT_BUCKET_MB", "50"));
  CHECK(value("SHARDOPT_BUCKET_MB", "0.1") != value("SHARDOPT_BUCKET_MB", "0.10000000000000002"));
  CHECK(value("SHARDOPT_CHECK_ARGS", "1") != value("SHARDOPT_CHECK_ARGS", "0"));
  CHECK(value("SHARDOPT_TIMEOUT", "0") != value("SHARDOPT_TIMEOUT", "600"));
  CHECK(value("SHARDOPT_DEVICE_COMM", "nccl") != value("SHARDOPT_DEVICE_COMM", "staged"));
  CHECK(value("SHARDOPT_COMM_MAX_CHUNK", "700") != value("SHARDOPT_COMM_MAX_CHUNK", "701"));
  CHECK(value("SHARDOPT_STAGED_CHUNK_KB", "4") != value("SHARDOPT_STAGED_CHUNK_KB", "8"));
  CHECK(value("SHARDOPT_CHECK_SYNC", "0") != value("SHARDOPT_CHECK_SYNC", "10"));
  // The text a message shows: the value as set, and the default.
  const auto a = agreed({{"SHARDOPT_BUCKET_MB", "25.0"}}).at("SHARDOPT_BUCKET_MB");
  CHECK(a.raw == "25.0");
  CHECK(a.default_value == "25");
  CHECK(agreed({}).at("SHARDOPT_TIMEOUT").raw.empty());
}
