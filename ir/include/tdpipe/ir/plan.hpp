// plan.hpp — the schedule IR: per rank, an ordered list of ops.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tdpipe/ir/op.hpp"
#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::ir {

/// A schedule for one pipeline (p ranks). Data-parallel replicas run the same
/// plan; their collectives appear as ALLREDUCE/… ops with `data` members.
struct Plan {
  std::string schedule;  ///< generator name: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, tdpipe
  int stages = 0;        ///< p, pipeline ranks
  int microbatches = 0;  ///< m
  int chunks = 1;        ///< v
  int slices = 1;        ///< S
  int data = 1;          ///< d, data-parallel replicas of this pipeline
  bool lowered = false;  ///< true once SEND/RECV and collectives are placed

  /// stage_of[rank][chunk]: the virtual stage (0 … p·v−1) that chunk runs.
  /// Micro-batches flow forward from virtual stage 0 to p·v−1.
  std::vector<std::vector<int>> stage_of;
  /// Tokens in each temporal slice (size S, sums to the sequence length);
  /// empty when not sliced.
  std::vector<int> slice_tokens;
  /// Transformer layers of each virtual stage (size p·v, sums to the model's layers), as
  /// the planner partitioned them (parallel.layers_per_stage); empty: layer_range's
  /// near-equal split. Costs, the memory model and the executor's stages all read it.
  std::vector<int> stage_layers;
  /// Activation bytes each rank may hold (size p), when the schedule was built under a
  /// memory budget (`auto`); empty: none. validate() checks every rank's peak against it.
  std::vector<double> memory_budget_bytes;

  std::vector<std::vector<Op>> ranks;  ///< ops per rank, in issue order

  /// Set: a serving plan. Its compute ops are PREFILL/DECODE of batches of this table
  /// (Op::mb = batch), one stage per rank; `microbatches` is the batch count.
  std::optional<ServePlan> serve;

  Scenario scenario;  ///< what the plan was made for

  friend bool operator==(const Plan&, const Plan&) = default;

  int num_ranks() const { return static_cast<int>(ranks.size()); }
  int virtual_stages() const { return stages * chunks; }
  const Op& at(OpRef ref) const { return ranks[ref.rank][ref.index]; }
};

/// Layers [first, last) of virtual stage `stage` of `stages`: by `partition` (layers per
/// stage, as Plan::stage_layers) when given, else a near-equal contiguous split of
/// `layers` in which the last `layers % stages` stages get one more (the first stage
/// carries the embedding and the last the head). Throws tdpipe::Error when the
/// partition does not have `stages` entries ≥ 0 summing to `layers`.
std::pair<int, int> layer_range(const std::vector<int>& partition, int layers, int stage, int stages);

}  // namespace tdpipe::ir
