// shardopt: check_sync(), whether every rank's parameters hold the same
// bytes (stage 3: as gathered, and the whole units). One XXH3-64 per parameter, compared across
// ranks; only when one differs is more sent: that parameter's copy on rank 0, to find the first
// element that differs, and that element's value on every rank.
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "comm/agree.hpp"
#include "common/check.hpp"
#include "common/language.hpp"
#include "shardopt/cast.hpp"
#include "zero/engine.hpp"

namespace shardopt::detail {

namespace {

std::string value_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// "A on ranks 0, 2, B on rank 1": each distinct value with its ranks, in
// the order of the first rank holding it.
template <class T, class Text>
std::string by_value(const std::vector<T>& per_rank, Text text) {
  std::vector<std::pair<T, std::vector<int>>> groups;
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    auto it = groups.begin();
    while (it != groups.end() && std::memcmp(&it->first, &per_rank[r], sizeof(T)) != 0) ++it;
    if (it == groups.end())
      groups.push_back({per_rank[r], {static_cast<int>(r)}});
    else
      it->second.push_back(static_cast<int>(r));
  }
  std::string s;
  for (const auto& [value, ranks] : groups)
    s += (s.empty() ? "" : ", ") + text(value) + " on " + ranks_list(ranks);
  return s;
}

}  // namespace

SyncReport ZeroEngine::check_sync() {
  require_comm("check_sync()");
  // Stage 3: each unit as a gather gives it (the whole units as they are),
  // gathered here one at a time into the pool, which no unit may hold.
  check_released("check_sync()");
  std::size_t open = SIZE_MAX;  // the unit gathered here
  const auto close = [&] {
    if (open != SIZE_MAX && !units_[open].persistent) drop(open);
    open = SIZE_MAX;
  };
  struct Closer {
    const decltype(close)& f;
    ~Closer() { f(); }
  } closer{close};
  const auto where = [&](std::size_t i) -> const std::byte* {
    if (opt_.stage != 3) return static_cast<const std::byte*>(params_[i].data);
    const std::size_t u = unit_of_[i];
    if (u != open) {
      close();
      if (!units_[u].persistent) {
        place(u, false);
        issue(u);
        finish(u);
      }
      open = u;
    }
    return unit_base(u) + (layout_.flat[i] - layout_.units[u].begin) * elem_;
  };
  const int nranks = ctl_.size();
  std::vector<std::int64_t> sums(params_.size());
  // On a device, each parameter is read through host memory.
  std::vector<std::byte> host;
  const auto host_view = [&](const Param& p) -> const std::byte* {
    const std::byte* at = where(static_cast<std::size_t>(&p - params_.data()));
    if (!space_.on_device()) return at;
    host.resize(p.numel * dtype_size(p.dtype));
    space_.download(host.data(), at, host.size());
    return host.data();
  };
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    sums[i] = static_cast<std::int64_t>(XXH3_64bits(host_view(p), p.numel * dtype_size(p.dtype)));
  }
  SyncReport r;
  const std::int64_t first = first_unequal(ctl_, sums);
  if (first < 0) return r;

  const std::size_t i = static_cast<std::size_t>(first);
  const Param& p = params_[i];
  const std::size_t size = dtype_size(p.dtype);
  r.in_sync = false;
  r.param = p.name;
  r.index = i;
  std::vector<std::int64_t> all_sums(static_cast<std::size_t>(nranks));
  ctl_.allgather(&sums[i], all_sums.data(), 1, DType::i64);

  // The first element that differs from rank 0's copy, over all ranks.
  const std::byte* data = host_view(p);
  std::vector<std::byte> ref(p.numel * size);
  if (ctl_.rank() == 0 && !ref.empty()) std::memcpy(ref.data(), data, ref.size());
  ctl_.broadcast(ref.data(), p.numel, p.dtype, 0);
  std::int64_t mine = static_cast<std::int64_t>(p.numel);
  for (std::size_t e = 0; e < p.numel; ++e)
    if (std::memcmp(data + e * size, ref.data() + e * size, size) != 0) {
      mine = static_cast<std::int64_t>(e);
      break;
    }
  ctl_.allreduce(&mine, &mine, 1, DType::i64, ReduceOp::min);
  r.element = static_cast<std::size_t>(mine);

  // That element's value on every rank.
  double value = 0.0;
  if (r.element < p.numel) {
    float f = 0.0f;
    cast(data + r.element * size, p.dtype, &f, DType::f32, 1);
    value = f;
  }
  std::vector<double> values(static_cast<std::size_t>(nranks));
  ctl_.allgather(&value, values.data(), 1, DType::f64);

  r.message = "parameter '" + p.name + "' (index " + index_text(i) + ", " +
              std::to_string(p.numel) + " elements) has " +
              by_value(all_sums,
                       [](std::int64_t v) {
                         char buf[40];
                         std::snprintf(buf, sizeof buf, "checksum %016llx",
                                       static_cast<unsigned long long>(v));
                         return std::string(buf);
                       }) +
              "; its first element that differs is [" +
              index_text(static_cast<long long>(r.element)) + "]: " + by_value(values, value_text);
  return r;
}

}  // namespace shardopt::detail
