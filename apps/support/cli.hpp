// shardopt apps: the command-line parsing the programs under apps/ share:
// short and long options (-b 1K, -b1K, --minbytes 1K, --minbytes=1K),
// sizes with K, M or G suffixes, and errors that name the option and the
// values it accepts; how a program reports errors; and the main() that
// starts MPI for a program.
#pragma once

#include <mpi.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "shardopt/config.hpp"
#include "shardopt/environment.hpp"
#include "shardopt/error.hpp"

namespace cli {

// A bad command line; the program prints the message and exits with 2.
struct UsageError {
  std::string message;
};

struct OptionSpec {
  char short_name;  // 0: long form only
  const char* long_name;
  bool takes_value;
};

// "-b (--minbytes)" or "--json", for messages.
inline std::string option_label(const OptionSpec& spec) {
  if (spec.short_name == 0) return std::string("--") + spec.long_name;
  return std::string("-") + spec.short_name + " (--" + spec.long_name + ")";
}

[[noreturn]] inline void bad_value(const std::string& label, std::string_view value,
                                   std::string_view accepted) {
  throw UsageError{"bad value '" + std::string(value) + "' for " + label +
                   "; accepted: " + std::string(accepted)};
}

// A decimal number without sign or junk.
inline std::optional<std::uint64_t> parse_unsigned(std::string_view s) {
  std::uint64_t v = 0;
  if (s.empty()) return std::nullopt;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A positive number with an optional K, M or G suffix (powers of 1024), at
// most `max`; nullopt otherwise.
inline std::optional<std::uint64_t> parse_scaled(std::string_view s, std::uint64_t max) {
  std::uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'k':
      case 'K':
        mult = std::uint64_t{1} << 10;
        break;
      case 'm':
      case 'M':
        mult = std::uint64_t{1} << 20;
        break;
      case 'g':
      case 'G':
        mult = std::uint64_t{1} << 30;
        break;
      default:
        break;
    }
    if (mult != 1) s.remove_suffix(1);
  }
  const auto v = parse_unsigned(s);
  if (!v || *v == 0 || *v > max / mult) return std::nullopt;
  return *v * mult;
}

inline int parse_int(const std::string& label, std::string_view s, int lo, int hi,
                     std::string_view accepted) {
  const auto v = parse_unsigned(s);
  if (!v || *v < static_cast<std::uint64_t>(lo) || *v > static_cast<std::uint64_t>(hi)) {
    bad_value(label, s, accepted);
  }
  return static_cast<int>(*v);
}

// A value named by one word: `choices` lists (word, value) pairs; any other
// word is a UsageError that lists the words, in order.
template <class T>
T parse_choice(const std::string& label, std::string_view s,
               std::initializer_list<std::pair<std::string_view, T>> choices) {
  std::string accepted;
  for (const auto& [word, value] : choices) {
    if (s == word) return value;
    if (!accepted.empty()) accepted += ' ';
    accepted.append(word.data(), word.size());
  }
  bad_value(label, s, accepted);
}

// `text`'s words in lines of at most `width` characters (a longer word
// alone on its line), each line after the first indented by `indent`
// spaces, for usage texts; the first line's indent is the caller's.
inline std::string wrap(std::string_view text, std::size_t indent, std::size_t width = 80) {
  std::string out;
  std::size_t column = indent;
  while (!text.empty()) {
    const std::size_t end = text.find(' ');
    const std::string_view word = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    if (word.empty()) continue;
    if (column > indent && column + 1 + word.size() > width) {
      out.append("\n").append(indent, ' ');
      column = indent;
    } else if (column > indent) {
      out.push_back(' ');
      ++column;
    }
    out.append(word);
    column += word.size();
  }
  return out;
}

// "a,b,c" -> {"a", "b", "c"}.
inline std::vector<std::string_view> split(std::string_view s) {
  std::vector<std::string_view> items;
  while (true) {
    const std::size_t comma = s.find(',');
    items.push_back(s.substr(0, comma));
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return items;
}

// Calls apply(spec, label, value) for each option of argv, in order ("" as
// the value of a flag); throws UsageError for anything else.
template <class Apply>
void for_each_option(int argc, char** argv, std::span<const OptionSpec> specs, Apply&& apply) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const OptionSpec* spec = nullptr;
    std::optional<std::string_view> value;
    if (arg.size() > 2 && arg.starts_with("--")) {
      std::string_view name = arg.substr(2);
      const std::size_t eq = name.find('=');
      if (eq != std::string_view::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      for (const OptionSpec& s : specs) {
        if (name == s.long_name) spec = &s;
      }
    } else if (arg.size() >= 2 && arg[0] == '-' && arg[1] != '-') {
      for (const OptionSpec& s : specs) {
        if (s.short_name == arg[1]) spec = &s;
      }
      if (spec != nullptr && arg.size() > 2) {
        // "-b1K" carries its value; "-hx" is not an option we know.
        if (spec->takes_value) {
          value = arg.substr(2);
        } else {
          spec = nullptr;
        }
      }
    } else {
      throw UsageError{"unexpected argument '" + std::string(arg) + "'"};
    }
    if (spec == nullptr) throw UsageError{"unknown option '" + std::string(arg) + "'"};
    const std::string label = option_label(*spec);
    if (spec->takes_value && !value) {
      if (i + 1 >= argc) throw UsageError{"option " + label + " needs a value"};
      value = argv[++i];
    }
    if (!spec->takes_value && value) throw UsageError{"option " + label + " takes no value"};
    apply(*spec, label, value.value_or(""));
  }
}

// "1G", "4M", "64K" or "1000": a count as -p and the like accept it.
inline std::string human_count(std::size_t n) {
  if (n % (std::size_t{1} << 30) == 0) return std::to_string(n >> 30) + "G";
  if (n % (std::size_t{1} << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n % (std::size_t{1} << 10) == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

// A bad command line of an MPI program: rank 0 says why, with where to look;
// every rank parsed the same argv, so every rank then stops with 2.
inline void print_usage_error(const char* program, int rank, const UsageError& e) {
  if (rank != 0) return;
  std::fprintf(stderr, "%s: %s\nrun '%s -h' for the options and their values\n", program,
               e.message.c_str(), program);
}

// "program: rank 3: what" on stderr, flushed: the job may be aborted next.
inline void print_error(const char* program, int rank, const std::string& what) {
  std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, what.c_str());
  std::fflush(stderr);
}

// An error as a program prints it, without the rank that raised it (the
// same text on every rank for an error the ranks agreed on): shardopt's
// message with its code and `fix` (its own hint unless the program speaks
// of it in its own options).
inline std::string error_text(const shardopt::Error& e, const std::string& fix) {
  std::string s = "[";
  s += shardopt::error_code_name(e.code());
  s += "] ";
  s += e.message();
  if (!fix.empty()) s += "\n  fix: " + fix;
  return s;
}
// The same for any exception: what() where it is not shardopt's.
inline std::string error_text(const std::exception& e) {
  const auto* error = dynamic_cast<const shardopt::Error*>(&e);
  return error != nullptr ? error_text(*error, error->hint()) : std::string(e.what());
}

// Collective over comm: whether this rank prints `message` (its error, ""
// for none), so that a job prints each error once however many ranks hold
// it: the lowest rank holding the same text prints it; with SHARDOPT_DEBUG
// at INFO or above, every rank prints its own.
inline bool first_to_hold(MPI_Comm comm, const std::string& message) {
  const std::uint64_t mine = message.empty() ? 0 : std::hash<std::string>{}(message) | 1;
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(size));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm);
  if (message.empty()) return false;
  bool verbose = false;
  try {
    verbose = shardopt::settings().debug >= shardopt::LogLevel::info;
  } catch (...) {  // a bad setting is the error being printed
  }
  for (int r = 0; r < rank && !verbose; ++r)
    if (all[static_cast<std::size_t>(r)] == mine) return false;
  return true;
}

// Collective over comm: prints each rank's error (`message`, "" for none)
// once per job (first_to_hold).
inline void print_once(const char* program, MPI_Comm comm, int rank, const std::string& message) {
  if (first_to_hold(comm, message)) print_error(program, rank, message);
}

// How a rank that caught an error ends the job. Where every rank caught one
// (shardopt raises a bad setting, or a failure agreed across ranks, on every
// rank at once), the ranks meet on their own communicator within a short
// grace period, print each distinct error once (the lowest rank holding
// it), and end normally with `status`: mpirun reports it once, and is
// spared several ranks' MPI_Abort at the same moment (Open MPI 4.1's mpirun
// can crash collecting their messages). Otherwise some ranks may be
// waiting for this one in a collective: it prints its error and MPI_Abort
// ends the job.
class ErrorExit {
 public:
  // Collective over MPI_COMM_WORLD: make one before anything can fail.
  ErrorExit() { MPI_Comm_dup(MPI_COMM_WORLD, &comm_); }
  ~ErrorExit() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  ErrorExit(const ErrorExit&) = delete;
  ErrorExit& operator=(const ErrorExit&) = delete;

  // Prints `message` (once per job where every rank failed) and returns
  // `status` where every rank arrives within grace_s, else MPI_Abort.
  int end(const char* program, int rank, const std::string& message, int status,
          double grace_s = 2.0) {
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_Ibarrier(comm_, &r);
    const double until = MPI_Wtime() + grace_s;
    int met = 0;
    while (MPI_Test(&r, &met, MPI_STATUS_IGNORE) == MPI_SUCCESS && met == 0 &&
           MPI_Wtime() < until) {
      const timespec pause{0, 1000000};  // 1 ms
      nanosleep(&pause, nullptr);
    }
    if (met == 0) {
      print_error(program, rank, message);
      MPI_Abort(MPI_COMM_WORLD, status);
    }
    print_once(program, comm_, rank, message);
    return status;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// The thread level MPI starts at for a program whose argv asks for
// `--device cuda`: MPI_THREAD_MULTIPLE, since the transports of device
// buffers call MPI from threads of their own (docs/gpu.md); else the
// library's default.
inline shardopt::ThreadLevel thread_level_for(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string_view(argv[i]) == "--device" && std::string_view(argv[i + 1]) == "cuda")
      return shardopt::ThreadLevel::multiple;
  return shardopt::required_thread_level;
}

// The main() of an MPI program: starts MPI (shardopt::Environment) and runs
// program_main(argc, argv), which returns the exit code; the Environment
// outlives it. MPI failing to start is "program: what", exit code 1.
template <class Main>
int run_with_mpi(const char* program, int argc, char** argv, Main&& program_main,
                 shardopt::ThreadLevel level = shardopt::required_thread_level) {
  std::optional<shardopt::Environment> env;
  try {
    env.emplace(&argc, &argv, level);
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
  return program_main(argc, argv);
}

}  // namespace cli
