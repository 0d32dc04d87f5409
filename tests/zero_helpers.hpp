// Helpers of the ZeRO engine tests: comparisons of the engine against the
// reference of zero_reference.hpp, and a runner that steps the engine and
// the reference side by side and compares them.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/half.hpp"
#include "shardopt/optim.hpp"
#include "shardopt/types.hpp"
#include "shardopt/zero.hpp"
#include "zero_reference.hpp"

namespace shardopt::test::zero {

// ----------------------------------------------------------- comparisons

// |got - want| <= abs + rel * |want|; both zero: bitwise.
struct Tolerance {
  double abs = 0.0;
  double rel = 0.0;
  bool bitwise() const { return abs == 0.0 && rel == 0.0; }
};

// A step whose non-finite verdict the device kept (StepInfo::pending) made
// definite by the count the optimizer gives once it has the verdict.
// pending must be set exactly for device parameters under NonFinite::skip.
// deferrable: the optimizer is element-wise (LAMB's update reads its norms
// on the host, and so decides there).
inline StepInfo settled(ZeroRedundancyOptimizer& opt, StepInfo info, bool skip_policy,
                        bool deferrable = true) {
  CHECK(info.pending == (Model::on_device && skip_policy && deferrable));
  if (!info.pending) return info;
  const std::int64_t steps = opt.steps();
  info.applied = info.grads_finite = steps == info.step;
  info.step = steps;
  info.pending = false;
  return info;
}

inline std::string fmt_float(float v) {
  std::ostringstream s;
  s.precision(9);
  s << v << " (0x" << std::hex << float_bits(v) << ")";
  return s.str();
}

// Allowances on top of a Tolerance, element by element: for each state name
// ("master" for the master weights), per parameter, per element, how far the
// engine may be from the reference. A test derives them from what differs
// between the two runs (test_zero_equivalence.cpp).
using ElementBounds = std::map<std::string, std::vector<std::vector<double>>>;

// The allowances of parameter i's state `name`, or null.
inline const std::vector<double>* element_bounds(const ElementBounds* b, const std::string& name,
                                                 std::size_t i) {
  if (b == nullptr) return nullptr;
  const auto it = b->find(name);
  return it == b->end() || i >= it->second.size() ? nullptr : &it->second[i];
}

// How many elements of `got` are not `want`: bitwise when tol is and no
// allowances are given, else |got - want| <= tol + extra[j]. `first` is the
// first such element. got and want have the same size.
inline std::size_t count_outside(const std::vector<float>& got, const std::vector<float>& want,
                                 Tolerance tol, const std::vector<double>* extra = nullptr,
                                 std::size_t* first = nullptr) {
  std::size_t bad = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    const bool same = tol.bitwise() && extra == nullptr
                          ? float_bits(got[j]) == float_bits(want[j])
                          : std::fabs(static_cast<double>(got[j]) - want[j]) <=
                                tol.abs + tol.rel * std::fabs(static_cast<double>(want[j])) +
                                    (extra != nullptr ? extra->at(j) : 0.0);
    if (!same && bad++ == 0 && first != nullptr) *first = j;
  }
  return bad;
}

// "" if `got` equals `want` (bitwise, or within tol plus extra[j]), else
// where they first differ and how many elements do.
inline std::string compare_floats(const std::vector<float>& got, const std::vector<float>& want,
                                  Tolerance tol, const std::vector<double>* extra = nullptr) {
  if (got.size() != want.size()) {
    return "size " + std::to_string(got.size()) + ", expected " + std::to_string(want.size());
  }
  std::size_t first = 0;
  const std::size_t bad = count_outside(got, want, tol, extra, &first);
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(got.size()) + " differ, first [" +
         std::to_string(first) + "]: " + fmt_float(got[first]) + ", expected " +
         fmt_float(want[first]);
}

inline std::string compare_bits(const std::vector<std::uint32_t>& got,
                                const std::vector<std::uint32_t>& want) {
  if (got.size() != want.size()) {
    return "size " + std::to_string(got.size()) + ", expected " + std::to_string(want.size());
  }
  std::size_t bad = 0, first = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    if (got[j] != want[j] && bad++ == 0) first = j;
  }
  if (bad == 0) return "";
  std::ostringstream s;
  s << bad << " of " << got.size() << " differ, first [" << first << "]: bits 0x" << std::hex
    << got[first] << ", expected 0x" << want[first];
  return s.str();
}

// Collective: true on every rank iff every rank passed the same string.
inline bool same_on_all_ranks(const std::string& s) {
  return shardopt::same_on_all_ranks(verdicts(), s);
}

// Collective: every rank's owned_ranges(), indexed by rank.
inline std::vector<std::vector<ShardRange>> all_owned_ranges(const ZeroRedundancyOptimizer& opt) {
  std::vector<unsigned long long> mine;
  for (const ShardRange& r : opt.owned_ranges()) {
    mine.insert(mine.end(), {r.param, r.offset, r.count, r.shard_offset});
  }
  const int n = world_size();
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < n; ++r) {
    displs[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::vector<unsigned long long> all(static_cast<std::size_t>(total));
  MPI_Allgatherv(mine.data(), count, MPI_UNSIGNED_LONG_LONG, all.data(), counts.data(),
                 displs.data(), MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
  std::vector<std::vector<ShardRange>> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int k = displs[static_cast<std::size_t>(r)];
         k < displs[static_cast<std::size_t>(r)] + counts[static_cast<std::size_t>(r)]; k += 4) {
      const auto* v = &all[static_cast<std::size_t>(k)];
      out[static_cast<std::size_t>(r)].push_back(
          ShardRange{.param = v[0], .offset = v[1], .count = v[2], .shard_offset = v[3]});
    }
  }
  return out;
}

// Elements of this rank's shard (the sum of its owned ranges).
inline std::size_t shard_elements(const ZeroRedundancyOptimizer& opt) {
  std::size_t n = 0;
  for (const ShardRange& r : opt.owned_ranges()) n += r.count;
  return n;
}

// ------------------------------------------------------------------ runner

// When parameters are marked ready.
enum class Ready {
  none,              // never: step() reduces everything at once
  forward,           // 0, 1, 2, ...
  reverse,           // the order of a backward pass
  scratch,           // reverse, each gradient passed in one reused scratch buffer
  scratch_forward,   // forward, from the scratch buffer (out of bucket order)
  scratch_shuffled,  // from the scratch buffer in an order drawn per rank and micro-batch
};

inline const char* ready_name(Ready r) {
  switch (r) {
    case Ready::none:
      return "not marked ready";
    case Ready::forward:
      return "ready in forward order";
    case Ready::reverse:
      return "ready in reverse order";
    case Ready::scratch:
      return "ready from a scratch buffer";
    case Ready::scratch_forward:
      return "ready in forward order from a scratch buffer";
    case Ready::scratch_shuffled:
      return "ready in a different order on each rank, from a scratch buffer";
  }
  return "?";
}

struct Run {
  Layout layout;
  Precision precision = Precision::f32;
  std::vector<OptimizerConfig> groups;
  ZeroOptions options{};
  GradKind kind = GradKind::exact;
  std::uint64_t key = 1;  // the data
  int steps = 3;
  // Micro-batches per step: stage 2 reduce_gradients() after each (the
  // last one only when reduce_last, else step() reduces it), stages 0 and
  // 1, and stage 2 with accumulate_locally, add them up in the gradient
  // buffers and mark them ready in the last one only.
  int micro_batches = 1;
  bool reduce_last = false;
  bool accumulate_locally = false;
  Ready ready = Ready::reverse;
  bool contiguous = false;
  bool owned_grads = false;
  bool distributed = false;  // DistributedOptimizer instead of ZeroRedundancyOptimizer
  // Parameters (and masters and states) against the reference: bitwise, or
  // within this tolerance (16-bit parameters then within it plus one ulp).
  Tolerance tolerance{};
  std::optional<Tolerance> state_tolerance;  // of the gathered states; default `tolerance`
  // Allowed on top of the tolerances, element by element ("master": the
  // parameters after every step and the gathered masters; each state name:
  // the gathered state). With bounds, nothing is compared bitwise.
  std::shared_ptr<const ElementBounds> bounds;
  bool compare_reference = true;
  // Hooks, each on every rank (collectives allowed: every rank calls them
  // in the same order). before_step: before the step's gradients are
  // written (learning rate schedules: change the optimizer and the
  // reference alike). before_update: after the gradients are reduced or
  // written, before step(); returns the grad_mul of the reference step
  // (given the default). after_step: after step() and the reference step.
  std::function<void(ZeroRedundancyOptimizer&, Reference&, int)> before_step;
  std::function<double(ZeroRedundancyOptimizer&, const Grads&, int, double)> before_update;
  std::function<void(ZeroRedundancyOptimizer&, const StepInfo&, const Grads&, int)> after_step;
};

inline std::string describe(const Run& run) {
  std::ostringstream s;
  s << (run.distributed ? "DistributedOptimizer"
                        : "ZeRO stage " + std::to_string(run.options.stage))
    << " at " << world_size() << " ranks, " << describe(run.groups.at(0));
  if (run.groups.size() > 1) s << " (+" << run.groups.size() - 1 << " groups)";
  s << ", " << precision_name(run.precision) << ", "
    << (run.kind == GradKind::exact ? "exact" : "random") << " gradients, " << run.layout.size()
    << " params (" << run.layout.total() << " elements), "
    << (run.contiguous ? "one contiguous buffer" : "separate buffers")
    << (run.owned_grads ? ", owned gradients" : "") << ", " << ready_name(run.ready)
    << ", bucket_mb " << run.options.bucket_mb << ", " << run.steps << " steps";
  if (run.micro_batches > 1) {
    s << " of " << run.micro_batches << " micro-batches";
    if (run.accumulate_locally || run.options.stage != 2) {
      s << " accumulated locally";
    } else {
      s << (run.reduce_last ? ", reduce_gradients() after each"
                            : ", reduce_gradients() after each but the last");
    }
  }
  if (run.options.reduction == GradReduction::sum) s << ", reduction sum";
  if (run.options.reduce_in_fp32) s << ", reduce_in_fp32";
  if (run.options.predivide_factor != 1.0) s << ", predivide " << run.options.predivide_factor;
  return s.str();
}

// The engine's state after a run: its parameters (the model's buffers, as
// bits) and every state gathered.
// A run of one optimizer group with default options but the stage.
inline Run base_run(const Layout& layout, Precision p, OptimizerConfig cfg, int stage, int steps) {
  Run run;
  run.layout = layout;
  run.precision = p;
  run.groups = {std::move(cfg)};
  run.options.stage = stage;
  run.steps = steps;
  return run;
}

// The l2 norm, in double, of the averaged reduced gradients.
inline double averaged_norm(const Grads& summed, int ranks) {
  double s = 0.0;
  for (const auto& g : summed)
    for (float x : g) {
      const double a = static_cast<double>(x) / ranks;
      s += a * a;
    }
  return std::sqrt(s);
}

struct Snapshot {
  std::vector<std::vector<std::uint32_t>> params;
  std::map<std::string, std::vector<std::vector<float>>> states;
};

struct Outcome {
  bool ok = false;  // the same on every rank
  Snapshot last;
};

// "" if a and b are bitwise equal.
inline std::string compare_snapshots(const Snapshot& a, const Snapshot& b) {
  if (a.params.size() != b.params.size()) return "different numbers of parameters";
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    const std::string d = compare_bits(a.params[i], b.params[i]);
    if (!d.empty()) return "param " + std::to_string(i) + ": " + d;
  }
  if (a.states.size() != b.states.size()) return "different sets of states";
  for (const auto& [name, va] : a.states) {
    auto it = b.states.find(name);
    if (it == b.states.end()) return "state " + name + " missing";
    for (std::size_t i = 0; i < va.size(); ++i) {
      const std::string d = compare_floats(va[i], it->second.at(i), Tolerance{});
      if (!d.empty()) return "state " + name + " of param " + std::to_string(i) + ": " + d;
    }
  }
  return "";
}

// The grad_mul of a step: 1/N for the average, 1 for the sum.
inline double default_grad_mul(const ZeroOptions& o, int ranks) {
  return o.reduction == GradReduction::avg ? 1.0 / ranks : 1.0;
}

// Collective: runs the engine and the reference side by side, comparing the
// parameters after every step and, at the end, every gathered state; CHECKs
// the verdict (one for all ranks) and returns it with the engine's final
// state.
inline Outcome run_and_compare(const Run& run) {
  Outcome out;
  INFO(describe(run));
  const int n = world_size();
  const int rank = world_rank();
  const DType dtype = param_dtype(run.precision);
  const bool owned = run.owned_grads;
  ZeroOptions options = run.options;
  options.param_remainders = run.precision == Precision::bf16_rem;
  Model model(run.layout, dtype, run.contiguous, owned, run.key);
  Reference ref(model, run.precision, run.groups);
  std::string failure;  // this rank's first problem
  auto fail = [&](const std::string& what) {
    if (failure.empty()) failure = what;
  };

  std::unique_ptr<ZeroRedundancyOptimizer> opt;
  bool made = no_throw([&] {
    if (run.distributed) {
      opt = std::make_unique<DistributedOptimizer>(world(), model.params(), run.groups, options);
    } else {
      opt = std::make_unique<ZeroRedundancyOptimizer>(world(), model.params(), run.groups, options);
    }
  });
  if (!all_ranks_true(made)) {
    CHECK(made);
    return out;
  }
  const int stage = opt->stage();
  const bool from_scratch = run.ready == Ready::scratch || run.ready == Ready::scratch_forward ||
                            run.ready == Ready::scratch_shuffled;
  if (from_scratch && run.micro_batches > 1 && (stage != 2 || run.accumulate_locally)) {
    fail("the test asks for a scratch buffer with local accumulation, which it cannot add to");
  }
  std::vector<std::byte> scratch(run.layout.largest() * dtype_size(dtype));
  // A device run passes its gradients from a device copy of the scratch.
  void* dev_scratch = nullptr;
#if SHARDOPT_TEST_DEVICE
  dev_scratch = sim::runtime().allocate(scratch.size() + 1, "the scratch gradient");
  struct Release {
    void* p;
    ~Release() { sim::runtime().release(p); }
  } release_scratch{dev_scratch};
#endif
  const Tolerance tol = run.tolerance;

  for (int s = 0; s < run.steps; ++s) {
    Grads summed;
    StepInfo info;
    bool stepped = no_throw([&] {
      if (run.before_step) run.before_step(*opt, ref, s);
      opt->zero_grad();
      const int m_count = run.micro_batches;
      for (int m = 0; m < m_count; ++m) {
        const std::int64_t batch = static_cast<std::int64_t>(s) * m_count + m;
        const bool last = m == m_count - 1;
        add_into(summed, reduced_grads(run.layout, dtype, run.kind, run.key, batch, n, 1.0f,
                                       options.reduce_in_fp32 ? DType::f32 : dtype));
        // Stages 0 and 1 accumulate locally and are told nothing until the
        // last micro-batch; stage 2 reduces every micro-batch unless told to
        // accumulate locally too.
        const bool local = stage != 2 || run.accumulate_locally;
        const bool add = local && m > 0;
        const bool mark = !local || last;
        std::vector<std::size_t> order(run.layout.size());
        for (std::size_t i = 0; i < order.size(); ++i) {
          const bool forward = run.ready == Ready::forward || run.ready == Ready::scratch_forward;
          order[i] = forward ? i : order.size() - 1 - i;
        }
        if (run.ready == Ready::scratch_shuffled) {
          std::mt19937 draw(static_cast<unsigned>(1000 * batch + rank));
          std::shuffle(order.begin(), order.end(), draw);
        }
        for (std::size_t i : order) {
          const std::size_t numel = run.layout.sizes[i];
          if (from_scratch) {
            // Garbage first, so a late copy from the scratch would show.
            std::memset(scratch.data(), 0x7f, scratch.size());
            fill_grad(scratch.data(), dtype, numel, run.kind, run.key, batch, rank, i, false);
            if (Model::on_device) {
              Model::upload(dev_scratch, scratch.data(), numel * dtype_size(dtype));
              opt->grad_ready(i, dev_scratch);
            } else {
              opt->grad_ready(i, scratch.data());
            }
            continue;
          }
          void* g = owned ? opt->grad(i) : model.grad_data(i);
          if (numel > 0) {
            // A device run writes the host mirror and copies it over.
            void* h = Model::on_device ? model.grad_host(i) : g;
            fill_grad(h, dtype, numel, run.kind, run.key, batch, rank, i, add);
            if (Model::on_device) Model::upload(g, h, numel * dtype_size(dtype));
          }
          if (mark && run.ready != Ready::none) opt->grad_ready(i);
        }
        if (!local && (!last || run.reduce_last)) opt->reduce_gradients();
      }
      double grad_mul = default_grad_mul(options, n);
      if (run.before_update) grad_mul = run.before_update(*opt, summed, s, grad_mul);
      const bool skip = options.non_finite == NonFinite::skip ||
                        (options.non_finite == NonFinite::automatic && options.loss_scaler);
      info = settled(*opt, opt->step(), skip, !std::holds_alternative<Lamb>(run.groups[0]));
      ref.step(summed, grad_mul);
      if (run.after_step) run.after_step(*opt, info, summed, s);
    });
    if (!stepped) fail("step " + std::to_string(s + 1) + " threw");
    if (!all_ranks_true(stepped)) break;
    if (!info.applied) fail("step " + std::to_string(s + 1) + " was not applied");
    if (info.step != ref.steps() || opt->steps() != ref.steps()) {
      fail("step " + std::to_string(s + 1) + ": StepInfo::step " + std::to_string(info.step) +
           ", steps() " + std::to_string(opt->steps()));
    }
    if (!run.compare_reference) continue;
    model.pull();
    for (std::size_t i = 0; i < run.layout.size() && failure.empty(); ++i) {
      std::string d;
      if (tol.bitwise() && !run.bounds) {
        d = compare_bits(model.all_bits(i), ref.param_bits(i));
      } else {
        // The engine's parameters against the reference's master: the
        // 16-bit copy may round to either neighbour of a master that moved
        // within the tolerance.
        const std::vector<float> want = ref.master(i);
        const std::vector<double>* extra = element_bounds(run.bounds.get(), "master", i);
        bool ok = true;
        std::size_t bad = 0;
        for (std::size_t j = 0; j < want.size(); ++j) {
          const float got = model.param(i, j);
          const double allowed = tol.abs + tol.rel * std::fabs(static_cast<double>(want[j])) +
                                 (extra != nullptr ? extra->at(j) : 0.0) + ulp16(dtype, want[j]);
          if (!(std::fabs(static_cast<double>(got) - want[j]) <= allowed)) {
            if (ok) {
              std::ostringstream w;
              w << "[" << j << "]: " << fmt_float(got) << ", master expected "
                << fmt_float(want[j]);
              d = w.str();
            }
            ok = false;
            ++bad;
          }
        }
        if (!ok) d = std::to_string(bad) + " elements off, first " + d;
      }
      if (!d.empty()) {
        fail("after step " + std::to_string(s + 1) + ", parameter " + run.layout.names[i] + ": " +
             d);
      }
    }
  }

  // The states: their names, then each gathered and compared.
  std::vector<std::string> expect = {"master"};
  for (const std::string& name : optimizer_state_names(run.groups.at(0))) expect.push_back(name);
  std::vector<std::string> names = opt->state_names();
  bool names_ok = !names.empty() && names[0] == "master";
  {
    std::vector<std::string> a(names), b(expect);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    names_ok = names_ok && a == b;
  }
  if (!names_ok) {
    std::string got;
    for (const std::string& x : names) got += " " + x;
    fail("state_names():" + got);
  }
  if (all_ranks_true(names_ok)) {
    model.pull();
    for (std::size_t i = 0; i < run.layout.size(); ++i)
      out.last.params.push_back(model.all_bits(i));
    const bool gathered = no_throw([&] {
      for (const std::string& name : expect) {
        auto& per_param = out.last.states[name];
        for (std::size_t i = 0; i < run.layout.size(); ++i) {
          per_param.push_back(opt->gather_state(name, i));
          if (!run.compare_reference) continue;
          const std::vector<float> want = name == "master" ? ref.master(i) : ref.state(name, i);
          const Tolerance t = name == "master" ? tol : run.state_tolerance.value_or(tol);
          const std::string d =
              compare_floats(per_param.back(), want, t, element_bounds(run.bounds.get(), name, i));
          if (!d.empty()) fail("gather_state(\"" + name + "\", " + run.layout.names[i] + "): " + d);
        }
      }
      // state(i): every state of parameter i at once, as gather_state().
      for (std::size_t i = 0; i < run.layout.size(); ++i) {
        const std::map<std::string, std::vector<float>> all = opt->state(i);
        if (all.size() != expect.size()) {
          fail("state(" + std::to_string(i) + ") has " + std::to_string(all.size()) + " states");
        }
        for (const auto& [name, values] : all) {
          auto it = out.last.states.find(name);
          const std::string d = it == out.last.states.end()
                                    ? "not a state name"
                                    : compare_floats(values, it->second[i], Tolerance{});
          if (!d.empty()) fail("state(" + std::to_string(i) + ")[\"" + name + "\"]: " + d);
        }
      }
    });
    if (!gathered) fail("gather_state or state threw");
  }
  // 16-bit parameters are the masters rounded (to nearest even; with
  // remainders, the encoding's rounding) whatever the tolerance.
  if (dtype != DType::f32 && out.last.states.count("master") != 0) {
    for (std::size_t i = 0; i < run.layout.size(); ++i) {
      const std::vector<float>& m = out.last.states["master"][i];
      std::vector<std::uint32_t> want(m.size());
      if (run.precision == Precision::bf16_rem) {
        std::vector<bfloat16> h(m.size());
        std::vector<std::uint16_t> r(m.size());
        functional::encode_param_remainders(m, h, r);
        for (std::size_t j = 0; j < m.size(); ++j) want[j] = h[j].bits;
      } else {
        for (std::size_t j = 0; j < m.size(); ++j) {
          want[j] = dtype == DType::bf16 ? bf16_from_float(m[j]).bits : f16_from_float(m[j]).bits;
        }
      }
      const std::string d = compare_bits(model.all_bits(i), want);
      if (!d.empty()) fail("parameter " + run.layout.names[i] + " is not its master rounded: " + d);
    }
  }
  if (!failure.empty()) UNSCOPED_INFO("rank " << rank << ": " << failure);
  out.ok = all_ranks_true(failure.empty());
  CHECK(out.ok);
  return out;
}

// ---------------------------------------------------------------- errors

// What an error looked like on this rank.
struct Caught {
  bool threw = false;
  bool is_shardopt = false;
  ErrorCode code = ErrorCode::internal;
  std::string message, hint, what;
  int rank = -2;
};

template <class F>
Caught catch_error(F&& f) {
  Caught c;
  try {
    f();
  } catch (const Error& e) {
    c.threw = c.is_shardopt = true;
    c.code = e.code();
    c.message = e.message();
    c.hint = e.hint();
    c.what = e.what();
    c.rank = e.rank();
  } catch (const std::exception& e) {
    c.threw = true;
    c.what = e.what();
  } catch (...) {
    c.threw = true;
    c.what = "something that is not a std::exception";
  }
  return c;
}

// Whether `message` mentions `needle`, or one of its alternatives
// separated by '|' ("layer1.bias|parameter 1": by name or by index).
inline bool mentions(const std::string& message, const std::string& needle) {
  std::size_t start = 0;
  while (true) {
    const std::size_t bar = needle.find('|', start);
    const std::string alt = needle.substr(start, bar == std::string::npos ? bar : bar - start);
    if (message.find(alt) != std::string::npos) return true;
    if (bar == std::string::npos) return false;
    start = bar + 1;
  }
}

// Checks an error caught on every rank: a shardopt::Error with one of
// `codes`, mentioning each of `needles` (see mentions()), a hint, this
// rank's rank, and (same_message) the same message on every rank.
// Collective.
inline void check_caught(const Caught& c, std::vector<ErrorCode> codes,
                         const std::vector<std::string>& needles, bool same_message) {
  std::string problem;
  if (!c.threw) {
    problem = "no exception";
  } else if (!c.is_shardopt) {
    problem = "not a shardopt::Error: " + c.what;
  } else {
    bool code_ok = false;
    for (ErrorCode k : codes) code_ok = code_ok || c.code == k;
    if (!code_ok) problem = std::string("code ") + error_code_name(c.code);
    for (const std::string& needle : needles) {
      if (!mentions(c.message, needle) && problem.empty()) {
        problem = "the message does not mention \"" + needle + "\"";
      }
    }
    if (c.hint.empty() && problem.empty()) problem = "no hint";
    if (c.rank != world_rank() && problem.empty())
      problem = "Error::rank() " + std::to_string(c.rank);
  }
  std::string expected;
  for (ErrorCode k : codes)
    expected += std::string(expected.empty() ? "" : " or ") + error_code_name(k);
  INFO("expected " << expected << " on every rank");
  if (!problem.empty()) {
    UNSCOPED_INFO("rank " << world_rank() << ": " << problem << " (" << c.what << ")");
  }
  CHECK(all_ranks_true(problem.empty()));
  if (same_message) {
    const bool same = same_on_all_ranks(c.message);
    if (!same) UNSCOPED_INFO("rank " << world_rank() << ": message \"" << c.message << "\"");
    CHECK(same);
  }
  // Nothing left half-done: the world still reduces.
  CHECK(all_ranks_true(no_throw([] { world().barrier(); })));
}

}  // namespace shardopt::test::zero
