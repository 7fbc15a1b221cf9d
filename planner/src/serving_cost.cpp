// serving_cost.cpp — the inference cost model (formulas and constants in serving_cost.hpp).
#include "tdpipe/planner/serving_cost.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/planner/cost_model.hpp"

namespace tdpipe::planner {
namespace {

/// Fixed cost of one decoder layer's kernels: ~9 kernels (norm, QKV, rotary, attention,
/// projection, norm, up/gate, activation, down) of ~3 µs of launch, ramp and tail each on
/// the GPU (replayed from CUDA graphs, as vLLM does for decode: no host latency on top).
constexpr double kLayerLaunchSeconds = 9 * 3e-6;

double elem_bytes(const ir::Scenario& sc) { return sc.model.dtype == "fp32" ? 4.0 : 2.0; }

/// The model's sizes on one tensor rank, as every formula here reads them.
struct Dims {
  double e, h, t, ffn, kvw, mats;  ///< bytes per element, hidden, tensor, MLP, K/V width, MLP matrices
  explicit Dims(const ir::Scenario& sc)
      : e(elem_bytes(sc)),
        h(sc.model.hidden),
        t(sc.parallel.tensor),
        ffn(sc.model.ffn),
        kvw(h * sc.model.kv_heads_or_heads() / sc.model.heads),
        mats(sc.model.mlp == "swiglu" ? 3 : 2) {}
  /// Weight-matrix parameters of one layer on one tensor rank.
  double layer_matrices() const { return (2 * h * h + 2 * h * kvw + mats * h * ffn) / t; }
};

/// A batch's token counts: tokens, (query, key) pairs under the causal mask of its
/// prompt items (more than one token) and of its decode items, and the tokens the decode
/// items' attention reads from the KV cache.
struct BatchSums {
  double tokens = 0, prefill_pairs = 0, decode_pairs = 0, decode_kv_tokens = 0;
  explicit BatchSums(const std::vector<ir::ServeItem>& items) {
    for (const auto& i : items) {
      tokens += i.tokens;
      const double pairs = static_cast<double>(i.tokens) * (i.position + (i.tokens + 1) / 2.0);
      if (i.tokens > 1) {
        prefill_pairs += pairs;
      } else {
        decode_pairs += pairs;
        decode_kv_tokens += i.position + 1;
      }
    }
  }
  double pairs() const { return prefill_pairs + decode_pairs; }
};

}  // namespace

ir::Scenario serving_layout(const ir::Scenario& scenario, const std::string& planner) {
  ir::Scenario sc = scenario;
  if (sc.parallel.data != 1)
    throw Error(fmt::format("{}: parallel.data is {}; a serving plan runs one pipeline (set data: 1)", sc.name,
                            sc.parallel.data));
  if (sc.parallel.chunks != 1)
    throw Error(fmt::format("{}: parallel.chunks is {}; a serving plan runs one chunk per stage", sc.name,
                            sc.parallel.chunks));
  if (sc.cluster.groups.size() != 1)
    throw Error(fmt::format("{}: the cluster has {} kinds of GPU; a serving plan prices one kind (one node group)",
                            sc.name, sc.cluster.groups.size()));
  if (planner == "tp") {
    sc.parallel.tensor = sc.parallel.pipeline * sc.parallel.tensor;
    sc.parallel.pipeline = 1;
  }
  sc.parallel.layers_per_stage.clear();
  sc.parallel.layers_per_stage_auto = false;
  sc.parallel.global_batch = 1;
  sc.parallel.micro_batch = 1;
  sc.parallel.slices = 1;
  sc.parallel.slices_auto = false;
  sc.parallel.sequence_parallel = false;
  if (sc.model.layers < sc.parallel.pipeline)
    throw Error(fmt::format("{}: {} layers cannot fill {} pipeline stages", sc.name, sc.model.layers,
                            sc.parallel.pipeline));
  const int t = sc.parallel.tensor;
  const int kv = sc.model.kv_heads_or_heads();
  if (sc.model.heads % t != 0 || kv % t != 0 || sc.model.ffn % t != 0)
    throw Error(fmt::format("{}: the {} planner splits heads ({}), K/V heads ({}) and ffn ({}) over tensor = {}; "
                            "each must divide by it",
                            sc.name, planner, sc.model.heads, kv, sc.model.ffn, t));
  if (t > sc.cluster.gpus_per_node)
    throw Error(fmt::format("{}: the {} planner's tensor-parallel group of {} GPUs is larger than a node ({} GPUs)",
                            sc.name, planner, t, sc.cluster.gpus_per_node));
  return sc;
}

ServingCost::ServingCost(const ir::Scenario& scenario, int stages) : sc_(scenario), stages_(stages) {
  if (sc_.synthetic) throw Error(fmt::format("{}: a synthetic scenario has no model to serve", sc_.name));
  if (stages_ < 1) throw Error("serving: a pipeline needs at least one stage");
  const auto& m = sc_.model;
  if (m.layers < 1 || m.hidden < 1 || m.heads < 1 || m.ffn < 1 || m.vocab < 1)
    throw Error(fmt::format("{}: model: layers, hidden, heads, ffn and vocab must be positive to serve it", sc_.name));
  gpu_ = gpu_of_rank(sc_, 0);
  for (int r = 0; r < stages_; ++r) {
    const auto [first, last] = ir::layer_range({}, m.layers, r, stages_);
    layers_.push_back(last - first);
  }
  for (int r = 0; r < stages_; ++r) {
    const double need = weight_bytes(r);
    const double have = sc_.serving ? sc_.serving->memory_fraction * gpu_.hbm_bytes : gpu_.hbm_bytes;
    if (kv_capacity_bytes(r) <= 0)
      throw Error(fmt::format("{}: rank {} holds {:.1f} GiB of weights and a {:.1f} GiB workspace, more than the "
                              "{:.1f} GiB serving.memory_fraction leaves of a {}'s memory: no room for a KV cache "
                              "(use more GPUs or a larger memory_fraction)",
                              sc_.name, r, need / (1 << 30), (have - need - kv_capacity_bytes(r)) / (1 << 30),
                              have / (1 << 30), gpu_.name));
  }
}

double ServingCost::batch_flops(int rank, const std::vector<ir::ServeItem>& items) const {
  const Dims d(sc_);
  const BatchSums b(items);
  const double per_layer = 2 * b.tokens * d.layer_matrices() + 4 * b.pairs() * d.h / d.t;
  double flops = layers_[static_cast<std::size_t>(rank)] * per_layer;
  if (rank == stages_ - 1) flops += 2.0 * static_cast<double>(items.size()) * d.h * sc_.model.vocab / d.t;
  return flops;
}

double ServingCost::batch_seconds(int rank, const std::vector<ir::ServeItem>& items) const {
  const Efficiencies& eff = default_efficiencies();
  const auto& m = sc_.model;
  const Dims d(sc_);
  const double e = d.e, h = d.h, t = d.t, ffn = d.ffn, kvw = d.kvw, mats = d.mats;
  const double peak = gpu_.peak_flops, hbm = gpu_.hbm_bytes_per_second;
  const BatchSums b(items);
  const double T = b.tokens;
  // A weight GEMM at its roofline: the slower of its FLOPs at gemm_max of peak and its
  // bytes (weights, input and output once) at hbm's share of HBM bandwidth; its fixed
  // cost is in kLayerLaunchSeconds. Not the training curve (gemm_efficiency), whose
  // saturation in size stands for the wave quantisation of large training GEMMs and
  // would charge a decode GEMM of a few hundred rows 2–5× its roofline.
  auto gemm = [&](double rows, double n, double k) {
    if (rows <= 0) return 0.0;
    return std::max(2 * rows * n * k / (peak * eff.gemm_max), e * (rows * k + k * n + rows * n) / (hbm * eff.hbm));
  };
  // One layer on one tensor rank.
  double layer = gemm(T, (h + 2 * kvw) / t, h) + gemm(T, h, h / t) + gemm(T, (mats - 1) * ffn / t, h) +
                 gemm(T, h, ffn / t);
  const double head_dim = h / m.heads;
  const double heads = m.heads / t;
  layer += 4 * b.prefill_pairs * head_dim * heads / (peak * eff.flash_attention);
  const double kv_read = b.decode_kv_tokens * 2 * kvw / t * e;
  layer += std::max(4 * b.decode_pairs * head_dim * heads / (peak * eff.flash_attention), kv_read / (hbm * eff.hbm));
  layer += T * (10 * h + 3 * ffn / t) * e / (hbm * eff.hbm);
  layer += kLayerLaunchSeconds;
  layer /= sc_.cluster.compute_efficiency;
  if (t > 1) layer += 2 * tp_collective_seconds(sc_, gpu_, ir::OpKind::ALLREDUCE, T * h * e, static_cast<int>(t));
  double seconds = layers_[static_cast<std::size_t>(rank)] * layer;
  if (rank == 0) seconds += 2 * T * h * e / (hbm * eff.hbm) / sc_.cluster.compute_efficiency;  // embedding gather
  if (rank == stages_ - 1) {
    const double n = static_cast<double>(items.size());
    seconds += (gemm(n, m.vocab / t, h) + n * h * e / (hbm * eff.hbm)) / sc_.cluster.compute_efficiency;
    if (t > 1)  // the logits' vocabulary shards gathered for sampling
      seconds += tp_collective_seconds(sc_, gpu_, ir::OpKind::ALL_GATHER, n * m.vocab * 4.0, static_cast<int>(t));
  }
  return seconds;
}

CostParts ServingCost::batch_parts(int rank, const std::vector<ir::ServeItem>& items) const {
  const auto& m = sc_.model;
  const Dims d(sc_);
  const double e = d.e, h = d.h, t = d.t, ffn = d.ffn, kvw = d.kvw, mats = d.mats;
  const double peak = gpu_.peak_flops, hbm = gpu_.hbm_bytes_per_second;
  const BatchSums b(items);
  const double T = b.tokens, pairs = b.pairs(), decode_kv_tokens = b.decode_kv_tokens;
  auto gemm = [&](double rows, double n, double k) {
    if (rows <= 0) return 0.0;
    return std::max(2 * rows * n * k / peak, e * (rows * k + k * n + rows * n) / hbm);
  };
  const double layers = layers_[static_cast<std::size_t>(rank)];
  CostParts p;
  p.gemm = layers * (gemm(T, (h + 2 * kvw) / t, h) + gemm(T, h, h / t) + gemm(T, (mats - 1) * ffn / t, h) +
                     gemm(T, h, ffn / t));
  p.attention = layers * (4 * pairs * (h / m.heads) * (m.heads / t) / peak + decode_kv_tokens * 2 * kvw / t * e / hbm);
  p.elementwise = layers * T * (10 * h + 3 * ffn / t) * e / hbm;
  if (t > 1)
    p.comm = layers * 2 * tp_collective_seconds(sc_, gpu_, ir::OpKind::ALLREDUCE, T * h * e, static_cast<int>(t));
  if (rank == 0) p.embedding = 2 * T * h * e / hbm;
  if (rank == stages_ - 1) {
    const double n = static_cast<double>(items.size());
    p.head = gemm(n, m.vocab / t, h) + n * h * e / hbm;
    if (t > 1) p.comm += tp_collective_seconds(sc_, gpu_, ir::OpKind::ALL_GATHER, n * m.vocab * 4.0, static_cast<int>(t));
  }
  return p;
}

double ServingCost::hidden_bytes(int tokens) const {
  return static_cast<double>(tokens) * sc_.model.hidden * elem_bytes(sc_);
}

double ServingCost::kv_bytes_per_token(int rank) const {
  const Dims d(sc_);
  return layers_[static_cast<std::size_t>(rank)] * 2 * d.kvw / d.t * d.e;
}

double ServingCost::weight_bytes(int rank) const {
  const Dims d(sc_);
  const double vocab_shard = static_cast<double>(sc_.model.vocab) * d.h / d.t;
  double params = layers_[static_cast<std::size_t>(rank)] * (d.layer_matrices() + 4 * d.h);
  if (rank == 0) params += vocab_shard;
  if (rank == stages_ - 1) params += vocab_shard + d.h;
  return params * d.e;
}

double ServingCost::kv_capacity_bytes(int rank) const {
  const auto& m = sc_.model;
  const Dims d(sc_);
  const double e = d.e, t = d.t;
  const double fraction = sc_.serving ? sc_.serving->memory_fraction : 0.9;
  const int batch_tokens = sc_.serving ? sc_.serving->max_batch_tokens : 2048;
  const int batch_requests = sc_.serving ? sc_.serving->max_batch_requests : 256;
  // The workspace vLLM's profiling run reserves for a max_num_batched_tokens batch: a
  // layer's live activations (hidden in and out, QKV, the MLP's intermediate) and the
  // fp32 logits of the sampled rows.
  const double workspace = batch_tokens * (3.0 * m.hidden + (m.hidden + 2 * d.kvw) / t + 2.0 * m.ffn / t) * e +
                           static_cast<double>(batch_requests) * m.vocab * 4.0;
  return fraction * gpu_.hbm_bytes - weight_bytes(rank) - workspace;
}

long long ServingCost::kv_capacity_blocks() const {
  const int block = sc_.serving ? sc_.serving->block_tokens : 16;
  double blocks = 1e300;
  for (int r = 0; r < stages_; ++r)
    blocks = std::min(blocks, std::floor(kv_capacity_bytes(r) / (kv_bytes_per_token(r) * block)));
  return static_cast<long long>(std::min(blocks, 1e15));
}

}  // namespace tdpipe::planner
