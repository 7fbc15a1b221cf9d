// scenario_check.cpp — the rules every Scenario meets (see scenario_check.hpp).
//
// The YAML reader checks each scalar as it converts it (so its message can say what
// the key means) and then runs these rules, mapping the field back to its line; the
// JSON reader has no lines and relies on these rules alone. Either way a scenario that
// reaches the planner has passed find_problem, so no consumer divides by a zero count.
#include "tdpipe/ir/scenario_check.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <tuple>

#include <fmt/format.h>

namespace tdpipe::ir {
namespace {

/// Collects the first problem; later checks are skipped once one is found.
class Rules {
 public:
  bool ok() const { return !problem_; }
  std::optional<ScenarioProblem> take() { return std::move(problem_); }

  void fail(std::string field, std::string what) {
    if (!problem_) problem_ = ScenarioProblem{std::move(field), std::move(what)};
  }
  void count(const std::string& field, long long v, std::string_view meaning) {
    if (ok() && v < 1) fail(field, fmt::format("expected a positive integer ({}), got {}", meaning, v));
  }
  void positive(const std::string& field, double v, std::string_view meaning) {
    if (ok() && !(std::isfinite(v) && v > 0))
      fail(field, fmt::format("expected a positive finite number ({}), got {}", meaning, v));
  }
  void non_negative(const std::string& field, double v, std::string_view meaning) {
    if (ok() && !(std::isfinite(v) && v >= 0))
      fail(field, fmt::format("expected a finite number ≥ 0 ({}), got {}", meaning, v));
  }
  void member(const std::string& field, const std::string& v, const std::vector<std::string>& known) {
    if (ok() && std::find(known.begin(), known.end(), v) == known.end())
      fail(field, fmt::format("expected one of {}, got \"{}\"", fmt::join(known, ", "), v));
  }

 private:
  std::optional<ScenarioProblem> problem_;
};

void check_budget(Rules& r, const std::string& field, const std::string& budget) {
  if (r.ok() && !memory_budget_gib(budget) && budget != "1f1b" && budget != "2x1f1b" && budget != "max")
    r.fail(field, fmt::format("expected 1f1b, 2x1f1b, max or a positive number of GiB, got \"{}\"", budget));
}

/// Interleaving assigns micro-batches to chunks in groups of p (Megatron), so m % p = 0.
void check_interleaving(Rules& r, const std::string& field, int chunks, long long m, int p) {
  if (r.ok() && chunks > 1 && m % p != 0)
    r.fail(field, fmt::format("interleaving {} chunks needs the micro-batch count ({}) to be a "
                              "multiple of the pipeline stages ({})",
                              chunks, m, p));
}

void check_gpu(Rules& r, const std::string& at, const GpuSpec& g) {
  if (r.ok() && g.name.empty()) r.fail(at + ".name", "expected the GPU's name, got an empty string");
  r.positive(at + ".peak_flops", g.peak_flops, "dense FLOP/s per GPU");
  r.positive(at + ".hbm_bytes", g.hbm_bytes, "GPU memory in bytes");
  r.positive(at + ".hbm_bytes_per_second", g.hbm_bytes_per_second, "HBM bandwidth");
  r.non_negative(at + ".nvlink_bytes_per_second", g.nvlink_bytes_per_second, "NVLink bytes/s per GPU each way");
}

void check_cluster(Rules& r, const ClusterConfig& c) {
  if (r.ok() && c.groups.empty()) r.fail("cluster.groups", "expected at least one group of nodes");
  for (std::size_t i = 0; i < c.groups.size(); ++i) {
    const std::string at = fmt::format("cluster.groups[{}]", i);
    check_gpu(r, at + ".gpu", c.groups[i].gpu);
    r.count(at + ".nodes", c.groups[i].nodes, "nodes of this GPU");
  }
  r.count("cluster.gpus_per_node", c.gpus_per_node, "GPUs per node");
  r.count("cluster.nics_per_node", c.nics_per_node, "NICs per node");
  r.non_negative("cluster.nvlink_bytes_per_second", c.nvlink_bytes_per_second, "0: the GPU's own");
  r.positive("cluster.ib_bytes_per_second_per_nic", c.ib_bytes_per_second_per_nic, "network bytes/s per NIC");
  r.non_negative("cluster.nvlink_latency_seconds", c.nvlink_latency_seconds, "NVLink latency");
  r.non_negative("cluster.ib_latency_seconds", c.ib_latency_seconds, "network latency");
  r.non_negative("cluster.shared_capacity", c.shared_capacity, "0: each rank its own device");
  r.non_negative("cluster.host_bytes_per_second", c.host_bytes_per_second, "0: the GPU's usual host link");
  r.positive("cluster.compute_efficiency", c.compute_efficiency, "the software stack's speed relative to the cost model");
  if (r.ok() && !(c.compute_efficiency >= 0.01 && c.compute_efficiency <= 100))
    r.fail("cluster.compute_efficiency",
           fmt::format("expected 0.01 to 100 (the software stack's speed relative to the cost model; 1: as modelled), "
                       "got {}", c.compute_efficiency));
  r.member("cluster.topology", c.topology, scenario_topologies());
}

void check_model(Rules& r, const ModelConfig& m) {
  r.count("model.layers", m.layers, "transformer layers");
  r.count("model.hidden", m.hidden, "hidden size");
  r.count("model.heads", m.heads, "attention heads");
  r.count("model.ffn", m.ffn, "MLP inner size");
  r.count("model.seq", m.seq, "sequence length in tokens");
  r.count("model.vocab", m.vocab, "vocabulary size");
  r.member("model.dtype", m.dtype, scenario_dtypes());
  r.member("model.mlp", m.mlp, scenario_mlp_names());
  r.member("model.attention", m.attention, scenario_attention_names());
  if (r.ok() && m.hidden % m.heads != 0)
    r.fail("model.hidden", fmt::format("expected a multiple of heads ({}), got {}", m.heads, m.hidden));
  // 0 is the in-code default ("as many as heads"); files give kv_heads ≥ 1 or leave it out.
  if (r.ok() && m.kv_heads < 0)
    r.fail("model.kv_heads", fmt::format("expected an integer ≥ 0 (key/value heads; 0: as many as heads), got {}",
                                         m.kv_heads));
  if (r.ok() && m.kv_heads > 0 && m.heads % m.kv_heads != 0)
    r.fail("model.kv_heads", fmt::format("expected a divisor of heads ({}), got {}", m.heads, m.kv_heads));
}

void check_parallel(Rules& r, const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  r.count("parallel.tensor", p.tensor, "tensor-parallel size");
  r.count("parallel.pipeline", p.pipeline, "pipeline stages");
  r.count("parallel.data", p.data, "data-parallel replicas");
  r.count("parallel.chunks", p.chunks, "model chunks per pipeline rank");
  r.count("parallel.micro_batch", p.micro_batch, "sequences per micro-batch");
  r.count("parallel.global_batch", p.global_batch, "sequences per iteration");
  r.count("parallel.slices", p.slices, "temporal slices per micro-batch");
  check_budget(r, "parallel.memory_budget", p.memory_budget);
  r.positive("parallel.bucket_mb", p.bucket_mb, "MiB of gradients per data-parallel bucket");
  // A bucket is cut in 64-bit bytes; a million MiB (a TiB) is past any gradient a GPU holds.
  if (r.ok() && (p.bucket_mb > 1 << 20 || p.bucket_mb < 0.001))
    r.fail("parallel.bucket_mb",
           fmt::format("expected 0.001 to 1048576 MiB (1 KiB to 1 TiB) per bucket, got {}", p.bucket_mb));
  r.member("parallel.optimizer", p.optimizer, scenario_optimizer_names());
  r.count("parallel.onebit_warmup_steps", p.onebit_warmup_steps, "uncompressed Adam steps before 1-bit Adam");
  // 1-bit Adam compresses the momentum all-reduce; ZeRO-1 reduce-scatters gradients
  // instead (DeepSpeed's 1-bit Adam likewise runs without ZeRO).
  if (r.ok() && p.onebit() && p.distributed_optimizer)
    r.fail("parallel.optimizer",
           "onebit-adam all-reduces a compressed momentum on every replica; it cannot be combined with "
           "distributed_optimizer: true (ZeRO-1 shards the optimizer) — choose one");
  r.member("parallel.param_offload", p.param_offload, scenario_param_offload_names());
  // The offloaded optimizer state is the whole (unsharded, uncompressed) Adam state.
  if (r.ok() && p.offload() && (p.distributed_optimizer || p.onebit()))
    r.fail("parallel.param_offload",
           fmt::format("param_offload: layers streams each layer's whole Adam state through OPT; it is not "
                       "built for {} — choose one",
                       p.distributed_optimizer ? "distributed_optimizer: true (ZeRO-1)" : "optimizer: onebit-adam"));
  r.non_negative("parallel.loss_scale", p.loss_scale, "0: dynamic; > 0: a static fp16 loss scale");
  r.positive("parallel.initial_loss_scale", p.initial_loss_scale, "the dynamic fp16 loss scale to start from");
  r.count("parallel.loss_scale_window", p.loss_scale_window, "steps without overflow before a loss scale doubles");
  r.positive("parallel.min_loss_scale", p.min_loss_scale, "the smallest dynamic fp16 loss scale");
  // A scale is a factor of fp16 gradients: past 2^64 every gradient overflows.
  for (const auto& [field, v] : {std::pair<const char*, double>{"parallel.loss_scale", p.loss_scale},
                                 {"parallel.initial_loss_scale", p.initial_loss_scale},
                                 {"parallel.min_loss_scale", p.min_loss_scale}})
    if (r.ok() && v > 0x1p64)
      r.fail(field, fmt::format("expected a loss scale ≤ 2^64, got {}", v));
  if (r.ok() && p.min_loss_scale > p.initial_loss_scale)
    r.fail("parallel.min_loss_scale", fmt::format("expected ≤ initial_loss_scale ({}), got {}", p.initial_loss_scale,
                                                  p.min_loss_scale));
  if (!r.ok()) return;

  const ModelConfig& model = s.model;
  const ClusterConfig& cluster = s.cluster;
  const long long gpus_needed = static_cast<long long>(p.tensor) * p.pipeline * p.data;
  long long nodes = 0;  // summed in 64 bits: absurd node counts must not overflow
  for (const auto& g : cluster.groups) nodes += g.nodes;
  if (gpus_needed != nodes * cluster.gpus_per_node)
    return r.fail("parallel",
                  fmt::format("tensor*pipeline*data = {}*{}*{} = {} GPUs, but the cluster has {} ({} nodes "
                              "x {} GPUs per node); expected them equal",
                              p.tensor, p.pipeline, p.data, gpus_needed, nodes * cluster.gpus_per_node,
                              nodes, cluster.gpus_per_node));
  const long long vstages = static_cast<long long>(p.pipeline) * p.chunks;
  if (!p.layers_per_stage.empty()) {
    if (static_cast<long long>(p.layers_per_stage.size()) != vstages)
      return r.fail("parallel.layers_per_stage",
                    fmt::format("expected one entry per virtual stage, pipeline*chunks = {}*{} = {}, got {}",
                                p.pipeline, p.chunks, vstages, p.layers_per_stage.size()));
    long long sum = 0;
    for (std::size_t i = 0; i < p.layers_per_stage.size(); ++i) {
      if (p.layers_per_stage[i] < 1)
        return r.fail(fmt::format("parallel.layers_per_stage[{}]", i),
                      fmt::format("expected at least 1 layer on every stage, got {}", p.layers_per_stage[i]));
      sum += p.layers_per_stage[i];
    }
    if (sum != model.layers)
      return r.fail("parallel.layers_per_stage",
                    fmt::format("the stages hold {} layers in all; expected model.layers = {}", sum, model.layers));
  } else if (p.layers_per_stage_auto) {
    if (model.layers < vstages)
      return r.fail("parallel.layers_per_stage",
                    fmt::format("auto needs at least one layer per virtual stage: model.layers = {} < "
                                "pipeline*chunks = {}", model.layers, vstages));
  } else if (model.layers % vstages != 0) {
    return r.fail("model.layers",
                  fmt::format("{} layers do not split evenly over pipeline*chunks = {}*{} = {} virtual "
                              "stages; expected a multiple of {} (or give parallel.layers_per_stage: a list "
                              "or auto)",
                              model.layers, p.pipeline, p.chunks, vstages, vstages));
  }
  // hidden first: with hidden % heads == 0 checked, a heads error implies nothing about hidden.
  // kv_heads after heads: each TP rank holds whole K/V groups (Megatron's rule for
  // num_query_groups), so t divides kv_heads; left out, it is heads, checked just before.
  for (auto [key, value] : {std::pair<const char*, int>{"hidden", model.hidden},
                            {"heads", model.heads}, {"kv_heads", model.kv_heads_or_heads()},
                            {"ffn", model.ffn}})
    if (value % p.tensor != 0)
      return r.fail(fmt::format("model.{}", key),
                    fmt::format("{} {} is not divisible by tensor = {}; expected a multiple of {}", key,
                                value, p.tensor, p.tensor));
  const long long per_step = static_cast<long long>(p.micro_batch) * p.data;
  if (p.global_batch % per_step != 0)
    return r.fail("parallel.global_batch",
                  fmt::format("expected a multiple of micro_batch*data = {}*{} = {}, got {}", p.micro_batch,
                              p.data, per_step, p.global_batch));
  check_interleaving(r, "parallel.chunks", p.chunks, p.global_batch / per_step, p.pipeline);
  if (r.ok() && !p.slices_auto && p.slices > model.seq)
    return r.fail("parallel.slices",
                  fmt::format("expected at most seq = {} slices (each slice needs a token), got {}",
                              model.seq, p.slices));
  if (r.ok() && p.tp_comm_overlap && p.tensor > 1 && !p.sequence_parallel)
    r.fail("parallel.tp_comm_overlap",
           "overlapping the tensor-parallel collectives with their GEMMs needs sequence_parallel: true (as "
           "Megatron-LM's --tp-comm-overlap does)");
  if (r.ok() && p.sequence_parallel && model.seq % p.tensor != 0)
    r.fail("parallel.sequence_parallel",
           fmt::format("sequence parallelism splits seq = {} over tensor = {}; expected seq to be "
                       "a multiple of tensor",
                       model.seq, p.tensor));
}

void check_synthetic(Rules& r, const Scenario& s) {
  const Synthetic& y = *s.synthetic;
  r.count("synthetic.stages", y.stages, "pipeline stages p");
  r.count("synthetic.microbatches", y.microbatches, "micro-batches m");
  r.count("synthetic.chunks", y.chunks, "model chunks v per rank");
  r.positive("synthetic.f_seconds", y.f_seconds, "forward time");
  r.positive("synthetic.b_seconds", y.b_seconds, "input-gradient time");
  r.non_negative("synthetic.w_seconds", y.w_seconds, "weight-gradient time");
  r.non_negative("synthetic.p2p_latency_seconds", y.p2p_latency_seconds, "per cross-rank dependency");
  r.non_negative("synthetic.activation_bytes", y.activation_bytes, "bytes one F keeps alive");
  r.count("synthetic.slices", s.parallel.slices, "temporal slices per micro-batch");
  if (r.ok() && s.parallel.slices_auto)
    r.fail("synthetic.slices", "expected a count: auto cuts a model's tokens by the cost model, and a synthetic "
                               "scenario has none");
  check_budget(r, "synthetic.memory_budget", s.parallel.memory_budget);
  check_interleaving(r, "synthetic.chunks", y.chunks, y.microbatches, y.stages);
  // The readers mirror the shape into `parallel`; a hand-edited JSON must agree.
  for (auto [key, mirror, value] : {std::tuple<const char*, int, int>{"pipeline", s.parallel.pipeline, y.stages},
                                    {"chunks", s.parallel.chunks, y.chunks},
                                    {"global_batch", s.parallel.global_batch, y.microbatches}})
    if (r.ok() && mirror != value)
      r.fail(fmt::format("parallel.{}", key),
             fmt::format("a synthetic scenario's parallel.{} mirrors its synthetic shape; expected {}, got {}",
                         key, value, mirror));
  if (!s.cluster.groups.empty()) check_cluster(r, s.cluster);
}

}  // namespace

std::optional<double> memory_budget_gib(const std::string& text) {
  double v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty() || !std::isfinite(v) || !(v > 0))
    return std::nullopt;
  return v;
}

const std::vector<std::string>& scenario_schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "zb-h1",
                                                 "zb-h2", "zb-v", "tdpipe", "auto"};
  return names;
}
const std::vector<std::string>& scenario_dtypes() {
  static const std::vector<std::string> names = {"bf16", "fp16", "fp32"};
  return names;
}
const std::vector<std::string>& scenario_mlp_names() {
  static const std::vector<std::string> names = {"gelu", "swiglu"};
  return names;
}
const std::vector<std::string>& scenario_attention_names() {
  static const std::vector<std::string> names = {"flash", "standard"};
  return names;
}
const std::vector<std::string>& scenario_recompute_names() {
  static const std::vector<std::string> names = {"none", "selective", "full"};
  return names;
}
const std::vector<std::string>& scenario_optimizer_names() {
  static const std::vector<std::string> names = {"adam", "onebit-adam"};
  return names;
}
const std::vector<std::string>& scenario_param_offload_names() {
  static const std::vector<std::string> names = {"none", "layers"};
  return names;
}
const std::vector<std::string>& scenario_topologies() {
  static const std::vector<std::string> names = {"fat-tree", "rail-optimized"};
  return names;
}

void check_lengths(Rules& r, const std::string& at, const LengthDistribution& d) {
  r.member(at + ".distribution", d.kind, {"lognormal", "uniform", "fixed"});
  r.count(at + ".min", d.min, "fewest tokens");
  r.count(at + ".max", d.max, "most tokens");
  if (r.ok() && d.max > kMaxRequestTokens) r.fail(at + ".max", fmt::format("expected at most {}, got {}", kMaxRequestTokens, d.max));
  if (r.ok() && d.max < d.min) r.fail(at + ".max", fmt::format("expected ≥ min ({}), got {}", d.min, d.max));
  if (d.kind != "uniform") r.positive(at + ".mean", d.mean, "mean tokens");
  if (d.kind == "lognormal") r.positive(at + ".sigma", d.sigma, "σ of the lognormal's log");
  if (r.ok() && d.kind == "lognormal" && d.sigma > 10)
    r.fail(at + ".sigma", fmt::format("expected at most 10 (e^10 is 22,000 times the median), got {}", d.sigma));
  if (r.ok() && d.kind == "fixed" && (d.mean < d.min || d.mean > d.max || d.mean != std::floor(d.mean)))
    r.fail(at + ".mean", fmt::format("a fixed length must be a whole number from min to max ({} … {}), got {}", d.min,
                                     d.max, d.mean));
}

void check_serving(Rules& r, const ServingConfig& v) {
  r.count("serving.requests", v.requests, "requests to serve");
  if (r.ok() && v.requests > kMaxServingRequests)
    r.fail("serving.requests", fmt::format("expected at most {}, got {}", kMaxServingRequests, v.requests));
  check_lengths(r, "serving.prompt", v.prompt);
  check_lengths(r, "serving.output", v.output);
  r.positive("serving.memory_fraction", v.memory_fraction, "share of GPU memory");
  if (r.ok() && v.memory_fraction > 1) r.fail("serving.memory_fraction", fmt::format("expected at most 1, got {}", v.memory_fraction));
  r.positive("serving.kv_fraction", v.kv_fraction, "share of KV blocks");
  if (r.ok() && v.kv_fraction > 1) r.fail("serving.kv_fraction", fmt::format("expected at most 1, got {}", v.kv_fraction));
  r.count("serving.block_tokens", v.block_tokens, "tokens per KV block");
  r.count("serving.max_batch_tokens", v.max_batch_tokens, "tokens per batch");
  r.count("serving.max_batch_requests", v.max_batch_requests, "requests per batch");
  r.member("serving.planner", v.planner, serving_planner_names());
}

std::optional<ScenarioProblem> find_problem(const Scenario& s) {
  Rules r;
  r.member("schedule", s.schedule, scenario_schedule_names());
  if (s.synthetic) {
    check_synthetic(r, s);
    return r.take();
  }
  check_model(r, s.model);
  check_cluster(r, s.cluster);
  check_parallel(r, s);
  if (s.serving) check_serving(r, *s.serving);
  return r.take();
}

}  // namespace tdpipe::ir
