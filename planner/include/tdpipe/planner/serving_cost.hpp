// serving_cost.hpp — what a serving batch costs on a pipeline stage, and how much
// KV cache a GPU holds: the cost model of LLM inference.
//
// A batch is a list of items (ir::ServeItem): runs of tokens of one request at known
// positions. On a stage of n layers (embedding on the first, final norm and LM head on
// the last), on one tensor rank of t:
//  - weight GEMMs of all the batch's tokens together: FLOPs 2·T·(weights per layer),
//    each GEMM at its roofline — the slower of its FLOPs at gemm_max of peak and its
//    bytes at hbm's share of HBM bandwidth: a decode batch of fewer tokens than the
//    GPU's FLOP/byte ratio (~150 on an A100) is bound by reading the weights, a prefill
//    by FLOPs (the training curve's saturation in size is for large GEMMs' waves);
//  - attention: prompt tokens (an item of more than one token) run the fused causal
//    kernel at flash_attention's fraction of peak over their (query, key) pairs; decode
//    tokens read their request's whole K/V cache — memory-bound, at hbm's fraction of
//    HBM bandwidth, or FLOP-bound if that is slower;
//  - element-wise work (two norms, two residual adds, the MLP's activation, rotary):
//    (10·h + 3·ffn/t) elements of e bytes per token per layer through HBM;
//  - a fixed launch cost per layer (kLayerLaunchSeconds: 9 kernels of ~3 µs — vLLM
//    replays decode steps as CUDA graphs, so no host launch latency on top);
//  - tensor parallelism: two ring all-reduces of T·h·e bytes per layer on the node's
//    fabric (tp_collective_seconds: NVLink, or the PCIe link a PCIe node's preset gives,
//    with the scenario's latency per ring step);
//  - the LM head only for the token each item samples (vLLM computes logits of the
//    sampled positions only): a (items × h) · (h × V/t) GEMM.
// cluster.compute_efficiency divides every kernel's time, as for training.
#pragma once

#include <vector>

#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/ir/serving.hpp"
#include "tdpipe/planner/cost_model.hpp"

namespace tdpipe::planner {

/// Costs of serving batches on the stages of one pipeline of `stages` ranks (tensor
/// parallel `scenario.parallel.tensor`), with layers split by ir::layer_range.
class ServingCost {
 public:
  /// Throws tdpipe::Error when the model cannot be priced (synthetic scenario, counts ≤ 0)
  /// or the weights alone do not fit a GPU's memory_fraction, naming both sizes.
  ServingCost(const ir::Scenario& scenario, int stages);

  int stages() const { return stages_; }
  /// Seconds of `items` on pipeline rank `rank`.
  double batch_seconds(int rank, const std::vector<ir::ServeItem>& items) const;
  /// FLOPs of `items` on `rank` (one tensor rank's share).
  double batch_flops(int rank, const std::vector<ir::ServeItem>& items) const;
  /// The work of `items` on `rank` part by part at the GPU's peak rates (CostParts, the
  /// terms `tdpipe calibrate` fits speeds to): a weight GEMM at its roofline time — the
  /// larger of FLOPs / peak and its bytes / HBM — so a decode's weight read counts as the
  /// GEMM work it bounds; attention FLOPs / peak plus the decode tokens' KV read / HBM;
  /// element-wise, embedding and head as batch_seconds counts them; TP collectives priced.
  CostParts batch_parts(int rank, const std::vector<ir::ServeItem>& items) const;
  /// Layers pipeline rank `rank` holds.
  int layers(int rank) const { return layers_[static_cast<std::size_t>(rank)]; }
  /// Bytes of the hidden states a batch of `tokens` tokens hands to the next stage.
  double hidden_bytes(int tokens) const;
  /// KV-cache bytes of one token on one GPU of `rank` (its layers, its K/V heads).
  double kv_bytes_per_token(int rank) const;
  /// Weights on one GPU of `rank`, bytes.
  double weight_bytes(int rank) const;
  /// KV-cache bytes one GPU of `rank` may use: memory_fraction of its memory less the
  /// weights and the activation workspace of a max_batch_tokens batch.
  double kv_capacity_bytes(int rank) const;
  /// KV blocks of block_tokens tokens the pipeline holds: the fewest any rank's capacity
  /// allows (every rank holds every running request's KV for its own layers).
  long long kv_capacity_blocks() const;

 private:
  ir::Scenario sc_;
  ir::GpuSpec gpu_;
  int stages_ = 1;
  std::vector<int> layers_;  ///< per rank
};

/// The layout a serving planner runs on the scenario's GPUs: pp and tdpipe keep
/// parallel.pipeline × parallel.tensor; tp puts them all in one tensor-parallel group
/// (pipeline 1, tensor = pipeline × tensor). Data parallelism is refused (one pipeline).
ir::Scenario serving_layout(const ir::Scenario& scenario, const std::string& planner);

}  // namespace tdpipe::planner
