// shardopt internal: what the C API's files share (include/shardopt/shardopt.h).
//
// Every C entry point runs its body through guard(), which turns any C++
// exception into a status code and this thread's last error, so no exception
// crosses extern "C". Handles are numbers in a registry, never pointers to
// the objects: a destroyed handle, a handle of another kind, or a value that
// was never a handle is found by a lookup and reported, never dereferenced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <string>

#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"
#include "shardopt/shardopt.h"
#include "shardopt/zero.hpp"

namespace shardopt::capi {

// Records a failure as this thread's last error; returns its status.
// reports: whether this rank prints it (reports_error).
shardopt_status_t fail(shardopt_status_t status, std::string message, std::string hint,
                       bool reports = true) noexcept;

// The language of the process's caller (shardopt_set_language; C unless a
// binding said otherwise).
shardopt_language_t language() noexcept;

// text with the C++ spellings the library's messages and hints use
// (ZeroOptions::bucket_mb, step(), ...) replaced by the caller's
// (shardopt_zero_options_t.bucket_mb, shardopt_step(), ...) in `language`:
// the table is in spelling.cpp.
std::string in_callers_words(std::string text, shardopt_language_t language);

// Element i of array argument `array`, as the caller writes it: "params[2]"
// in C, "params(3)" in Fortran.
std::string element_name(const char* array, std::size_t i);

// Runs f (returning void) and maps what it throws to a status; `function`
// prefixes the message ("shardopt_step: ...").
template <class F>
shardopt_status_t guard(const char* function, F&& f) noexcept {
  try {
    f();
    return SHARDOPT_SUCCESS;
  } catch (const Error& e) {
    return fail(e.status(), std::string(function) + ": " + e.message(), e.hint(), reports_error(e));
  } catch (const std::bad_alloc&) {
    return fail(SHARDOPT_ERR_OUT_OF_MEMORY, std::string(function) + ": out of host memory",
                "free memory, or use fewer or smaller buffers per rank");
  } catch (const std::exception& e) {
    return fail(SHARDOPT_ERR_INTERNAL, std::string(function) + ": " + e.what(),
                "this is a bug in shardopt: please report it with the message");
  } catch (...) {
    return fail(SHARDOPT_ERR_INTERNAL, std::string(function) + ": unknown exception",
                "this is a bug in shardopt: please report it");
  }
}

// The objects behind the handles.
struct CommObject {
  explicit CommObject(Communicator c) : comm(std::move(c)) {}
  Communicator comm;
  int optimizers = 0;  // live optimizers made on it
  int requests = 0;    // requests not completed yet
};
struct OptimizerObject {
  std::unique_ptr<ZeroRedundancyOptimizer> opt;
  CommObject* comm = nullptr;
  std::map<std::string, std::string> loaded_metadata;  // of the last successful load
};
struct RequestObject {
  Request request;
  CommObject* comm = nullptr;
};

enum class Kind : int { comm = 1, optimizer = 2, request = 3 };

// Stores the object and returns its handle value.
std::uintptr_t add_handle(Kind kind, std::shared_ptr<void> object);
// The object of handle `value` of `kind`; throws InvalidArgument for a null
// handle (naming `what`), a handle of another kind or a value that was never
// a handle, StateError for a destroyed one.
void* find_handle(Kind kind, std::uintptr_t value, const char* what);
// Marks handle `value` destroyed and drops its object (after find_handle).
void remove_handle(std::uintptr_t value) noexcept;

CommObject& comm_of(shardopt_comm_t comm, const char* what = "comm");
OptimizerObject& optimizer_of(shardopt_optimizer_t opt, const char* what = "opt");
RequestObject& request_of(shardopt_request_t request, const char* what = "request");

// Argument checks; each throws InvalidArgument naming `what`.
void check_out(const void* out, const char* what);
void check_count(std::size_t count, const char* what);
DType dtype_of_code(shardopt_dtype_t dtype, const char* what);
ReduceOp op_of_code(shardopt_op_t op);
std::string string_of(const char* s, const char* what);
// Copies s into out (size bytes with its NUL); throws InvalidArgument if it
// does not fit, naming the size needed.
void copy_out(const std::string& s, char* out, std::size_t size, const char* what);

}  // namespace shardopt::capi
