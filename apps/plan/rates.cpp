// shardopt-plan: the machine's rates. The collectives' two hops (plan.hpp)
// fitted to shardopt-bench-comm --json rows; the update's memory rate from
// shardopt-bench-optim --json rows; or the rates given on the command line.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "plan/plan.hpp"
#include "support/optim_steps.hpp"

namespace plan {

namespace {

using Json = nlohmann::json;

// The JSON objects of a file's lines that start with '{' (what --json
// prints; other lines, a header redirected into the file, are skipped).
std::vector<Json> read_rows(const std::string& path, const char* option, const char* program) {
  std::ifstream f(path);
  if (!f) throw InputError{std::string(option) + ": cannot open '" + path + "'"};
  std::vector<Json> rows;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    const std::size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] != '{') continue;
    try {
      rows.push_back(Json::parse(line));
      if (!rows.back().is_object()) throw std::runtime_error("not an object");
    } catch (const std::exception& e) {
      throw InputError{std::string(option) + ": '" + path + "' line " + std::to_string(n) +
                       " is not a JSON object: " + e.what() + " (expected the output of " +
                       program + " --json)"};
    }
  }
  if (rows.empty())
    throw InputError{std::string(option) + ": '" + path + "' holds no JSON row; write it with " +
                     program + " --json > FILE"};
  return rows;
}

double number(const Json& row, const char* key, const std::string& where) {
  if (!row.contains(key) || !row[key].is_number())
    throw InputError{where + ": a row without the number \"" + key + "\""};
  return row[key].get<double>();
}
std::string text(const Json& row, const char* key, const std::string& where) {
  if (!row.contains(key) || !row[key].is_string())
    throw InputError{where + ": a row without the string \"" + key + "\""};
  return row[key].get<std::string>();
}

// t = a + b x by least squares, a >= 0 (a negative intercept refits
// through 0). Absolute errors: the largest rows, whose buffers are past
// the caches as a step's are, decide the bandwidth; the small ones the
// start-up.
std::pair<double, double> fit(const std::vector<std::pair<double, double>>& xt) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, t] : xt) {
    n += 1;
    sx += x;
    sy += t;
    sxx += x * x;
    sxy += x * t;
  }
  const double det = n * sxx - sx * sx;
  double a = det != 0 ? (sy * sxx - sx * sxy) / det : 0;
  double b = det != 0 ? (n * sxy - sx * sy) / det : 0;
  if (a < 0 || det == 0) {
    a = 0;
    b = sxx > 0 ? sxy / sxx : 0;
  }
  return {a, std::max(b, 0.0)};
}

struct CommFile {
  std::string path;
  int nodes = 1, local = 1, ranks = 1;
  std::vector<Json> rows;
};

CommFile read_comm(const std::string& path, bool device) {
  CommFile f;
  f.path = path;
  const std::string where = "-c (--comm) '" + path + "'";
  f.rows = read_rows(path, "-c (--comm)", "shardopt-bench-comm");
  const Json& r = f.rows.front();
  f.ranks = static_cast<int>(number(r, "ranks", where));
  if (!r.contains("nodes"))
    throw InputError{where +
                     ": its rows have no \"nodes\" (written by an older "
                     "shardopt-bench-comm); run this version's to say how the ranks "
                     "were placed"};
  f.nodes = static_cast<int>(number(r, "nodes", where));
  f.local = static_cast<int>(number(r, "local_ranks", where));
  if (f.ranks < 2)
    throw InputError{where +
                     ": measured at 1 rank, where no collective moves data; run it at "
                     "2 ranks or more (mpirun -n 2 shardopt-bench-comm --json)"};
  if (f.local < 1 || f.nodes * f.local != f.ranks)
    throw InputError{where +
                     ": the ranks were not spread evenly over the nodes; measure with "
                     "the same number of ranks on every node"};
  bool any = false;
  for (const Json& row : f.rows)
    any = any || text(row, "memory", where) == (device ? "device" : "host");
  if (!any)
    throw InputError{where + ": no row of " + (device ? "device" : "host") +
                     " memory; run shardopt-bench-comm" + (device ? " --memory device" : "") +
                     " --json for a plan of " + (device ? "device" : "host") + " parameters"};
  return f;
}

// Rows of `op` (in place or not: the engine's form) of the file, as
// (bytes, seconds); large enough that the fit is about bandwidth and the
// start-up alike (4 KiB and up).
std::vector<std::pair<double, double>> rows_of(const CommFile& f, const std::string& op,
                                               bool inplace, bool device) {
  const std::string where = "-c (--comm) '" + f.path + "'";
  std::vector<std::pair<double, double>> xt;
  for (const Json& row : f.rows) {
    if (text(row, "op", where) != op || text(row, "memory", where) != (device ? "device" : "host"))
      continue;
    if (!row.contains("inplace") || row["inplace"] != inplace) continue;
    const double bytes = number(row, "bytes", where), us = number(row, "time_us", where);
    if (bytes >= 4096 && us > 0) xt.emplace_back(bytes, us * 1e-6);
  }
  return xt;
}

// The hop of a ring of K members from the times xt of file f, where a
// collective of B bytes takes t = (K-1) alpha + (K-1)/K B beta.
Hop ring_hop(const CommFile& f, const std::vector<std::pair<double, double>>& xt, double k) {
  const auto [a, b] = fit(xt);
  Hop h;
  h.alpha = a / (k - 1);
  h.beta = b * k / (k - 1);
  h.known = true;
  h.from = f.path;
  return h;
}

// The node hop of a one-node file at L ranks.
Hop node_hop(const CommFile& f, const std::vector<std::pair<double, double>>& xt) {
  return ring_hop(f, xt, f.local);
}

// The network hop of a file over M nodes of L ranks, the node hop (known
// or not: then 0) taken out first: (M-1)/M B through each node's link.
Hop net_hop(const CommFile& f, std::vector<std::pair<double, double>> xt, const Hop& node) {
  const double l = f.local, m = f.nodes;
  if (node.known && l > 1)
    for (auto& [x, t] : xt)
      t = std::max(t - ((l - 1) * node.alpha + (l - 1) / l * x * node.beta), 0.05 * t);
  return ring_hop(f, xt, m);
}

// A hop of the rates given: GB/s, and the latency in us (negative: none
// given, the default).
Hop given(double gbps, double latency_us, double default_us, const char* from) {
  return Hop{(latency_us >= 0 ? latency_us : default_us) * 1e-6, 1.0 / (gbps * 1e9), true, from};
}

}  // namespace

double collective_seconds(const Collective& c, double bytes, int nodes, int local) {
  const double l = local, m = nodes;
  double t = 0;
  if (local > 1) t += (l - 1) * c.node.alpha + (l - 1) / l * bytes * c.node.beta;
  if (nodes > 1) t += (m - 1) * c.net.alpha + (m - 1) / m * bytes * c.net.beta;
  return t;
}

Machine load_machine(const Options& o, const shardopt::OptimizerConfig& optimizer,
                     const std::string& precision) {
  Machine mc;
  std::vector<CommFile> files;
  for (const std::string& p : o.comm_files) files.push_back(read_comm(p, o.device));
  const CommFile* one = nullptr;   // a one-node file
  const CommFile* many = nullptr;  // a several-node file
  for (const CommFile& f : files) (f.nodes == 1 ? one : many) = &f;
  const struct {
    Collective* c;
    const char* op;
    bool inplace;
  } ops[] = {{&mc.reduce_scatter, "reduce_scatter", false},
             {&mc.reduce_scatter_inplace, "reduce_scatter", true},
             {&mc.allgather, "allgather", true}};
  for (const auto& op : ops) {
    for (const CommFile* f : {one, many}) {
      if (f == nullptr) continue;
      const auto xt = rows_of(*f, op.op, op.inplace, o.device);
      if (xt.size() < 2)
        throw InputError{"-c (--comm) '" + f->path + "': fewer than two " + op.op + " rows (" +
                         (op.inplace ? "in place" : "out of place") +
                         ", 4 KiB and more) to fit; run shardopt-bench-comm -t "
                         "reduce_scatter,allgather -b 64K -e 64M --json"};
      if (f == one)
        op.c->node = node_hop(*f, xt);
      else
        op.c->net = net_hop(*f, xt, op.c->node);
    }
    if (o.node_gbps > 0) op.c->node = given(o.node_gbps, o.node_latency_us, 2.0, "--node-gbps");
    if (o.net_gbps > 0) op.c->net = given(o.net_gbps, o.net_latency_us, 5.0, "--net-gbps");
  }
  if (many != nullptr && one == nullptr && o.node_gbps <= 0 && many->local > 1)
    mc.notes.push_back(
        "the node hop is not known (no one-node -c file, no --node-gbps): the "
        "several-node file's times are taken as the network's alone");
  // The update's rate.
  if (o.mem_gbps > 0) {
    mc.update_gbps = o.mem_gbps;
    mc.update_from = "--mem-gbps";
  } else if (!o.optim_file.empty()) {
    const std::string where = "-u (--optim) '" + o.optim_file + "'";
    const std::vector<Json> rows = read_rows(o.optim_file, "-u (--optim)", "shardopt-bench-optim");
    const std::string key = std::visit(
        [](const auto& x) -> std::string {
          if constexpr (requires { x.key; })
            return x.key;
          else
            return "custom";
        },
        optimizer);
    // The rows of this optimizer and precision at their largest size (a
    // shard is large): the rate of one rank's threads (the row with the
    // most threads up to --threads) and of the whole node (the most
    // threads measured), which the ranks of a node share.
    double numel = 0;
    for (const Json& r : rows)
      if (text(r, "optimizer", where) == key && text(r, "precision", where) == precision)
        numel = std::max(numel, number(r, "numel", where));
    double rank_rate = 0, rank_threads = 0, node_rate = 0, node_threads = 0;
    for (const Json& r : rows) {
      if (text(r, "optimizer", where) != key || text(r, "precision", where) != precision ||
          number(r, "numel", where) != numel)
        continue;
      const double t = number(r, "threads", where), rate = number(r, "gbps", where);
      if (t <= o.threads && t > rank_threads) {
        rank_threads = t;
        rank_rate = rate;
      }
      if (t > node_threads) {
        node_threads = t;
        node_rate = rate;
      }
    }
    if (node_threads == 0)
      throw InputError{where + ": no row of optimizer " + key + " at precision " + precision +
                       "; run shardopt-bench-optim -o " + key + " -p " + precision + " --json"};
    if (rank_threads == 0) rank_rate = node_rate / node_threads * o.threads;
    mc.update_gbps = o.device ? node_rate : std::min(rank_rate, node_rate / o.ranks_per_node);
    mc.update_from = o.optim_file;
  }
  return mc;
}

}  // namespace plan
