// Test data and reference results for the Communicator tests.
//
// A Trial is one collective with its buffers: it fills this rank's input from
// the seed, runs the operation (blocking or not) and then checks, element by
// element, the output against a reference that this rank computes on its own
// from every rank's regenerated input, in long double. It also checks that
// guard elements around every buffer are untouched and that an out-of-place
// input is unchanged.
//
// Reference rules:
//   integers, max and min of any type, and sums of "exact" data (small
//   integers times powers of two, whose sums every type represents exactly):
//   equal to the exact result. avg of exact data: the exact sum divided once,
//   in the arithmetic of the type (bf16 and f16: in f32, rounded once).
//   sums of "random" reals in [-1, 1): within (ranks - 1) roundings of the
//   type, each at most one unit roundoff of the sum of magnitudes; avg adds
//   one rounding of the division.
// The data keep every exact sum exact (and every i32 sum in range) for up to
// 8 ranks.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt::test {

enum class Fill { exact, random };
enum class Coll { allreduce, reduce_scatter, allgather, broadcast };
// out_of_place: separate buffers. in_place: allreduce recv == send,
// reduce_scatter recv == send (MPI style), allgather send == recv + rank*count,
// broadcast (always in place). in_place_own_block: reduce_scatter
// recv == send + rank*count (NCCL style).
enum class Form { out_of_place, in_place, in_place_own_block };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::bf16,
                                       DType::f16, DType::i32, DType::i64};

inline const char* coll_name(Coll c) {
  switch (c) {
    case Coll::allreduce:
      return "allreduce";
    case Coll::reduce_scatter:
      return "reduce_scatter";
    case Coll::allgather:
      return "allgather";
    case Coll::broadcast:
      return "broadcast";
  }
  return "?";
}

inline const char* form_name(Coll c, Form f) {
  switch (f) {
    case Form::out_of_place:
      return "out of place";
    case Form::in_place:
      switch (c) {
        case Coll::allreduce:
          return "in place (recv == send)";
        case Coll::reduce_scatter:
          return "in place (recv == send)";
        case Coll::allgather:
          return "in place (send == recv + rank*count)";
        case Coll::broadcast:
          return "in place";
      }
      break;
    case Form::in_place_own_block:
      return "in place (recv == send + rank*count)";
  }
  return "?";
}

// The reductions that apply to `t` (avg only for floating types).
inline std::vector<ReduceOp> ops_for(DType t) {
  if (is_floating(t)) return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  return {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
}

inline std::vector<Form> forms_for(Coll c) {
  switch (c) {
    case Coll::allreduce:
      return {Form::out_of_place, Form::in_place};
    case Coll::reduce_scatter:
      return {Form::out_of_place, Form::in_place, Form::in_place_own_block};
    case Coll::allgather:
      return {Form::out_of_place, Form::in_place};
    case Coll::broadcast:
      return {Form::in_place};
  }
  return {};
}

// Calls f(T{}) with the element type of `t`.
template <class F>
decltype(auto) with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(bfloat16{});
    case DType::f16:
      return f(float16{});
    case DType::i32:
      return f(std::int32_t{});
    case DType::i64:
      return f(std::int64_t{});
  }
  return f(float{});
}

// --------------------------------------------------------------- numbers

template <class T>
struct Num;
template <>
struct Num<float> {
  static double to(float x) { return x; }
  static float from(double d) { return static_cast<float>(d); }
  static constexpr double unit = 0x1p-24;   // unit roundoff
  static constexpr double tiny = 0x1p-149;  // smallest subnormal
};
template <>
struct Num<double> {
  static double to(double x) { return x; }
  static double from(double d) { return d; }
  static constexpr double unit = 0x1p-53;
  static constexpr double tiny = 0x1p-1074;
};
template <>
struct Num<bfloat16> {
  static double to(bfloat16 x) { return to_float(x); }
  static bfloat16 from(double d) { return bf16_from_float(static_cast<float>(d)); }
  static constexpr double unit = 0x1p-8;
  static constexpr double tiny = 0x1p-133;
};
template <>
struct Num<float16> {
  static double to(float16 x) { return to_float(x); }
  static float16 from(double d) { return f16_from_float(static_cast<float>(d)); }
  static constexpr double unit = 0x1p-11;
  static constexpr double tiny = 0x1p-24;
};

template <class T>
inline constexpr bool kIsInt = std::is_integral_v<T>;

// The text of its arguments, streamed one after the other.
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
std::string show(T x) {
  std::ostringstream os;
  if constexpr (kIsInt<T>) {
    os << static_cast<long long>(x);
  } else {
    os.precision(17);
    os << Num<T>::to(x);
    if constexpr (sizeof(T) == 2) {
      os << " (bits 0x" << std::hex << x.bits << ")";
    }
  }
  return os.str();
}

// The element a hash value stands for.
template <class T>
T make_value(std::uint64_t h, Fill fill) {
  if constexpr (kIsInt<T>) {
    if (fill == Fill::exact) return static_cast<T>(static_cast<std::int64_t>(h % 2001) - 1000);
    // Wide values whose sum over a few ranks cannot overflow.
    if constexpr (sizeof(T) == 4) {
      return static_cast<T>(static_cast<std::int64_t>(h >> 35) - (std::int64_t{1} << 28));
    } else {
      return static_cast<T>(static_cast<std::int64_t>(h >> 5) - (std::int64_t{1} << 58));
    }
  } else {
    if (fill == Fill::exact) {
      // An integer in [-8, 8]; for f32 and f64 times 2^-3 .. 2^3. Sums of a
      // few of them are exact in every type, bf16 included.
      double v = static_cast<double>(static_cast<int>(h % 17) - 8);
      if constexpr (sizeof(T) >= 4) v = std::ldexp(v, static_cast<int>((h >> 32) % 7) - 3);
      return Num<T>::from(v);
    }
    return Num<T>::from(static_cast<double>(h >> 11) * 0x1p-52 - 1.0);  // [-1, 1)
  }
}

// Element `i` of rank `rank`'s input of the data set `key`.
template <class T>
T input_value(std::uint64_t key, int rank, std::size_t i, Fill fill) {
  const std::uint64_t base = mix64(key ^ mix64(static_cast<std::uint64_t>(rank) + 1));
  return make_value<T>(mix64(base + i), fill);
}

// The exact avg of exact data: the sum divided once in the type's arithmetic.
template <class T>
double exact_avg(double sum, int n) {
  if constexpr (std::is_same_v<T, double>) {
    return sum / n;
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(sum) / static_cast<float>(n);
  } else {
    return Num<T>::to(Num<T>::from(static_cast<float>(sum) / static_cast<float>(n)));
  }
}

// Checks `got` against `op` over the n inputs value(r), r < n. Returns "" or
// what is wrong.
template <class T, class ValueOf>
std::string check_reduced(T got, int n, ReduceOp op, Fill fill, ValueOf value) {
  if constexpr (kIsInt<T>) {
    std::int64_t acc = static_cast<std::int64_t>(value(0));
    for (int r = 1; r < n; ++r) {
      const auto x = static_cast<std::int64_t>(value(r));
      acc = op == ReduceOp::sum   ? acc + x
            : op == ReduceOp::max ? std::max(acc, x)
                                  : std::min(acc, x);
    }
    if (static_cast<std::int64_t>(got) == acc) return {};
    return cat("got ", show(got), ", expected ", acc);
  } else {
    long double sum = 0, mag = 0;
    double hi = -std::numeric_limits<double>::infinity();
    double lo = std::numeric_limits<double>::infinity();
    for (int r = 0; r < n; ++r) {
      const double x = Num<T>::to(value(r));
      sum += x;
      mag += std::fabs(x);
      hi = std::max(hi, x);
      lo = std::min(lo, x);
    }
    double expect = 0;
    double tol = 0;
    const double roundings = 1.01 * Num<T>::unit * static_cast<double>(mag);
    switch (op) {
      case ReduceOp::sum:
        expect = static_cast<double>(sum);
        if (fill == Fill::random) tol = (n - 1) * roundings + n * Num<T>::tiny;
        break;
      case ReduceOp::avg:
        if (fill == Fill::exact) {
          expect = exact_avg<T>(static_cast<double>(sum), n);
        } else {
          expect = static_cast<double>(sum / n);
          tol = roundings + n * Num<T>::tiny;  // ((n-1) + 1) roundings, divided by n
        }
        break;
      case ReduceOp::max:
        expect = hi;
        break;
      case ReduceOp::min:
        expect = lo;
        break;
    }
    const double g = Num<T>::to(got);
    if (g == expect || std::fabs(g - expect) <= tol) return {};
    std::ostringstream os;
    os.precision(17);
    os << "got " << show(got) << ", expected " << expect;
    if (tol > 0) os << " +- " << tol;
    return os.str();
  }
}

// ----------------------------------------------------------------- buffers

// `n` elements with guard elements before and after, all poisoned at start.
template <class T>
class Guarded {
 public:
  static constexpr std::size_t kGuard = 8;
  static constexpr unsigned char kPoison = 0xA5;

  Guarded() = default;
  explicit Guarded(std::size_t n) : n_(n), v_(n + 2 * kGuard) {
    std::memset(static_cast<void*>(v_.data()), kPoison, v_.size() * sizeof(T));
  }
  T* data() { return v_.data() + kGuard; }
  const T* data() const { return v_.data() + kGuard; }
  // The elements with their guards, as bytes.
  std::byte* whole() { return reinterpret_cast<std::byte*>(v_.data()); }
  std::size_t whole_bytes() const { return v_.size() * sizeof(T); }
  std::size_t size() const { return n_; }
  bool allocated() const { return !v_.empty(); }
  bool guards_intact() const {
    const auto* b = reinterpret_cast<const unsigned char*>(v_.data());
    const std::size_t g = kGuard * sizeof(T);
    const std::size_t tail = (kGuard + n_) * sizeof(T);
    for (std::size_t k = 0; k < g; ++k)
      if (b[k] != kPoison || b[tail + k] != kPoison) return false;
    return true;
  }

 private:
  std::size_t n_ = 0;
  std::vector<T> v_;
};

// ------------------------------------------------------------------ trials

struct Spec {
  Coll coll = Coll::allreduce;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;  // allreduce and reduce_scatter
  std::size_t count = 0;        // per-rank block for reduce_scatter and allgather
  Form form = Form::out_of_place;
  Fill fill = Fill::random;
  int root = 0;            // broadcast
  std::uint64_t salt = 0;  // tells apart data sets of otherwise equal specs
};

inline std::string describe(const Spec& s) {
  std::ostringstream os;
  os << coll_name(s.coll) << " " << dtype_name(s.dtype);
  if (s.coll == Coll::allreduce || s.coll == Coll::reduce_scatter) {
    os << " " << reduce_op_name(s.op);
  }
  if (s.coll == Coll::broadcast) os << " root " << s.root;
  os << " count " << s.count << ", " << form_name(s.coll, s.form) << ", "
     << (s.fill == Fill::exact ? "exact" : "random") << " data";
  return os.str();
}

inline std::uint64_t spec_key(const Spec& s) {
  const std::uint64_t a =
      (static_cast<std::uint64_t>(s.coll) << 48) | (static_cast<std::uint64_t>(s.dtype) << 40) |
      (static_cast<std::uint64_t>(s.op) << 32) | (static_cast<std::uint64_t>(s.form) << 24) |
      (static_cast<std::uint64_t>(s.fill) << 16);
  return data_key(a, s.count, (s.salt << 16) ^ static_cast<std::uint64_t>(s.root));
}

// Where an operation's buffers are for the library: a Trial's own host
// buffers, or their copies elsewhere (device memory), at the same offsets.
using PointerMap = std::function<void*(const void*)>;

class Trial {
 public:
  virtual ~Trial() = default;
  // The trial's buffers, guards included (empty ones left out).
  virtual std::vector<std::pair<std::byte*, std::size_t>> regions() = 0;
  // From now on, run() and start() pass map(p) for each buffer p.
  virtual void map_buffers(PointerMap map) = 0;
  // Runs the operation, blocking.
  virtual void run(Communicator& comm) = 0;
  // Starts the operation; the buffers stay owned by the Trial.
  [[nodiscard]] virtual Request start(Communicator& comm) = 0;
  // After completion: "" if the output, the guards and an out-of-place input
  // are right; otherwise what is wrong, from this rank's view.
  virtual std::string verify() const = 0;
  virtual const Spec& spec() const = 0;
};

template <class T>
class TypedTrial final : public Trial {
 public:
  TypedTrial(const Spec& s, int rank, int size)
      : s_(s), key_(spec_key(s)), rank_(rank), size_(size) {
    const std::size_t c = s.count;
    const std::size_t n = static_cast<std::size_t>(size);
    const std::size_t own = static_cast<std::size_t>(rank) * c;
    switch (s.coll) {
      case Coll::allreduce:
        a_ = Guarded<T>(c);
        fill_input(a_.data(), c);
        if (s.form == Form::in_place) {
          set_output(a_.data());
          send_ = a_.data();
        } else {
          b_ = Guarded<T>(c);
          send_ = a_.data();
          set_output(b_.data());
        }
        result_n_ = c;
        break;
      case Coll::reduce_scatter:
        a_ = Guarded<T>(c * n);
        fill_input(a_.data(), c * n);
        send_ = a_.data();
        if (s.form == Form::in_place) {
          set_output(a_.data());
        } else if (s.form == Form::in_place_own_block) {
          set_output(a_.data() + own);
        } else {
          b_ = Guarded<T>(c);
          set_output(b_.data());
        }
        result_n_ = c;
        break;
      case Coll::allgather:
        b_ = Guarded<T>(c * n);
        set_output(b_.data());
        if (s.form == Form::in_place) {
          fill_input(b_.data() + own, c);
          send_ = b_.data() + own;
        } else {
          a_ = Guarded<T>(c);
          fill_input(a_.data(), c);
          send_ = a_.data();
        }
        result_n_ = c * n;
        break;
      case Coll::broadcast:
        a_ = Guarded<T>(c);
        if (rank == s.root) {
          for (std::size_t i = 0; i < c; ++i)
            a_.data()[i] = input_value<T>(key_, s.root, i, s.fill);
        }
        set_output(a_.data());
        send_ = a_.data();
        result_n_ = c;
        break;
    }
  }

  std::vector<std::pair<std::byte*, std::size_t>> regions() override {
    std::vector<std::pair<std::byte*, std::size_t>> r;
    for (Guarded<T>* g : {&a_, &b_})
      if (g->allocated()) r.emplace_back(g->whole(), g->whole_bytes());
    return r;
  }
  void map_buffers(PointerMap map) override { map_ = std::move(map); }

  void run(Communicator& comm) override {
    const DType t = dtype_of<T>();
    const void* send_ = mapped(this->send_);
    void* recv_ = mapped(this->recv_);
    switch (s_.coll) {
      case Coll::allreduce:
        comm.allreduce(send_, recv_, s_.count, t, s_.op);
        break;
      case Coll::reduce_scatter:
        comm.reduce_scatter(send_, recv_, s_.count, t, s_.op);
        break;
      case Coll::allgather:
        comm.allgather(send_, recv_, s_.count, t);
        break;
      case Coll::broadcast:
        comm.broadcast(recv_, s_.count, t, s_.root);
        break;
    }
  }

  Request start(Communicator& comm) override {
    const DType t = dtype_of<T>();
    const void* send_ = mapped(this->send_);
    void* recv_ = mapped(this->recv_);
    switch (s_.coll) {
      case Coll::allreduce:
        return comm.iallreduce(send_, recv_, s_.count, t, s_.op);
      case Coll::reduce_scatter:
        return comm.ireduce_scatter(send_, recv_, s_.count, t, s_.op);
      case Coll::allgather:
        return comm.iallgather(send_, recv_, s_.count, t);
      case Coll::broadcast:
        return comm.ibroadcast(recv_, s_.count, t, s_.root);
    }
    return Request();
  }

  std::string verify() const override {
    std::ostringstream why;
    if (a_.allocated() && !a_.guards_intact())
      why << "memory around the first buffer overwritten; ";
    if (b_.allocated() && !b_.guards_intact())
      why << "memory around the second buffer overwritten; ";
    if (s_.form == Form::out_of_place && s_.coll != Coll::broadcast) {
      const std::size_t n_in = s_.coll == Coll::reduce_scatter ? s_.count * size_ : s_.count;
      for (std::size_t i = 0; i < n_in; ++i) {
        if (!same_bits(a_.data()[i], input_value<T>(key_, rank_, i, s_.fill))) {
          why << "the send buffer was modified at [" << i << "]; ";
          break;
        }
      }
    }
    std::size_t wrong = 0;
    std::size_t first_index = 0;
    std::string first;
    for (std::size_t i = 0; i < result_n_; ++i) {
      std::string e = check_element(i);
      if (e.empty()) continue;
      if (wrong++ == 0) {
        first_index = i;
        first = std::move(e);
      }
    }
    if (wrong != 0) {
      why << wrong << " of " << result_n_ << " output elements wrong, first [" << first_index
          << "]: " << first;
    }
    if (why.tellp() == 0) return {};
    std::ostringstream out;
    out << "rank " << rank_ << ": " << why.str();
    return out.str();
  }

  const Spec& spec() const override { return s_; }

 private:
  void set_output(T* p) {
    recv_ = p;
    result_ = p;
  }
  void* mapped(const void* p) const { return map_ ? map_(p) : const_cast<void*>(p); }

  void fill_input(T* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) p[i] = input_value<T>(key_, rank_, i, s_.fill);
  }

  std::string check_element(std::size_t i) const {
    const T got = result_[i];
    switch (s_.coll) {
      case Coll::allreduce:
      case Coll::reduce_scatter: {
        const std::size_t idx =
            s_.coll == Coll::reduce_scatter ? static_cast<std::size_t>(rank_) * s_.count + i : i;
        return check_reduced<T>(got, size_, s_.op, s_.fill,
                                [&](int r) { return input_value<T>(key_, r, idx, s_.fill); });
      }
      case Coll::allgather: {
        const int from = static_cast<int>(i / s_.count);
        const T want = input_value<T>(key_, from, i % s_.count, s_.fill);
        if (same_bits(got, want)) return {};
        return cat("got ", show(got), ", expected ", show(want), " from rank ", from);
      }
      case Coll::broadcast: {
        const T want = input_value<T>(key_, s_.root, i, s_.fill);
        if (same_bits(got, want)) return {};
        return cat("got ", show(got), ", expected ", show(want));
      }
    }
    return "?";
  }

  Spec s_;
  std::uint64_t key_;
  int rank_;
  int size_;
  Guarded<T> a_;
  Guarded<T> b_;
  const void* send_ = nullptr;
  void* recv_ = nullptr;
  const T* result_ = nullptr;
  std::size_t result_n_ = 0;
  PointerMap map_;
};

inline std::unique_ptr<Trial> make_trial(const Spec& s, int rank, int size) {
  return with_type(s.dtype, [&](auto tag) -> std::unique_ptr<Trial> {
    return std::make_unique<TypedTrial<decltype(tag)>>(s, rank, size);
  });
}

// Runs `s` blocking on `comm` and checks the result on every rank (one
// CHECK, the same verdict on every rank). Collective over MPI_COMM_WORLD.
inline void check_blocking(Communicator& comm, const Spec& s) {
  auto trial = make_trial(s, comm.rank(), comm.size());
  std::string error;
  if (!no_throw([&] { trial->run(comm); })) {
    error = cat("rank ", comm.rank(), ": the operation threw");
  } else {
    error = trial->verify();
  }
  INFO(describe(s) << ", " << comm.size() << " ranks, chunk " << comm.max_chunk_elements());
  INFO(error);
  CHECK(all_ranks_true(error.empty()));
}

// Collective over MPI_COMM_WORLD: an allreduce on `comm` still gives the
// right sum (after an error, nothing is left corrupted).
inline bool still_works(Communicator& comm) {
  const int n = comm.size();
  std::int64_t v[3] = {comm.rank() + 1, 1, -comm.rank()};
  std::int64_t r[3] = {0, 0, 0};
  bool ok = no_throw([&] { comm.allreduce(v, r, 3, DType::i64, ReduceOp::sum); });
  ok = ok && r[0] == std::int64_t{n} * (n + 1) / 2 && r[1] == n &&
       r[2] == -std::int64_t{n} * (n - 1) / 2;
  return all_ranks_true(ok);
}

}  // namespace shardopt::test
