// shardopt: the C API's errors, handles, version and devices (shardopt.h).
#include "capi.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "common/check.hpp"
#include "common/language.hpp"
#include "shardopt/device.hpp"
#include "shardopt/types.hpp"

namespace shardopt::capi {
namespace {

struct LastError {
  shardopt_status_t status = SHARDOPT_SUCCESS;
  std::string message;
  std::string hint;
  bool reports = true;
};
thread_local LastError last_error;

// shardopt_language_t of the caller; process-wide, set by a binding once.
std::atomic<int> caller_language{SHARDOPT_LANGUAGE_C};

// Handle values: an id times 16 plus the kind, never 0, never reused. A
// destroyed id stays in the table (without its object), so its later use is
// told apart from a value that was never a handle.
struct Entry {
  Kind kind;
  std::shared_ptr<void> object;  // null once destroyed
};
std::mutex table_mutex;
std::unordered_map<std::uintptr_t, Entry>& table() {
  static auto* t = new std::unordered_map<std::uintptr_t, Entry>();  // lives until exit
  return *t;
}
std::uintptr_t next_id = 1;

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::comm:
      return "a communicator (shardopt_comm_t)";
    case Kind::optimizer:
      return "an optimizer (shardopt_optimizer_t)";
    case Kind::request:
      return "a request (shardopt_request_t)";
  }
  return "a handle";
}

const char* destroyer(Kind kind) {
  switch (kind) {
    case Kind::comm:
      return "shardopt_comm_destroy";
    case Kind::optimizer:
      return "shardopt_optimizer_destroy";
    case Kind::request:
      return "shardopt_wait or shardopt_test";
  }
  return "its destroy function";
}

}  // namespace

shardopt_language_t language() noexcept {
  return static_cast<shardopt_language_t>(caller_language.load(std::memory_order_relaxed));
}

std::string element_name(const char* array, std::size_t i) {
  const std::string index = detail::index_text(static_cast<long long>(i));
  return language() == SHARDOPT_LANGUAGE_FORTRAN ? std::string(array) + "(" + index + ")"
                                                 : std::string(array) + "[" + index + "]";
}

shardopt_status_t fail(shardopt_status_t status, std::string message, std::string hint,
                       bool reports) noexcept {
  try {
    last_error.status = status;
    last_error.reports = reports;
    const shardopt_language_t lang = language();
    last_error.message = in_callers_words(std::move(message), lang);
    last_error.hint = in_callers_words(std::move(hint), lang);
  } catch (...) {
    last_error.message.clear();
    last_error.hint.clear();
  }
  return status;
}

std::uintptr_t add_handle(Kind kind, std::shared_ptr<void> object) {
  std::lock_guard lock(table_mutex);
  const std::uintptr_t value = next_id++ * 16 + static_cast<std::uintptr_t>(kind);
  table().emplace(value, Entry{kind, std::move(object)});
  return value;
}

void* find_handle(Kind kind, std::uintptr_t value, const char* what) {
  if (value == 0)
    SHARDOPT_THROW(invalid_argument, std::string(what) + " is NULL, not " + kind_name(kind),
                   "pass a handle that a shardopt create function returned");
  std::lock_guard lock(table_mutex);
  const auto it = table().find(value);
  if (it == table().end())
    SHARDOPT_THROW(invalid_argument,
                   std::string(what) + " is not " + kind_name(kind) +
                       ": no shardopt function returned this value",
                   "pass the handle its create function wrote (an uninitialised variable, or "
                   "a pointer cast from something else, is not one)");
  if (it->second.kind != kind)
    SHARDOPT_THROW(
        invalid_argument,
        std::string(what) + " is " + kind_name(it->second.kind) + ", not " + kind_name(kind),
        "pass the handle of the right kind");
  if (!it->second.object)
    SHARDOPT_THROW(
        invalid_state, std::string(what) + " is " + kind_name(kind) + " that was destroyed",
        std::string("a handle cannot be used after ") + destroyer(kind) + "; create a new one");
  return it->second.object.get();
}

void remove_handle(std::uintptr_t value) noexcept {
  std::shared_ptr<void> object;  // destroyed outside the lock
  {
    std::lock_guard lock(table_mutex);
    const auto it = table().find(value);
    if (it != table().end()) object = std::move(it->second.object);
  }
}

CommObject& comm_of(shardopt_comm_t comm, const char* what) {
  return *static_cast<CommObject*>(
      find_handle(Kind::comm, reinterpret_cast<std::uintptr_t>(comm), what));
}
OptimizerObject& optimizer_of(shardopt_optimizer_t opt, const char* what) {
  return *static_cast<OptimizerObject*>(
      find_handle(Kind::optimizer, reinterpret_cast<std::uintptr_t>(opt), what));
}
RequestObject& request_of(shardopt_request_t request, const char* what) {
  return *static_cast<RequestObject*>(
      find_handle(Kind::request, reinterpret_cast<std::uintptr_t>(request), what));
}

void check_out(const void* out, const char* what) {
  if (!out)
    SHARDOPT_THROW(invalid_argument, std::string(what) + " is NULL",
                   "pass the address of a variable to write the result to");
}

void check_count(std::size_t count, const char* what) {
  if (count > static_cast<std::size_t>(PTRDIFF_MAX))
    SHARDOPT_THROW(invalid_argument,
                   std::string(what) + " is negative (" +
                       std::to_string(static_cast<long long>(count)) +
                       " as a signed 64-bit integer)",
                   "pass a count >= 0 (a negative Fortran integer arrives as a huge size_t)");
}

DType dtype_of_code(shardopt_dtype_t dtype, const char* what) {
  const auto t = static_cast<DType>(static_cast<int>(dtype));
  if (!is_valid(t))
    SHARDOPT_THROW(invalid_argument,
                   std::string(what) + " " + std::to_string(static_cast<int>(dtype)) +
                       " is not a shardopt_dtype_t",
                   "use SHARDOPT_F32 (0), SHARDOPT_F64 (1), SHARDOPT_BF16 (2), SHARDOPT_F16 (3), "
                   "SHARDOPT_I32 (4) or SHARDOPT_I64 (5)");
  return t;
}

ReduceOp op_of_code(shardopt_op_t op) {
  const auto o = static_cast<ReduceOp>(static_cast<int>(op));
  if (!is_valid(o))
    SHARDOPT_THROW(invalid_argument,
                   "op " + std::to_string(static_cast<int>(op)) + " is not a shardopt_op_t",
                   "use SHARDOPT_SUM (0), SHARDOPT_AVG (1), SHARDOPT_MAX (2) or SHARDOPT_MIN (3)");
  return o;
}

std::string string_of(const char* s, const char* what) {
  if (!s)
    SHARDOPT_THROW(invalid_argument, std::string(what) + " is NULL",
                   "pass a NUL-terminated string");
  return s;
}

void copy_out(const std::string& s, char* out, std::size_t size, const char* what) {
  if (!out) return;
  if (s.size() + 1 > size)
    SHARDOPT_THROW(invalid_argument,
                   std::string(what) + " of " + std::to_string(size) + " bytes is too small for " +
                       std::to_string(s.size() + 1) + " bytes",
                   "pass a buffer of at least " + std::to_string(s.size() + 1) + " bytes");
  std::memcpy(out, s.c_str(), s.size() + 1);
}

}  // namespace shardopt::capi

using namespace shardopt;
using namespace shardopt::capi;

extern "C" {

SHARDOPT_API const char* shardopt_version_string(void) { return SHARDOPT_VERSION_STRING; }

SHARDOPT_API shardopt_status_t shardopt_version(int* major, int* minor, int* patch) {
  if (major) *major = SHARDOPT_VERSION_MAJOR;
  if (minor) *minor = SHARDOPT_VERSION_MINOR;
  if (patch) *patch = SHARDOPT_VERSION_PATCH;
  return SHARDOPT_SUCCESS;
}

SHARDOPT_API const char* shardopt_last_error(void) { return last_error.message.c_str(); }
SHARDOPT_API const char* shardopt_last_error_hint(void) { return last_error.hint.c_str(); }
SHARDOPT_API shardopt_status_t shardopt_last_status(void) { return last_error.status; }
SHARDOPT_API int shardopt_reports_last_error(void) {
  return last_error.status == SHARDOPT_SUCCESS || last_error.reports ? 1 : 0;
}
SHARDOPT_API void shardopt_clear_error(void) {
  last_error.status = SHARDOPT_SUCCESS;
  last_error.message.clear();
  last_error.hint.clear();
}

SHARDOPT_API shardopt_status_t shardopt_set_language(shardopt_language_t language) {
  return guard("shardopt_set_language", [&] {
    if (language != SHARDOPT_LANGUAGE_C && language != SHARDOPT_LANGUAGE_FORTRAN)
      SHARDOPT_THROW(invalid_argument,
                     "language " + std::to_string(static_cast<int>(language)) +
                         " is not a shardopt_language_t",
                     "use SHARDOPT_LANGUAGE_C (0) or SHARDOPT_LANGUAGE_FORTRAN (1)");
    caller_language.store(static_cast<int>(language), std::memory_order_relaxed);
    detail::set_index_base(language == SHARDOPT_LANGUAGE_FORTRAN ? 1 : 0);
  });
}

SHARDOPT_API shardopt_status_t shardopt_device_count(int* count) {
  return guard("shardopt_device_count", [&] {
    check_out(count, "count");
    *count = device_count();
  });
}

SHARDOPT_API shardopt_status_t shardopt_set_device(int device) {
  return guard("shardopt_set_device", [&] { set_device(device); });
}

}  // extern "C"
