// scenario_io.cpp — scenario files (YAML) → checked Scenario, and Scenario ⇄ JSON.
//
// Every problem is reported as "FILE:LINE: FIELD: what was expected" (line numbers
// from yaml-cpp marks, 1-based), so a user can jump to the line and fix it. Scalars
// are converted here rather than with YAML::Node::as<>, which would throw bare
// yaml-cpp exceptions without the field's name.
//
// YAML units (converted to SI at once): *_gbps are gigaBITS per second (network
// convention: nvlink_gbps 2400 = 300 GB/s each way); hbm_gbytes_per_s gigaBYTES
// per second (datasheet convention); hbm_gib GiB; peak_tflops 10^12 FLOP/s;
// *_us and synthetic times microseconds.
#include "tdpipe/ir/scenario_io.hpp"

#include "tdpipe/ir/closest.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#if TDPIPE_HAVE_YAML  // off in the `gpu` preset (no yaml-cpp there): JSON scenarios only
#include <yaml-cpp/yaml.h>
#else
#pragma GCC diagnostic ignored "-Wunused-function"  // helpers only the YAML reader uses
#endif

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/ir/scenario_check.hpp"

namespace tdpipe::ir {
namespace {

using nlohmann::json;

const std::vector<std::string>& kScheduleNames = scenario_schedule_names();
const std::vector<std::string>& kDtypes = scenario_dtypes();
const std::vector<std::string>& kMlpNames = scenario_mlp_names();
const std::vector<std::string>& kAttentionNames = scenario_attention_names();
const std::vector<std::string>& kRecomputeNames = scenario_recompute_names();
const std::vector<std::string>& kTopologies = scenario_topologies();

// The keys of `serving:` and of its length distributions, in either file format.
const std::vector<std::string> kServingKeys = {"requests",      "seed",          "prompt",
                                               "output",        "requests_file", "memory_fraction",
                                               "kv_fraction",   "block_tokens",  "max_batch_tokens",
                                               "max_batch_requests", "planner"};
const std::vector<std::string> kLengthKeys = {"distribution", "mean", "sigma", "min", "max"};

// Defaults for fabric latencies: NCCL's tuner assumes ~3.4 µs per NVLink hop and
// ~14 µs per network hop (NVIDIA/nccl src/graph/tuning.cc).
constexpr double kDefaultNvlinkLatencyUs = 3.4;
constexpr double kDefaultIbLatencyUs = 14.0;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
double gbps_to_bytes(double gbit_per_s) { return gbit_per_s * 1e9 / 8.0; }
double us_to_seconds(double us) { return us / 1e6; }  // division rounds once

/// NIC speed a node of this GPU usually has (DGX A100: HDR 200 Gb/s; DGX H100/H200:
/// NDR 400 Gb/s), used when the scenario gives no ib_gbps_per_nic.
double default_nic_gbps(const std::string& gpu_name) {
  if (gpu_name.rfind("h100", 0) == 0 || gpu_name.rfind("h200", 0) == 0) return 400;
  if (gpu_name == "cpu") return 10;
  return 200;
}

std::string join(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names, ", "));
}

/// "did you mean 'x'? " when a known name is a likely typo of `got`, else "".
std::string suggestion(std::string_view got, const std::vector<std::string>& known) {
  auto c = closest(got, known);
  return c ? fmt::format("did you mean '{}'? ", *c) : std::string();
}

std::string one_of(std::string_view what, std::string_view got, const std::vector<std::string>& known) {
  return fmt::format("unknown {} '{}'; {}expected one of: {}", what, got, suggestion(got, known), join(known));
}

#if TDPIPE_HAVE_YAML
/// Where errors point: the source name and a line. Remembers where each field was
/// given, so a rule checked after reading (find_problem) points at its line too.
class Reporter {
 public:
  explicit Reporter(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const YAML::Mark& mark, std::string_view field, std::string_view what) const {
    const int line = mark.is_null() ? 1 : mark.line + 1;
    throw Error(fmt::format("{}:{}: {}: {}", source_, line, field, what));
  }

  void remember(const std::string& field, const YAML::Mark& mark) const { marks_.emplace(field, mark); }
  /// The line of `field`, else of the closest enclosing map given ("parallel.chunks"
  /// left at its default points at "parallel:").
  YAML::Mark mark_of(std::string field) const {
    for (;;) {
      if (auto it = marks_.find(field); it != marks_.end()) return it->second;
      const auto cut = field.find_last_of(".[");
      if (cut == std::string::npos) return YAML::Mark();
      field.resize(cut);
    }
  }

 private:
  std::string source_;
  mutable std::map<std::string, YAML::Mark> marks_;
};

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar:
      return node.Tag() == "!" ? fmt::format("the string \"{}\"", node.Scalar())
                               : fmt::format("'{}'", node.Scalar());
    default: return "an undefined value";
  }
}

bool is_plain_scalar(const YAML::Node& node) {
  return node.IsScalar() && node.Tag() != "!";  // "!" marks a quoted scalar
}

/// One YAML map being read: checks that it is a map, rejects unknown and duplicate
/// keys (suggesting the closest known one), and converts values with field names.
class MapReader {
 public:
  MapReader(const Reporter& rep, const YAML::Node& node, std::string path, YAML::Mark where,
            std::vector<std::string> known)
      : rep_(rep), path_(std::move(path)), where_(where), known_(std::move(known)) {
    if (!node.IsMap())
      rep_.fail(node.IsNull() || node.Mark().is_null() ? where : node.Mark(), label(),
                fmt::format("expected a map with keys ({}), got {}", join(known_), describe(node)));
    // Missing keys point at the parent key's line ("parallel:"), which the user sees.
    where_ = where.is_null() ? node.Mark() : where;
    if (!path_.empty()) rep_.remember(path_, where_);
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;  // a copy: it-> yields a temporary pair
      if (!key.IsScalar())
        rep_.fail(key.Mark(), label(), fmt::format("expected a key name, got {}", describe(key)));
      const std::string name = key.Scalar();
      if (std::find(known_.begin(), known_.end(), name) == known_.end()) {
        rep_.fail(key.Mark(), field(name),
                  fmt::format("unknown key; {}known keys: {}", suggestion(name, known_), join(known_)));
      }
      if (entries_.count(name))
        rep_.fail(key.Mark(), field(name),
                  fmt::format("duplicate key (first given on line {})", entries_.at(name).key_mark.line + 1));
      entries_.emplace(name, Entry{it->second, key.Mark()});
      rep_.remember(field(name), key.Mark());
    }
  }

  std::string label() const { return path_.empty() ? "scenario" : path_; }
  std::string field(std::string_view key) const {
    return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
  }
  bool has(const std::string& key) const { return entries_.count(key) != 0; }
  const YAML::Node& node(const std::string& key) const { return entries_.at(key).value; }
  /// Line of the key if given, else of the map itself (for defaults checked later).
  YAML::Mark mark(const std::string& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? where_ : it->second.key_mark;
  }
  const Reporter& reporter() const { return rep_; }

  [[noreturn]] void missing(const std::string& key, std::string_view expected) const {
    rep_.fail(where_, field(key), fmt::format("missing; expected {}", expected));
  }

  /// An integer ≥ `min`; `def` when absent (nullopt: required).
  int get_int(const std::string& key, std::optional<int> def, int min, std::string_view meaning) const {
    const std::string expected =
        min == 1 ? fmt::format("a positive integer ({})", meaning)
                 : fmt::format("an integer ≥ {} ({})", min, meaning);
    if (!has(key)) {
      if (!def) missing(key, expected);
      return *def;
    }
    const YAML::Node& n = node(key);
    long long v = 0;
    bool ok = is_plain_scalar(n);
    if (ok) {
      const std::string& s = n.Scalar();
      const char* first = s.data() + (s.size() > 1 && s[0] == '+' ? 1 : 0);
      auto [ptr, ec] = std::from_chars(first, s.data() + s.size(), v);
      ok = ec == std::errc() && ptr == s.data() + s.size() && !s.empty();
    }
    if (!ok) rep_.fail(mark(key), field(key), fmt::format("expected {}, got {}", expected, describe(n)));
    if (v < min || v > std::numeric_limits<int>::max())
      rep_.fail(mark(key), field(key), fmt::format("expected {}, got {}", expected, v));
    return static_cast<int>(v);
  }

  /// A finite number ≥ 0 (or > 0 when `positive`); `def` when absent.
  double get_number(const std::string& key, std::optional<double> def, bool positive,
                    std::string_view meaning) const {
    const std::string expected = fmt::format("a {} number ({})", positive ? "positive" : "non-negative", meaning);
    if (!has(key)) {
      if (!def) missing(key, expected);
      return *def;
    }
    const YAML::Node& n = node(key);
    double v = 0;
    bool ok = is_plain_scalar(n);
    if (ok) {
      const std::string& s = n.Scalar();
      const char* first = s.data() + (s.size() > 1 && s[0] == '+' ? 1 : 0);
      auto [ptr, ec] = std::from_chars(first, s.data() + s.size(), v);
      ok = ec == std::errc() && ptr == s.data() + s.size() && !s.empty() && std::isfinite(v);
    }
    if (!ok) rep_.fail(mark(key), field(key), fmt::format("expected {}, got {}", expected, describe(n)));
    if (positive ? !(v > 0) : v < 0)
      rep_.fail(mark(key), field(key), fmt::format("expected {}, got {}", expected, n.Scalar()));
    return v;
  }

  std::string get_string(const std::string& key, std::optional<std::string> def,
                         std::string_view meaning) const {
    if (!has(key)) {
      if (!def) missing(key, fmt::format("a string ({})", meaning));
      return *def;
    }
    const YAML::Node& n = node(key);
    if (!n.IsScalar())
      rep_.fail(mark(key), field(key), fmt::format("expected a string ({}), got {}", meaning, describe(n)));
    return n.Scalar();
  }

  /// A string that must be one of `known`.
  std::string get_choice(const std::string& key, const std::string& def, std::string_view what,
                         const std::vector<std::string>& known) const {
    const std::string v = get_string(key, def, fmt::format("one of {}", join(known)));
    if (std::find(known.begin(), known.end(), v) == known.end())
      rep_.fail(mark(key), field(key), one_of(what, v, known));
    return v;
  }

  bool get_bool(const std::string& key, bool def) const {
    if (!has(key)) return def;
    const YAML::Node& n = node(key);
    if (is_plain_scalar(n)) {
      const std::string& s = n.Scalar();
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
    }
    rep_.fail(mark(key), field(key), fmt::format("expected true or false, got {}", describe(n)));
  }

 private:
  struct Entry {
    YAML::Node value;
    YAML::Mark key_mark;
  };
  const Reporter& rep_;
  std::string path_;
  YAML::Mark where_;
  std::vector<std::string> known_;
  std::map<std::string, Entry> entries_;
};

/// Applies per-GPU overrides (peak_tflops, hbm_gib, hbm_gbytes_per_s, nvlink_gbps) to a spec.
void apply_gpu_overrides(const MapReader& r, GpuSpec& gpu) {
  if (r.has("peak_tflops"))
    gpu.peak_flops = r.get_number("peak_tflops", {}, true, "dense bf16 TFLOP/s per GPU") * 1e12;
  if (r.has("hbm_gib")) gpu.hbm_bytes = r.get_number("hbm_gib", {}, true, "GPU memory in GiB") * kGiB;
  if (r.has("hbm_gbytes_per_s"))
    gpu.hbm_bytes_per_second = r.get_number("hbm_gbytes_per_s", {}, true, "HBM bandwidth in GB/s") * 1e9;
}

GpuSpec read_gpu(const MapReader& r) {
  const std::string name = r.get_string("gpu", std::nullopt, fmt::format("a GPU preset: {}", join(gpu_preset_names())));
  const auto names = gpu_preset_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    r.reporter().fail(r.mark("gpu"), r.field("gpu"), one_of("GPU", name, names));
  return gpu_preset(name);
}

const std::vector<std::string> kGpuOverrideKeys = {"peak_tflops", "hbm_gib", "hbm_gbytes_per_s"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kModelKeys = {"name", "layers", "hidden", "ffn", "heads", "seq",
                                             "vocab", "dtype", "kv_heads", "mlp", "attention"};

ModelConfig read_model(const MapReader& r) {
  ModelConfig m;
  m.name = r.get_string("name", "", "the model's name");
  m.layers = r.get_int("layers", std::nullopt, 1, "transformer layers");
  m.hidden = r.get_int("hidden", std::nullopt, 1, "hidden size");
  m.heads = r.get_int("heads", std::nullopt, 1, "attention heads");
  if (r.has("ffn") || m.hidden > std::numeric_limits<int>::max() / 4)
    m.ffn = r.get_int("ffn", std::nullopt, 1, "MLP inner size; default 4*hidden");
  else
    m.ffn = 4 * m.hidden;
  m.seq = r.get_int("seq", std::nullopt, 1, "sequence length in tokens");
  m.vocab = r.get_int("vocab", std::nullopt, 1, "vocabulary size");
  m.dtype = r.get_choice("dtype", "bf16", "dtype", kDtypes);
  // Left out, kv_heads stays 0 (= heads), as a ModelConfig built in code has it.
  if (r.has("kv_heads"))
    m.kv_heads = r.get_int("kv_heads", std::nullopt, 1, "key/value heads; default heads");
  m.mlp = r.get_choice("mlp", "gelu", "mlp", kMlpNames);
  m.attention = r.get_choice("attention", "flash", "attention", kAttentionNames);
  return m;
}

ClusterConfig read_cluster(const Reporter& rep, const YAML::Node& node, YAML::Mark where) {
  MapReader r(rep, node, "cluster", where,
              with({"gpu", "nodes", "groups", "gpus_per_node", "nvlink_gbps", "ib_gbps_per_nic",
                    "nics_per_node", "topology", "nvlink_latency_us", "ib_latency_us", "host_gbps",
                    "compute_efficiency"},
                   kGpuOverrideKeys));
  ClusterConfig c;
  if (r.has("groups")) {
    if (r.has("gpu") || r.has("nodes"))
      rep.fail(r.mark(r.has("gpu") ? "gpu" : "nodes"), r.has("gpu") ? "cluster.gpu" : "cluster.nodes",
               "give either gpu + nodes (one group) or groups (a list of {gpu, nodes}), not both");
    const YAML::Node& list = r.node("groups");
    if (!list.IsSequence() || list.size() == 0)
      rep.fail(r.mark("groups"), "cluster.groups",
               fmt::format("expected a non-empty list of {{gpu: NAME, nodes: N}}, got {}", describe(list)));
    for (std::size_t i = 0; i < list.size(); ++i) {
      MapReader g(rep, list[i], fmt::format("cluster.groups[{}]", i),
                  list[i].Mark().is_null() ? r.mark("groups") : list[i].Mark(),
                  with({"gpu", "nodes", "nvlink_gbps"}, kGpuOverrideKeys));
      NodeGroup group;
      group.gpu = read_gpu(g);
      apply_gpu_overrides(r, group.gpu);  // cluster-wide overrides first, the group's own win
      apply_gpu_overrides(g, group.gpu);
      if (g.has("nvlink_gbps"))
        group.gpu.nvlink_bytes_per_second =
            gbps_to_bytes(g.get_number("nvlink_gbps", {}, true, "NVLink Gb/s per GPU each way"));
      group.nodes = g.get_int("nodes", std::nullopt, 1, "nodes of this GPU");
      c.groups.push_back(group);
    }
  } else {
    if (!r.has("gpu")) r.missing("gpu", fmt::format("a GPU preset ({}), or groups", join(gpu_preset_names())));
    NodeGroup group;
    group.gpu = read_gpu(r);
    apply_gpu_overrides(r, group.gpu);
    group.nodes = r.get_int("nodes", std::nullopt, 1, "number of nodes");
    c.groups.push_back(group);
  }
  c.gpus_per_node = r.get_int("gpus_per_node", 8, 1, "GPUs per node");
  if (r.has("nvlink_gbps"))
    c.nvlink_bytes_per_second = gbps_to_bytes(r.get_number("nvlink_gbps", {}, true, "NVLink Gb/s per GPU each way"));
  double nic_gbps = std::numeric_limits<double>::max();
  for (const auto& g : c.groups) nic_gbps = std::min(nic_gbps, default_nic_gbps(g.gpu.name));
  c.ib_bytes_per_second_per_nic = gbps_to_bytes(r.get_number("ib_gbps_per_nic", nic_gbps, true, "InfiniBand Gb/s per NIC"));
  c.nics_per_node = r.get_int("nics_per_node", 8, 1, "NICs per node");
  c.topology = r.get_choice("topology", "fat-tree", "topology", kTopologies);
  c.nvlink_latency_seconds =
      us_to_seconds(r.get_number("nvlink_latency_us", kDefaultNvlinkLatencyUs, false, "NVLink latency in µs"));
  c.ib_latency_seconds = us_to_seconds(r.get_number("ib_latency_us", kDefaultIbLatencyUs, false, "network latency in µs"));
  if (r.has("host_gbps"))
    c.host_bytes_per_second = gbps_to_bytes(r.get_number("host_gbps", {}, true, "host-GPU (PCIe) Gb/s per GPU each way"));
  c.compute_efficiency = r.get_number("compute_efficiency", 1.0, true,
                                      "the software stack's speed relative to the cost model, e.g. from "
                                      "`tdpipe calibrate --from-run`");
  return c;
}
#endif  // TDPIPE_HAVE_YAML

#if TDPIPE_HAVE_YAML
ParallelConfig read_parallel(const Reporter& rep, const YAML::Node& node, YAML::Mark where,
                             std::optional<int> default_global_batch) {
  MapReader r(rep, node, "parallel", where,
              {"tensor", "pipeline", "data", "chunks", "micro_batch", "global_batch", "recompute",
               "sequence_parallel", "slices", "memory_budget", "layers_per_stage", "overlap_grad_reduce", "tp_comm_overlap",
               "overlap_p2p", "bucket_mb", "distributed_optimizer", "optimizer", "onebit_warmup_steps", "param_offload",
               "loss_scale", "initial_loss_scale", "loss_scale_window", "min_loss_scale"});
  ParallelConfig p;
  p.tensor = r.get_int("tensor", 1, 1, "tensor-parallel size");
  p.pipeline = r.get_int("pipeline", 1, 1, "pipeline stages");
  p.data = r.get_int("data", 1, 1, "data-parallel replicas");
  p.chunks = r.get_int("chunks", 1, 1, "model chunks per pipeline rank");
  p.micro_batch = r.get_int("micro_batch", 1, 1, "sequences per micro-batch");
  p.global_batch = r.get_int("global_batch", default_global_batch, 1, "sequences per iteration");
  p.recompute = recompute_from(r.get_choice("recompute", "none", "recompute", kRecomputeNames));
  p.sequence_parallel = r.get_bool("sequence_parallel", false);
  if (r.has("slices") && is_plain_scalar(r.node("slices")) && r.node("slices").Scalar() == "auto")
    p.slices_auto = true;
  else
    p.slices = r.get_int("slices", 1, 1, "temporal slices per micro-batch, or auto");
  p.memory_budget = r.get_string("memory_budget", "max", "1f1b, 2x1f1b, max or GiB for the auto scheduler");
  p.overlap_grad_reduce = r.get_bool("overlap_grad_reduce", true);
  p.tp_comm_overlap = r.get_bool("tp_comm_overlap", false);
  p.overlap_p2p = r.get_bool("overlap_p2p", true);
  p.bucket_mb = r.get_number("bucket_mb", 40.0, true, "MiB of gradients per data-parallel bucket");
  p.distributed_optimizer = r.get_bool("distributed_optimizer", false);
  p.optimizer = r.get_choice("optimizer", "adam", "optimizer", scenario_optimizer_names());
  p.onebit_warmup_steps = r.get_int("onebit_warmup_steps", 100, 1, "uncompressed Adam steps before 1-bit Adam");
  p.param_offload = r.get_choice("param_offload", "none", "param_offload", scenario_param_offload_names());
  if (r.has("loss_scale") && is_plain_scalar(r.node("loss_scale")) && r.node("loss_scale").Scalar() == "dynamic")
    p.loss_scale = 0;
  else
    p.loss_scale = r.get_number("loss_scale", 0.0, false, "'dynamic', or a static fp16 loss scale > 0");
  p.initial_loss_scale = r.get_number("initial_loss_scale", 65536.0, true, "the dynamic fp16 loss scale to start from");
  p.loss_scale_window = r.get_int("loss_scale_window", 1000, 1, "steps without overflow before a loss scale doubles");
  p.min_loss_scale = r.get_number("min_loss_scale", 1.0, true, "the smallest dynamic fp16 loss scale");
  if (r.has("layers_per_stage")) {
    const YAML::Node& n = r.node("layers_per_stage");
    const std::string expected = "auto or a list of layer counts, one per virtual stage (pipeline*chunks)";
    if (is_plain_scalar(n) && n.Scalar() == "auto") {
      p.layers_per_stage_auto = true;
    } else if (n.IsSequence()) {
      for (std::size_t i = 0; i < n.size(); ++i) {
        const std::string at = fmt::format("parallel.layers_per_stage[{}]", i);
        const YAML::Node item = n[i];
        rep.remember(at, item.Mark());
        long long v = 0;
        bool ok = is_plain_scalar(item);
        if (ok) {
          const std::string& text = item.Scalar();
          auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          ok = ec == std::errc() && ptr == text.data() + text.size() && !text.empty() && v >= 1 &&
               v <= std::numeric_limits<int>::max();
        }
        if (!ok) rep.fail(item.Mark(), at, fmt::format("expected a positive integer (layers), got {}", describe(item)));
        p.layers_per_stage.push_back(static_cast<int>(v));
      }
      if (p.layers_per_stage.empty()) rep.fail(r.mark("layers_per_stage"), "parallel.layers_per_stage",
                                               fmt::format("expected {}, got an empty list", expected));
    } else {
      rep.fail(r.mark("layers_per_stage"), "parallel.layers_per_stage",
               fmt::format("expected {}, got {}", expected, describe(n)));
    }
  }
  return p;
}

LengthDistribution read_lengths(const MapReader& parent, const std::string& key, LengthDistribution d) {
  if (!parent.has(key)) return d;
  MapReader r(parent.reporter(), parent.node(key), parent.field(key), parent.mark(key), kLengthKeys);
  d.kind = r.get_choice("distribution", d.kind, "length distribution", {"lognormal", "uniform", "fixed"});
  d.mean = r.get_number("mean", d.mean, true, "mean tokens (fixed: the length)");
  d.sigma = r.get_number("sigma", d.sigma, true, "σ of the lognormal's log");
  d.min = r.get_int("min", d.min, 1, "fewest tokens");
  d.max = r.get_int("max", d.max, 1, "most tokens");
  return d;
}

ServingConfig read_serving(const Reporter& rep, const YAML::Node& node, YAML::Mark where) {
  MapReader r(rep, node, "serving", where, kServingKeys);
  ServingConfig s;
  if (r.has("requests_file"))
    for (const char* key : {"requests", "prompt", "output", "seed"})
      if (r.has(key))
        rep.fail(r.mark(key), r.field(key),
                 "not used with serving.requests_file (the file gives every request's lengths); remove one of the two");
  s.requests = r.get_int("requests", s.requests, 1, "requests to serve");
  s.seed = static_cast<std::uint64_t>(r.get_int("seed", 1, 0, "seed of the generated lengths"));
  s.prompt = read_lengths(r, "prompt", s.prompt);
  s.output = read_lengths(r, "output", s.output);
  s.requests_file = r.get_string("requests_file", "", "a JSON file of requests");
  s.memory_fraction = r.get_number("memory_fraction", s.memory_fraction, true,
                                   "share of GPU memory for weights and KV cache");
  s.kv_fraction = r.get_number("kv_fraction", s.kv_fraction, true, "share of KV blocks tdpipe's projected peak may use");
  s.block_tokens = r.get_int("block_tokens", s.block_tokens, 1, "tokens per KV block");
  s.max_batch_tokens = r.get_int("max_batch_tokens", s.max_batch_tokens, 1, "tokens one batch may process");
  s.max_batch_requests = r.get_int("max_batch_requests", s.max_batch_requests, 1, "requests one batch may hold");
  s.planner = r.get_choice("planner", s.planner, "serving planner", serving_planner_names());
  return s;
}

Synthetic read_synthetic(const Reporter& rep, const YAML::Node& node, YAML::Mark where,
                         ParallelConfig& parallel) {
  MapReader r(rep, node, "synthetic", where,
              {"stages", "microbatches", "chunks", "slices", "time", "p2p_latency", "activation_bytes",
               "memory_budget"});
  Synthetic s;
  s.stages = r.get_int("stages", std::nullopt, 1, "pipeline stages p");
  s.microbatches = r.get_int("microbatches", std::nullopt, 1, "micro-batches m");
  s.chunks = r.get_int("chunks", 1, 1, "model chunks v per rank");
  const int slices = r.get_int("slices", 1, 1, "temporal slices per micro-batch");
  if (!r.has("time")) r.missing("time", "a map {F: µs, B: µs, W: µs}");
  MapReader t(rep, r.node("time"), "synthetic.time", r.mark("time"), {"F", "B", "W"});
  s.f_seconds = us_to_seconds(t.get_number("F", std::nullopt, true, "forward time in µs"));
  s.b_seconds = us_to_seconds(t.get_number("B", std::nullopt, true, "input-gradient time in µs"));
  s.w_seconds = us_to_seconds(t.get_number("W", std::nullopt, false, "weight-gradient time in µs"));
  s.p2p_latency_seconds = us_to_seconds(r.get_number("p2p_latency", 0.0, false, "µs per cross-rank dependency"));
  s.activation_bytes = r.get_number("activation_bytes", 0.0, false, "bytes one F keeps alive");
  // Mirror the shape into `parallel` so code reading parallel.* sees the same p, m, v, S.
  parallel.pipeline = s.stages;
  parallel.chunks = s.chunks;
  parallel.global_batch = s.microbatches;
  parallel.slices = slices;
  parallel.memory_budget = r.get_string("memory_budget", "max", "1f1b, 2x1f1b, max or GiB for the auto scheduler");
  return s;
}

/// The rules every scenario meets (find_problem), reported at the line of their field.
void check_rules(const Reporter& rep, const Scenario& sc) {
  if (auto problem = find_problem(sc)) rep.fail(rep.mark_of(problem->field), problem->field, problem->what);
}

Scenario parse_root(const YAML::Node& root, const std::string& source_name) {
  Reporter rep(source_name);
  MapReader top(rep, root, "", YAML::Mark(), {"name", "model", "cluster", "parallel", "schedule", "synthetic", "serving"});
  Scenario sc;
  sc.source_file = source_name;
  sc.name = top.get_string("name", std::filesystem::path(source_name).stem().string(), "the scenario's name");
  sc.schedule = top.get_choice("schedule", "1f1b", "schedule", kScheduleNames);
  if (top.has("synthetic")) {
    for (const char* key : {"model", "parallel", "serving"})
      if (top.has(key))
        rep.fail(top.mark(key), key,
                 "not used by a synthetic scenario (its stages, microbatches, chunks, slices and "
                 "times go under synthetic); remove one of the two");
    sc.synthetic = read_synthetic(rep, top.node("synthetic"), top.mark("synthetic"), sc.parallel);
    if (top.has("cluster")) sc.cluster = read_cluster(rep, top.node("cluster"), top.mark("cluster"));
    check_rules(rep, sc);
    return sc;
  }
  for (const char* key : {"model", "cluster", "parallel"})
    if (!top.has(key))
      top.missing(key, "a map (model, cluster and parallel are required unless the scenario is synthetic)");
  const MapReader model_keys(rep, top.node("model"), "model", top.mark("model"), kModelKeys);
  sc.model = read_model(model_keys);
  sc.cluster = read_cluster(rep, top.node("cluster"), top.mark("cluster"));
  if (top.has("serving")) {
    sc.serving = read_serving(rep, top.node("serving"), top.mark("serving"));
    // A serving scenario has no training batch: global_batch may be left out.
    sc.parallel = read_parallel(rep, top.node("parallel"), top.mark("parallel"), 1);
  } else {
    sc.parallel = read_parallel(rep, top.node("parallel"), top.mark("parallel"), std::nullopt);
  }
  check_rules(rep, sc);
  return sc;
}
#endif  // TDPIPE_HAVE_YAML

// ---------------------------------------------------------------- JSON

/// Reads a JSON object field by field, naming the path on errors and rejecting unknown keys.
class JsonReader {
 public:
  JsonReader(const json& j, std::string path, std::vector<std::string> known) : j_(j), path_(std::move(path)) {
    if (!j.is_object()) throw Error(fmt::format("{}: expected an object, got {}", path_, j.type_name()));
    for (const auto& [key, value] : j.items())
      if (std::find(known.begin(), known.end(), key) == known.end())
        throw Error(fmt::format("{}.{}: unknown key; known keys: {}", path_, key, join(known)));
  }
  std::string path(const std::string& key) const { return path_ + "." + key; }
  const json& at(const std::string& key) const {
    if (!j_.contains(key)) throw Error(fmt::format("{}: missing", path(key)));
    return j_.at(key);
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  int get_int(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number_integer() || v.get<long long>() < std::numeric_limits<int>::min() ||
        v.get<long long>() > std::numeric_limits<int>::max())
      throw Error(fmt::format("{}: expected an integer, got {}", path(key), quote_json(v)));
    return v.get<int>();
  }
  double get_double(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number()) throw Error(fmt::format("{}: expected a number, got {}", path(key), quote_json(v)));
    return v.get<double>();
  }
  bool get_bool(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_boolean()) throw Error(fmt::format("{}: expected true or false, got {}", path(key), quote_json(v)));
    return v.get<bool>();
  }
  std::string get_string(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_string()) throw Error(fmt::format("{}: expected a string, got {}", path(key), quote_json(v)));
    return v.get<std::string>();
  }

 private:
  const json& j_;
  std::string path_;
};

json gpu_to_json(const GpuSpec& g) {
  return {{"name", g.name},
          {"peak_flops", g.peak_flops},
          {"hbm_bytes", g.hbm_bytes},
          {"hbm_bytes_per_second", g.hbm_bytes_per_second},
          {"nvlink_bytes_per_second", g.nvlink_bytes_per_second}};
}

GpuSpec gpu_from_json(const json& j, const std::string& path) {
  JsonReader r(j, path, {"name", "peak_flops", "hbm_bytes", "hbm_bytes_per_second", "nvlink_bytes_per_second"});
  return {r.get_string("name"), r.get_double("peak_flops"), r.get_double("hbm_bytes"),
          r.get_double("hbm_bytes_per_second"), r.get_double("nvlink_bytes_per_second")};
}

}  // namespace

Scenario parse_scenario(std::string_view yaml_text, const std::string& source_name) {
#if !TDPIPE_HAVE_YAML
  (void)yaml_text;
  throw Error(fmt::format("{}: this build reads JSON scenarios only (configured with TDPIPE_WITH_YAML=OFF, "
                          "e.g. the `gpu` preset): pass a .json scenario (ir::to_json of the YAML, made on a "
                          "full build; see tests/exec_cuda/data/)", source_name));
#else
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    throw Error(fmt::format("{}:{}: YAML syntax: {}", source_name, line, e.msg));
  }
  try {
    return parse_root(root, source_name);
  } catch (const YAML::Exception& e) {
    // Not expected (values are converted by hand); kept so no yaml-cpp exception escapes bare.
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    throw Error(fmt::format("{}:{}: YAML: {}", source_name, line, e.msg));
  }
#endif
}

Scenario load_scenario(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(fmt::format("{}: scenario file not found (expected a YAML file, e.g. scenarios/gpt3-175b-a100-8x8.yaml)", path));
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(fmt::format("{}: not a regular file; expected a YAML scenario file", path));
  const std::string text = read_file(path, "scenario file");
  // A .json file is the JSON form (to_json), which builds without yaml-cpp can read.
  if (std::filesystem::path(path).extension() == ".json") {
    const json j = parse_json(text, path);
    try {
      return scenario_from_json(j);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", path, e.what()));
    }
  }
  return parse_scenario(text, path);
}

json to_json(const Scenario& s) {
  json groups = json::array();
  for (const auto& g : s.cluster.groups) groups.push_back({{"gpu", gpu_to_json(g.gpu)}, {"nodes", g.nodes}});
  json j = {
      {"name", s.name},
      {"source_file", s.source_file},
      {"schedule", s.schedule},
      {"model",
       {{"name", s.model.name}, {"layers", s.model.layers}, {"hidden", s.model.hidden},
        {"ffn", s.model.ffn}, {"heads", s.model.heads}, {"seq", s.model.seq},
        {"vocab", s.model.vocab}, {"dtype", s.model.dtype}, {"kv_heads", s.model.kv_heads},
        {"mlp", s.model.mlp}, {"attention", s.model.attention}}},
      {"cluster",
       {{"groups", groups},
        {"gpus_per_node", s.cluster.gpus_per_node},
        {"nvlink_bytes_per_second", s.cluster.nvlink_bytes_per_second},
        {"ib_bytes_per_second_per_nic", s.cluster.ib_bytes_per_second_per_nic},
        {"nics_per_node", s.cluster.nics_per_node},
        {"topology", s.cluster.topology},
        {"nvlink_latency_seconds", s.cluster.nvlink_latency_seconds},
        {"ib_latency_seconds", s.cluster.ib_latency_seconds},
        {"host_bytes_per_second", s.cluster.host_bytes_per_second},
        {"shared_capacity", s.cluster.shared_capacity},
        {"compute_efficiency", s.cluster.compute_efficiency}}},
      {"parallel",
       {{"tensor", s.parallel.tensor}, {"pipeline", s.parallel.pipeline}, {"data", s.parallel.data},
        {"chunks", s.parallel.chunks}, {"micro_batch", s.parallel.micro_batch},
        {"global_batch", s.parallel.global_batch}, {"recompute", recompute_name(s.parallel.recompute)},
        {"sequence_parallel", s.parallel.sequence_parallel},
        {"slices", s.parallel.slices_auto ? json("auto") : json(s.parallel.slices)},
        {"memory_budget", s.parallel.memory_budget},
        {"layers_per_stage",
         s.parallel.layers_per_stage_auto ? json("auto") : json(s.parallel.layers_per_stage)},
        {"overlap_grad_reduce", s.parallel.overlap_grad_reduce},
        {"tp_comm_overlap", s.parallel.tp_comm_overlap},
        {"overlap_p2p", s.parallel.overlap_p2p},
        {"bucket_mb", s.parallel.bucket_mb},
        {"distributed_optimizer", s.parallel.distributed_optimizer},
        {"optimizer", s.parallel.optimizer},
        {"onebit_warmup_steps", s.parallel.onebit_warmup_steps},
        {"param_offload", s.parallel.param_offload},
        {"loss_scale", s.parallel.loss_scale},
        {"initial_loss_scale", s.parallel.initial_loss_scale},
        {"loss_scale_window", s.parallel.loss_scale_window},
        {"min_loss_scale", s.parallel.min_loss_scale}}},
      {"synthetic", nullptr},
  };
  if (s.serving) {
    const ServingConfig& v = *s.serving;
    auto lengths = [](const LengthDistribution& d) {
      return json{{"distribution", d.kind}, {"mean", d.mean}, {"sigma", d.sigma}, {"min", d.min}, {"max", d.max}};
    };
    j["serving"] = {{"requests", v.requests},
                    {"seed", v.seed},
                    {"prompt", lengths(v.prompt)},
                    {"output", lengths(v.output)},
                    {"requests_file", v.requests_file},
                    {"memory_fraction", v.memory_fraction},
                    {"kv_fraction", v.kv_fraction},
                    {"block_tokens", v.block_tokens},
                    {"max_batch_tokens", v.max_batch_tokens},
                    {"max_batch_requests", v.max_batch_requests},
                    {"planner", v.planner}};
  }
  if (s.synthetic) {
    const Synthetic& y = *s.synthetic;
    j["synthetic"] = {{"stages", y.stages},       {"microbatches", y.microbatches},
                      {"chunks", y.chunks},       {"f_seconds", y.f_seconds},
                      {"b_seconds", y.b_seconds}, {"w_seconds", y.w_seconds},
                      {"p2p_latency_seconds", y.p2p_latency_seconds},
                      {"activation_bytes", y.activation_bytes}};
  }
  return j;
}

Scenario scenario_from_json(const json& j) {
  const std::string root = "scenario";
  JsonReader r(j, root, {"name", "source_file", "schedule", "model", "cluster", "parallel", "synthetic", "serving"});
  Scenario s;
  s.name = r.get_string("name");
  s.source_file = r.get_string("source_file");
  s.schedule = r.get_string("schedule");

  JsonReader m(r.at("model"), r.path("model"),
               {"name", "layers", "hidden", "ffn", "heads", "seq", "vocab", "dtype", "kv_heads", "mlp",
                "attention"});
  s.model = {m.get_string("name"), m.get_int("layers"), m.get_int("hidden"), m.get_int("ffn"),
             m.get_int("heads"), m.get_int("seq"), m.get_int("vocab"), m.get_string("dtype")};
  // Optional, with the YAML defaults: JSON written before these keys existed still loads.
  if (m.has("kv_heads")) s.model.kv_heads = m.get_int("kv_heads");
  if (m.has("mlp")) s.model.mlp = m.get_string("mlp");
  if (m.has("attention")) s.model.attention = m.get_string("attention");

  JsonReader c(r.at("cluster"), r.path("cluster"),
               {"groups", "gpus_per_node", "nvlink_bytes_per_second", "ib_bytes_per_second_per_nic",
                "nics_per_node", "topology", "nvlink_latency_seconds", "ib_latency_seconds", "shared_capacity",
                "host_bytes_per_second", "compute_efficiency"});
  const json& groups = c.at("groups");
  if (!groups.is_array()) throw Error(fmt::format("{}: expected an array", c.path("groups")));
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string gp = fmt::format("{}[{}]", c.path("groups"), i);
    JsonReader g(groups[i], gp, {"gpu", "nodes"});
    s.cluster.groups.push_back({gpu_from_json(g.at("gpu"), g.path("gpu")), g.get_int("nodes")});
  }
  s.cluster.gpus_per_node = c.get_int("gpus_per_node");
  s.cluster.nvlink_bytes_per_second = c.get_double("nvlink_bytes_per_second");
  s.cluster.ib_bytes_per_second_per_nic = c.get_double("ib_bytes_per_second_per_nic");
  s.cluster.nics_per_node = c.get_int("nics_per_node");
  s.cluster.topology = c.get_string("topology");
  s.cluster.nvlink_latency_seconds = c.get_double("nvlink_latency_seconds");
  s.cluster.ib_latency_seconds = c.get_double("ib_latency_seconds");
  if (c.has("shared_capacity")) s.cluster.shared_capacity = c.get_double("shared_capacity");
  if (c.has("host_bytes_per_second")) s.cluster.host_bytes_per_second = c.get_double("host_bytes_per_second");
  if (c.has("compute_efficiency")) s.cluster.compute_efficiency = c.get_double("compute_efficiency");

  JsonReader p(r.at("parallel"), r.path("parallel"),
               {"tensor", "pipeline", "data", "chunks", "micro_batch", "global_batch", "recompute",
                "sequence_parallel", "slices", "memory_budget", "layers_per_stage", "overlap_grad_reduce", "tp_comm_overlap",
                "overlap_p2p", "bucket_mb", "distributed_optimizer", "optimizer", "onebit_warmup_steps", "param_offload",
               "loss_scale", "initial_loss_scale", "loss_scale_window", "min_loss_scale"});
  s.parallel.tensor = p.get_int("tensor");
  s.parallel.pipeline = p.get_int("pipeline");
  s.parallel.data = p.get_int("data");
  s.parallel.chunks = p.get_int("chunks");
  s.parallel.micro_batch = p.get_int("micro_batch");
  s.parallel.global_batch = p.get_int("global_batch");
  const std::string rc = p.get_string("recompute");
  if (std::find(kRecomputeNames.begin(), kRecomputeNames.end(), rc) == kRecomputeNames.end())
    throw Error(fmt::format("{}: expected one of {}, got \"{}\"", p.path("recompute"), join(kRecomputeNames), rc));
  s.parallel.recompute = recompute_from(rc);
  s.parallel.sequence_parallel = p.get_bool("sequence_parallel");
  if (p.at("slices") == "auto")
    s.parallel.slices_auto = true;
  else
    s.parallel.slices = p.get_int("slices");
  if (p.has("memory_budget")) s.parallel.memory_budget = p.get_string("memory_budget");  // older files: default
  // Older files: Megatron's defaults (overlap on, 40 MiB buckets, no sharded optimizer).
  if (p.has("overlap_grad_reduce")) s.parallel.overlap_grad_reduce = p.get_bool("overlap_grad_reduce");
  if (p.has("tp_comm_overlap")) s.parallel.tp_comm_overlap = p.get_bool("tp_comm_overlap");
  if (p.has("overlap_p2p")) s.parallel.overlap_p2p = p.get_bool("overlap_p2p");
  if (p.has("bucket_mb")) s.parallel.bucket_mb = p.get_double("bucket_mb");
  if (p.has("distributed_optimizer")) s.parallel.distributed_optimizer = p.get_bool("distributed_optimizer");
  if (p.has("optimizer")) s.parallel.optimizer = p.get_string("optimizer");
  if (p.has("onebit_warmup_steps")) s.parallel.onebit_warmup_steps = p.get_int("onebit_warmup_steps");
  if (p.has("param_offload")) s.parallel.param_offload = p.get_string("param_offload");
  if (p.has("loss_scale")) s.parallel.loss_scale = p.get_double("loss_scale");
  if (p.has("initial_loss_scale")) s.parallel.initial_loss_scale = p.get_double("initial_loss_scale");
  if (p.has("loss_scale_window")) s.parallel.loss_scale_window = p.get_int("loss_scale_window");
  if (p.has("min_loss_scale")) s.parallel.min_loss_scale = p.get_double("min_loss_scale");
  if (p.has("layers_per_stage")) {  // older files: even
    const json& l = p.at("layers_per_stage");
    if (l == "auto") {
      s.parallel.layers_per_stage_auto = true;
    } else if (l.is_array()) {
      for (std::size_t i = 0; i < l.size(); ++i) {
        if (!l[i].is_number_integer() || l[i].get<long long>() < 1 || l[i].get<long long>() > std::numeric_limits<int>::max())
          throw Error(fmt::format("{}[{}]: expected a positive integer (layers), got {}", p.path("layers_per_stage"),
                                  i, quote_json(l[i])));
        s.parallel.layers_per_stage.push_back(l[i].get<int>());
      }
    } else {
      throw Error(fmt::format("{}: expected \"auto\" or a list of layer counts, got {}", p.path("layers_per_stage"),
                              quote_json(l)));
    }
  }

  if (r.has("synthetic") && !r.at("synthetic").is_null()) {
    JsonReader y(r.at("synthetic"), r.path("synthetic"),
                 {"stages", "microbatches", "chunks", "f_seconds", "b_seconds", "w_seconds",
                  "p2p_latency_seconds", "activation_bytes"});
    Synthetic syn;
    syn.stages = y.get_int("stages");
    syn.microbatches = y.get_int("microbatches");
    syn.chunks = y.get_int("chunks");
    syn.f_seconds = y.get_double("f_seconds");
    syn.b_seconds = y.get_double("b_seconds");
    syn.w_seconds = y.get_double("w_seconds");
    syn.p2p_latency_seconds = y.get_double("p2p_latency_seconds");
    syn.activation_bytes = y.get_double("activation_bytes");
    s.synthetic = syn;
  }
  if (r.has("serving") && !r.at("serving").is_null()) {
    JsonReader v(r.at("serving"), r.path("serving"), kServingKeys);
    auto lengths = [&](const std::string& key) {
      JsonReader d(v.at(key), v.path(key), kLengthKeys);
      return LengthDistribution{d.get_string("distribution"), d.get_double("mean"), d.get_double("sigma"),
                                d.get_int("min"), d.get_int("max")};
    };
    ServingConfig c;
    c.requests = v.get_int("requests");
    const json& seed = v.at("seed");
    if (!seed.is_number_unsigned()) throw Error(fmt::format("{}: expected an integer ≥ 0, got {}", v.path("seed"), quote_json(seed)));
    c.seed = seed.get<std::uint64_t>();
    c.prompt = lengths("prompt");
    c.output = lengths("output");
    c.requests_file = v.get_string("requests_file");
    c.memory_fraction = v.get_double("memory_fraction");
    c.kv_fraction = v.get_double("kv_fraction");
    c.block_tokens = v.get_int("block_tokens");
    c.max_batch_tokens = v.get_int("max_batch_tokens");
    c.max_batch_requests = v.get_int("max_batch_requests");
    c.planner = v.get_string("planner");
    s.serving = c;
  }
  if (auto problem = find_problem(s)) throw Error(fmt::format("{}.{}: {}", root, problem->field, problem->what));
  return s;
}

Recompute recompute_from(const std::string& s) {
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  return Recompute::None;
}

std::string recompute_name(Recompute r) {
  switch (r) {
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
    default: return "none";
  }
}

}  // namespace tdpipe::ir
