// shardopt-ckpt diff: compares two files tensor by tensor and their
// metadata.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "common.hpp"

namespace ckpt_tool {
namespace {

// How a dtype's elements read as numbers.
enum class Kind { f64, f32, bf16, f16, i8, i16, i32, i64, u8, u16, u32, u64, boolean, bits };

Kind kind_of(const std::string& d) {
  static const std::pair<const char*, Kind> kinds[] = {
      {"F64", Kind::f64},     {"F32", Kind::f32}, {"BF16", Kind::bf16}, {"F16", Kind::f16},
      {"I8", Kind::i8},       {"I16", Kind::i16}, {"I32", Kind::i32},   {"I64", Kind::i64},
      {"U8", Kind::u8},       {"U16", Kind::u16}, {"U32", Kind::u32},   {"U64", Kind::u64},
      {"BOOL", Kind::boolean}};
  for (const auto& [name, k] : kinds)
    if (d == name) return k;
  return Kind::bits;  // F8_E4M3, F8_E5M2: compared bit for bit only
}

template <class T>
void widen(const unsigned char* p, std::size_t n, double* out) {
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<T, shardopt::bfloat16> || std::is_same_v<T, shardopt::float16>) {
      out[i] = shardopt::to_float(v);
    } else {
      out[i] = static_cast<double>(v);
    }
  }
}

void to_double(Kind k, const unsigned char* p, std::size_t n, double* out) {
  // By Kind, in its order; bits are not read as numbers.
  using Widen = void (*)(const unsigned char*, std::size_t, double*);
  static constexpr Widen kWiden[] = {widen<double>,
                                     widen<float>,
                                     widen<shardopt::bfloat16>,
                                     widen<shardopt::float16>,
                                     widen<std::int8_t>,
                                     widen<std::int16_t>,
                                     widen<std::int32_t>,
                                     widen<std::int64_t>,
                                     widen<std::uint8_t>,
                                     widen<std::uint16_t>,
                                     widen<std::uint32_t>,
                                     widen<std::uint64_t>,
                                     widen<std::uint8_t>,
                                     nullptr};
  static_assert(std::size(kWiden) == static_cast<std::size_t>(Kind::bits) + 1);
  if (const Widen f = kWiden[static_cast<std::size_t>(k)]) f(p, n, out);
}

// One pair of tensors compared: in A and in B, the same shape.
struct Pair {
  std::string name;
  std::size_t a = 0, b = 0;  // indices into each header's tensors
  u64 numel = 0;
  std::size_t es_a = 0, es_b = 0;
  Kind kind_a = Kind::bits, kind_b = Kind::bits;
  bool same_dtype = true;
  bool values() const { return kind_a != Kind::bits && kind_b != Kind::bits; }
};

// Per pair, reduced over the ranks: max over elements of |a - b| and
// |a - b| / |b| (inf where a NaN or inf is involved unequally, or b is 0
// and a is not), elements that differ (bits for the same dtype, values
// otherwise), and elements outside the tolerances.
struct PairStats {
  std::vector<double> max_abs, max_rel;
  std::vector<u64> differ, outside;
  explicit PairStats(std::size_t n) : max_abs(n, 0), max_rel(n, 0), differ(n, 0), outside(n, 0) {}
};

bool bits_differ(const unsigned char* a, const unsigned char* b, std::size_t es) {
  return std::memcmp(a, b, es) != 0;
}

void compare_run(const Pair& p, const unsigned char* a, const unsigned char* b, u64 n,
                 const DiffOptions& o, PairStats& s, std::size_t idx, std::vector<double>& da,
                 std::vector<double>& db) {
  if (p.same_dtype && std::memcmp(a, b, static_cast<std::size_t>(n) * p.es_a) == 0) return;
  const double atol = o.atol.value_or(0), rtol = o.rtol.value_or(0);
  constexpr std::size_t kBlock = 4096;
  const double inf = std::numeric_limits<double>::infinity();
  da.resize(kBlock);
  db.resize(kBlock);
  for (u64 first = 0; first < n; first += kBlock) {
    const std::size_t m = static_cast<std::size_t>(std::min<u64>(kBlock, n - first));
    const unsigned char* pa = a + first * p.es_a;
    const unsigned char* pb = b + first * p.es_b;
    if (!p.values()) {
      for (std::size_t i = 0; i < m; ++i) {
        if (bits_differ(pa + i * p.es_a, pb + i * p.es_b, p.es_a)) {
          ++s.differ[idx];
          ++s.outside[idx];
          s.max_abs[idx] = s.max_rel[idx] = inf;
        }
      }
      continue;
    }
    to_double(p.kind_a, pa, m, da.data());
    to_double(p.kind_b, pb, m, db.data());
    for (std::size_t i = 0; i < m; ++i) {
      const double x = da[i], y = db[i];
      const bool both_nan = std::isnan(x) && std::isnan(y);
      double d = 0;
      if (!(x == y || both_nan)) {
        d = std::fabs(x - y);
        if (std::isnan(d)) d = inf;
      }
      const bool differs =
          p.same_dtype ? bits_differ(pa + i * p.es_a, pb + i * p.es_b, p.es_a) : d != 0;
      if (!differs) continue;
      ++s.differ[idx];
      s.max_abs[idx] = std::max(s.max_abs[idx], d);
      const double rel = d == 0 ? 0 : (y == 0 ? inf : d / std::fabs(y));
      s.max_rel[idx] = std::max(s.max_rel[idx], std::isnan(rel) ? inf : rel);
      if (!(d <= atol + rtol * std::fabs(y))) ++s.outside[idx];
    }
  }
}

// Metadata compared by diff: a difference in these makes the files differ.
constexpr const char* kComparedKeys[] = {kKeyContent, kKeyStep,  kKeyOptimizer, kKeyGroups,
                                         kKeyStates,  kKeyDtype, kKeyRemainders};
// Shown when they differ, without making the files differ: how a file was
// written, not what it holds.
constexpr const char* kNotedKeys[] = {kKeyStage,   kKeyRanks,      kKeyFormatVersion,
                                      kKeyVersion, kKeyChunkBytes, kKeyFingerprint};

// Equal as JSON when both parse, else as text.
bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  try {
    return Json::parse(a) == Json::parse(b);
  } catch (const Json::exception&) {
    return false;
  }
}

std::string number_text(double x) {
  if (std::isinf(x)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

int diff_files(shardopt::Communicator& comm, const World& w, const std::string& path_a,
               const std::string& path_b, const DiffOptions& o) {
  ck::Reader ra = open_file(comm, w, path_a);
  ck::Reader rb = open_file(comm, w, path_b);
  const ck::Header& ha = ra.header();
  const ck::Header& hb = rb.header();
  const TensorIndex ia(ha), ib(hb);
  std::size_t differences = 0;

  // Metadata.
  std::vector<std::string> meta_lines;
  std::size_t meta_differences = 0, meta_notes = 0;
  auto compare_key = [&](const char* key, bool counts) {
    const bool in_a = has_meta(ha, key), in_b = has_meta(hb, key);
    if (!in_a && !in_b) return;
    const std::string va = meta(ha, key, "(none)"), vb = meta(hb, key, "(none)");
    if (in_a && in_b && same_value(va, vb)) return;
    ++(counts ? meta_differences : meta_notes);
    auto cut = [](const std::string& s) { return s.size() > 300 ? s.substr(0, 300) + "..." : s; };
    meta_lines.push_back(std::string(counts ? "  " : "  (note) ") + key + ":\n    A: " + cut(va) +
                         "\n    B: " + cut(vb));
  };
  if (o.params_only) {
    compare_key(kKeyStep, true);
  } else {
    for (const char* k : kComparedKeys) compare_key(k, true);
    for (const char* k : kNotedKeys) compare_key(k, false);
  }

  // Which tensors.
  std::vector<std::string> names_a, names_b;
  if (o.params_only) {
    std::vector<ParamEntry> ps;
    local(w, [&] {
      ps = params_of(ha);
      if (ps.empty()) ps = params_of(hb);
    });
    if (!ps.empty()) {
      for (const ParamEntry& p : ps) {
        if (ia.find(p.name)) names_a.push_back(p.name);
        if (ib.find(p.name)) names_b.push_back(p.name);
      }
      // A parameter neither file holds is listed as missing from both below.
      for (const ParamEntry& p : ps) {
        if (!ia.find(p.name) && !ib.find(p.name)) {
          ++meta_differences;
          meta_lines.push_back("  parameter '" + p.name +
                               "' of shardopt.params is in neither file");
        }
      }
    } else {
      for (const auto& t : ha.tensors) names_a.push_back(t.name);
      for (const auto& t : hb.tensors) names_b.push_back(t.name);
    }
  } else {
    for (const auto& t : ha.tensors) names_a.push_back(t.name);
    for (const auto& t : hb.tensors) names_b.push_back(t.name);
  }
  std::vector<std::string> only_a, only_b, mismatched;
  std::vector<Pair> pairs;
  const std::set<std::string> set_a(names_a.begin(), names_a.end());
  const std::set<std::string> set_b(names_b.begin(), names_b.end());
  for (const std::string& n : names_a) {
    const ck::TensorInfo* ta = ia.find(n);
    const ck::TensorInfo* tb = ib.find(n);
    if (tb == nullptr || set_b.count(n) == 0) {
      only_a.push_back(n);
      continue;
    }
    if (ta->shape != tb->shape) {
      mismatched.push_back(n + ": shape " + shape_text(ta->shape) + " vs " + shape_text(tb->shape));
      continue;
    }
    Pair p;
    p.name = n;
    p.a = static_cast<std::size_t>(ta - ha.tensors.data());
    p.b = static_cast<std::size_t>(tb - hb.tensors.data());
    p.es_a = ck::dtype_bytes(ta->dtype);
    p.es_b = ck::dtype_bytes(tb->dtype);
    p.numel = p.es_a == 0 ? 0 : ta->bytes() / p.es_a;
    p.kind_a = kind_of(ta->dtype);
    p.kind_b = kind_of(tb->dtype);
    p.same_dtype = ta->dtype == tb->dtype;
    if (!p.same_dtype && !p.values()) {
      mismatched.push_back(n + ": dtype " + ta->dtype + " vs " + tb->dtype +
                           " (values not comparable)");
      continue;
    }
    pairs.push_back(std::move(p));
  }
  for (const std::string& n : names_b) {
    if (ia.find(n) == nullptr || set_a.count(n) == 0) only_b.push_back(n);
  }
  differences += meta_differences + only_a.size() + only_b.size() + mismatched.size();

  // Values: windows of elements of the pairs, both files read at once.
  std::vector<u64> numel, cost, align;
  u64 total = 0;
  for (const Pair& p : pairs) {
    numel.push_back(p.numel);
    cost.push_back(p.es_a + p.es_b);
    align.push_back(ha.chunk_bytes > 0 && ha.chunk_bytes % p.es_a == 0 ? ha.chunk_bytes / p.es_a
                                                                       : 1);
    total += p.numel * (p.es_a + p.es_b);
  }
  const std::vector<Window> windows = plan_windows(numel, cost, align, total, w, o.window);
  const std::size_t rounds = rounds_of(windows.size(), w.size);
  u64 biggest_a = 1, biggest_b = 1;
  for_each_my_window(windows, w, [&](const Window& win) {
    u64 ba = 0, bb = 0;
    for (const Unit& u : win) {
      ba += u.count * pairs[u.item].es_a;
      bb += u.count * pairs[u.item].es_b;
    }
    biggest_a = std::max(biggest_a, ba);
    biggest_b = std::max(biggest_b, bb);
  });
  Scratch sa, sb;
  unsigned char *buf_a = nullptr, *buf_b = nullptr;
  local(w, [&] {
    buf_a = sa.get(biggest_a);
    buf_b = sb.get(biggest_b);
  });
  PairStats stats(pairs.size());
  std::vector<double> da, db;
  for (std::size_t k = 0; k < rounds; ++k) {
    std::vector<ck::ReadRange> ranges_a, ranges_b;
    const Window* win = my_window(windows, k, w);
    if (win != nullptr) {
      u64 at_a = 0, at_b = 0;
      for (const Unit& u : *win) {
        const Pair& p = pairs[u.item];
        ranges_a.push_back({p.a, u.first * p.es_a, u.count * p.es_a, buf_a + at_a});
        ranges_b.push_back({p.b, u.first * p.es_b, u.count * p.es_b, buf_b + at_b});
        at_a += u.count * p.es_a;
        at_b += u.count * p.es_b;
      }
    }
    ra.read(ranges_a, /*verify=*/true);
    rb.read(ranges_b, /*verify=*/true);
    if (win != nullptr) {
      for (std::size_t i = 0; i < win->size(); ++i) {
        const Unit& u = (*win)[i];
        compare_run(pairs[u.item], static_cast<const unsigned char*>(ranges_a[i].dst),
                    static_cast<const unsigned char*>(ranges_b[i].dst), u.count, o, stats, u.item,
                    da, db);
      }
    }
  }
  if (!pairs.empty()) {
    const int n = static_cast<int>(pairs.size());
    MPI_Allreduce(MPI_IN_PLACE, stats.max_abs.data(), n, MPI_DOUBLE, MPI_MAX, w.comm);
    MPI_Allreduce(MPI_IN_PLACE, stats.max_rel.data(), n, MPI_DOUBLE, MPI_MAX, w.comm);
    MPI_Allreduce(MPI_IN_PLACE, stats.differ.data(), n, MPI_UINT64_T, MPI_SUM, w.comm);
    MPI_Allreduce(MPI_IN_PLACE, stats.outside.data(), n, MPI_UINT64_T, MPI_SUM, w.comm);
  }

  std::size_t identical = 0, within = 0, different = 0;
  std::vector<std::string> result(pairs.size());
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const Pair& p = pairs[i];
    const std::string dtype_note =
        p.same_dtype ? ""
                     : " (dtype " + ha.tensors[p.a].dtype + " vs " + hb.tensors[p.b].dtype + ")";
    if (stats.differ[i] == 0 && p.same_dtype) {
      result[i] = "identical";
      ++identical;
    } else if (stats.differ[i] == 0 && !o.tolerant()) {
      result[i] = "equal values" + dtype_note;
      ++different;
    } else if (o.tolerant() && stats.outside[i] == 0) {
      result[i] = "within tolerances" + dtype_note;
      ++within;
    } else {
      result[i] = "different" + dtype_note;
      ++different;
    }
  }
  differences += different;

  if (w.rank == 0) {
    auto describe = [](const ck::Header& h) {
      if (h.format_version == 0) return std::string("plain safetensors");
      std::string s = meta(h, kKeyContent, "?");
      if (has_meta(h, kKeyStep)) s += ", step " + meta(h, kKeyStep);
      return s;
    };
    std::printf("A: %s (%s, %zu tensors)\nB: %s (%s, %zu tensors)\n", path_a.c_str(),
                describe(ha).c_str(), ha.tensors.size(), path_b.c_str(), describe(hb).c_str(),
                hb.tensors.size());
    if (o.tolerant()) {
      std::printf("tolerances: |a - b| <= %g + %g * |b|\n", o.atol.value_or(0), o.rtol.value_or(0));
    }
    if (!meta_lines.empty()) {
      std::printf("metadata:\n");
      for (const std::string& l : meta_lines) std::printf("%s\n", l.c_str());
    }
    auto list = [](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      std::printf("%s (%zu):\n", what, v.size());
      for (const std::string& s : v) std::printf("  %s\n", s.c_str());
    };
    list("only in A", only_a);
    list("only in B", only_b);
    list("dtype or shape differs", mismatched);
    if (!pairs.empty()) {
      std::vector<std::string> names;
      for (const Pair& p : pairs) names.push_back(p.name);
      const int nw = static_cast<int>(text_width(names, 6, 60));
      std::printf("%-*s  %-6s  %12s  %10s  %10s  %14s  %s\n", nw, "tensor", "dtype", "elements",
                  "max_abs", "max_rel", "differ", "result");
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        if (o.quiet && result[i] == "identical") continue;
        const Pair& p = pairs[i];
        std::printf("%-*s  %-6s  %12llu  %10s  %10s  %14llu  %s\n", nw, p.name.c_str(),
                    ha.tensors[p.a].dtype.c_str(), static_cast<unsigned long long>(p.numel),
                    p.values() ? number_text(stats.max_abs[i]).c_str() : "-",
                    p.values() ? number_text(stats.max_rel[i]).c_str() : "-",
                    static_cast<unsigned long long>(stats.differ[i]), result[i].c_str());
      }
    }
    std::printf(
        "summary: %s: %zu tensors compared: %zu identical, %zu within tolerances, %zu "
        "different; %zu only in A, %zu only in B, %zu of another dtype or shape; %zu metadata "
        "difference%s%s\n",
        differences == 0 ? (within > 0 ? "equal within tolerances" : "identical") : "different",
        pairs.size(), identical, within, different, only_a.size(), only_b.size(), mismatched.size(),
        meta_differences, meta_differences == 1 ? "" : "s",
        meta_notes == 0 ? ""
                        : (" (and " + std::to_string(meta_notes) +
                           " noted: how the files were written, not what they hold)")
                              .c_str());
    std::fflush(stdout);
  }
  return differences == 0 ? 0 : 1;
}

}  // namespace

int run_diff(shardopt::Communicator& comm, const World& w, const std::string& a,
             const std::string& b, const DiffOptions& o) {
  int rc = 2;
  if (!guarded(w, "diff", [&] { rc = diff_files(comm, w, a, b, o); })) return 2;
  return rc;
}

}  // namespace ckpt_tool
