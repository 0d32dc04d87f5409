// shardopt-plan: the model's parameters, from a count, a list of shapes or
// a safetensors file's header (shardopt::ckpt::parse_header, which
// validates it as every shardopt reader does).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "plan/plan.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/error.hpp"
#include "shardopt/optimizers.hpp"
#include "support/cli.hpp"

namespace plan {

std::optional<shardopt::DType> dtype_of(const std::string& name) {
  if (name == "f32") return shardopt::DType::f32;
  if (name == "bf16") return shardopt::DType::bf16;
  if (name == "f16") return shardopt::DType::f16;
  return std::nullopt;
}

std::optional<shardopt::OptimizerConfig> optimizer_of(const std::string& key) {
  std::optional<shardopt::OptimizerConfig> out;
  shardopt::Optimizers::each([&]<class O>() {
    if (key != O::key) return;
    O o{};
    if constexpr (std::is_same_v<O, shardopt::SGD>) o.momentum = 0.9;
    out = o;
  });
  return out;
}

std::string optimizer_keys() {
  std::string keys;
  shardopt::Optimizers::each(
      [&]<class O>() { keys += std::string(keys.empty() ? "" : " ") + O::key; });
  return keys;
}

namespace {

// "4096x11008*32" -> 32 tensors of 4096 * 11008 elements.
void add_shape(std::string_view item, Model& m) {
  std::size_t repeat = 1;
  if (const std::size_t star = item.find('*'); star != std::string_view::npos) {
    const auto r = cli::parse_unsigned(item.substr(star + 1));
    if (!r || *r == 0 || *r > 1000000)
      throw InputError{"-t (--tensors): bad repeat in '" + std::string(item) +
                       "'; write SHAPE*N with N from 1 to 1000000"};
    repeat = *r;
    item = item.substr(0, star);
  }
  std::size_t numel = 1;
  std::string_view rest = item;
  while (true) {
    const std::size_t x = rest.find('x');
    const auto d = cli::parse_unsigned(rest.substr(0, x));
    if (!d || *d > (std::uint64_t{1} << 50) || (*d > 0 && numel > (std::size_t{1} << 50) / *d))
      throw InputError{"-t (--tensors): bad shape '" + std::string(item) +
                       "'; write dimensions separated by x, e.g. 4096x4096 or 4096"};
    numel *= *d;
    if (x == std::string_view::npos) break;
    rest = rest.substr(x + 1);
  }
  for (std::size_t k = 0; k < repeat; ++k) m.numel.push_back(numel);
}

std::string read_header(const std::string& path, std::uint64_t& file_bytes) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw InputError{"-f (--from): cannot open '" + path + "': " + std::strerror(errno)};
  file_bytes = static_cast<std::uint64_t>(f.tellg());
  const std::string not_st = "-f (--from): '" + path + "' is not a safetensors file: ";
  if (file_bytes < 8) throw InputError{not_st + "shorter than the 8-byte header length"};
  f.seekg(0);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | len[k];
  if (n == 0 || n > shardopt::ckpt::kMaxHeaderBytes || n > file_bytes - 8)
    throw InputError{not_st + "its first 8 bytes give a header of " + std::to_string(n) +
                     " bytes, in a file of " + std::to_string(file_bytes)};
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  if (!f) throw InputError{"-f (--from): reading '" + path + "' failed"};
  return header;
}

void load_file(const std::string& path, Model& m) {
  std::uint64_t file_bytes = 0;
  const std::string text = read_header(path, file_bytes);
  shardopt::ckpt::Header h;
  try {
    h = shardopt::ckpt::parse_header(text, file_bytes);
  } catch (const shardopt::Error& e) {
    throw InputError{"-f (--from): '" + path + "' is not a valid safetensors file: " + e.message()};
  }
  m.source = path;
  const auto meta = [&](const char* key) -> std::string {
    const auto it = h.metadata.find(key);
    return it == h.metadata.end() ? std::string() : it->second;
  };
  if (const auto d = dtype_of(meta("shardopt.dtype"))) m.dtype = d;
  if (meta("shardopt.content") == "checkpoint") {
    // The parameters in registration order, as the optimizer had them.
    m.optimizer = meta("shardopt.optimizer");
    try {
      const nlohmann::json params = nlohmann::json::parse(meta("shardopt.params"));
      if (!params.is_array()) throw std::runtime_error("not an array");
      for (const nlohmann::json& p : params) {
        if (!p.is_object() || !p.contains("name") || !p["name"].is_string() ||
            !p.contains("numel") || !p["numel"].is_number_unsigned())
          throw std::runtime_error("an entry without a name and a numel");
        m.numel.push_back(p["numel"].get<std::size_t>());
      }
    } catch (const std::exception& e) {
      throw InputError{"-f (--from): '" + path + "': its shardopt.params metadata is malformed (" +
                       e.what() + ")"};
    }
    return;
  }
  // An export or any model file: every floating-point tensor.
  for (const shardopt::ckpt::TensorInfo& t : h.tensors) {
    std::optional<shardopt::DType> d;
    for (shardopt::DType x : {shardopt::DType::f32, shardopt::DType::bf16, shardopt::DType::f16})
      if (t.dtype == shardopt::ckpt::dtype_name(x)) d = x;
    if (!d) continue;
    if (!m.dtype) m.dtype = d;
    std::size_t numel = 1;
    for (std::uint64_t s : t.shape) numel *= static_cast<std::size_t>(s);
    m.numel.push_back(numel);
  }
  if (m.numel.empty())
    throw InputError{"-f (--from): '" + path +
                     "' holds no F32, BF16 or F16 tensor: no parameter to plan for"};
}

}  // namespace

Model flat_model(const Options& o, std::uint64_t n, std::size_t parts) {
  if (n < parts)
    throw InputError{"--units " + std::to_string(parts) + " with " + std::to_string(n) +
                     " parameters: a unit needs one parameter at least; give N up to " +
                     std::to_string(n)};
  Model m;
  for (std::size_t k = 0; k < parts; ++k)
    m.numel.push_back(static_cast<std::size_t>(n / parts + (k < n % parts ? 1 : 0)));
  if (o.unit_count > 0 || !o.unit_list.empty())
    for (std::size_t k = 0; k < parts; ++k) m.units.push_back(static_cast<int>(k));
  return m;
}

std::vector<int> units_of(const Options& o, const std::vector<std::size_t>& numel) {
  const std::size_t t = numel.size();
  const std::string tensors = std::to_string(t) + " tensor" + (t == 1 ? "" : "s");
  if (!o.unit_list.empty()) {
    const std::vector<int>& u = o.unit_list;
    if (u.size() != t)
      throw InputError{"--units gives " + std::to_string(u.size()) + " unit" +
                       (u.size() == 1 ? "" : "s") + " for the model's " + tensors +
                       ": give one Param::unit per tensor (" + std::to_string(t) +
                       " numbers), or one number N to cut the model into N units"};
    // The engine's rule (a unit's parameters consecutive), named here in
    // the command line's words.
    for (std::size_t i = 1; i < t; ++i)
      for (std::size_t j = 0; u[i] >= 0 && u[i] != u[i - 1] && j + 1 < i; ++j)
        if (u[j] == u[i])
          throw InputError{"--units: unit " + std::to_string(u[i]) + " is split (tensors " +
                           std::to_string(j) + " and " + std::to_string(i) +
                           ", other units between): give a unit's tensors consecutive places"};
    return u;
  }
  if (o.unit_count == 0) return {};
  const std::size_t parts = o.unit_count;
  if (parts > t)
    throw InputError{"--units " + std::to_string(parts) + ": the model has " + tensors +
                     ", and a unit never splits a tensor: give N from 1 to " + std::to_string(t) +
                     " (-p cuts a flat model into N tensors)"};
  // Unit k takes tensors while the running sum stays nearer its share of
  // what is left (a tensor goes where more than half of it falls), leaving
  // a tensor for each unit after it.
  std::vector<int> out(t);
  double left = 0;
  for (std::size_t n : numel) left += double(n);
  std::size_t i = 0;
  for (std::size_t k = 0; k < parts; ++k) {
    const std::size_t after = parts - k - 1;
    const double share = left / double(parts - k);
    double sum = 0;
    do {
      out[i] = static_cast<int>(k);
      sum += double(numel[i]);
      ++i;
    } while (i < t - after && (after == 0 || sum + double(numel[i]) / 2.0 <= share));
    left -= sum;
  }
  return out;
}

std::size_t count_units(const std::vector<int>& units, std::size_t tensors) {
  if (units.empty()) return tensors;
  std::size_t n = 0;
  for (std::size_t i = 0; i < units.size(); ++i)
    n += i == 0 || units[i] < 0 || units[i] != units[i - 1] ? 1 : 0;
  return n;
}

Model load_model(const Options& o) {
  Model m;
  if (o.params) {
    const std::size_t parts = std::max<std::size_t>(1, o.unit_count);
    m = flat_model(o, *o.params, parts);
    m.source = std::to_string(*o.params) + " parameters as " +
               (parts == 1 ? "one tensor" : "near-equal tensors (--units)");
  } else if (!o.tensors.empty()) {
    for (std::string_view item : cli::split(o.tensors)) add_shape(item, m);
    m.source = std::to_string(m.numel.size()) + " tensors (-t)";
  } else {
    load_file(o.file, m);
  }
  if (m.total() == 0) throw InputError{"the model has no parameters (every tensor is empty)"};
  m.units = units_of(o, m.numel);
  return m;
}

}  // namespace plan
