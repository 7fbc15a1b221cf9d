// generators.hpp — schedule generators: compute-only plans (F/B/W/BW per rank).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tdpipe/ir/plan.hpp"

namespace tdpipe::planner {

/// What the `auto` scheduler schedules with, per pipeline rank r and slice s: op
/// seconds, the activation bytes each op adds (F > 0) or frees (B, W ≤ 0), the time a
/// dependency between ranks r and r+1 costs, and each rank's activation budget.
/// Empty: unit costs (F = B = W = 1), F holds one unit until its B, no latency, and a
/// budget of p micro-batches (1F1B's peak) on every rank.
struct AutoCosts {
  std::vector<std::vector<double>> f_seconds, b_seconds, w_seconds;  ///< [rank][slice]
  std::vector<std::vector<double>> f_bytes, b_bytes, w_bytes;        ///< [rank][slice]
  std::vector<double> p2p_seconds;   ///< [r], r < p−1: between rank r and r+1
  std::vector<double> budget_bytes;  ///< [rank]
  bool split_backward = true;        ///< false: fused BW (B + W as one op)
};

struct ScheduleParams {
  int stages = 1;        ///< p
  int microbatches = 1;  ///< m
  int chunks = 1;        ///< v (interleaved; zb-v always uses 2)
  int slices = 1;        ///< S (tdpipe)
  /// tdpipe: relative cost of F, B, W of each slice (size S; empty = equal), used
  /// by its list scheduler; and the cap on in-flight activations per rank
  /// (0 = 1F1B's p − r, in slice units ×S).
  std::vector<double> slice_costs;
  /// Tokens per slice when the planner chose the cuts (slices auto); empty: apply_costs
  /// cuts equal-cost slices. Not read by the generators.
  std::vector<int> slice_tokens;
  int max_inflight = 0;
  AutoCosts auto_costs;  ///< auto only
};

/// All generator names: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, tdpipe, auto.
const std::vector<std::string>& schedule_names();

/// Builds the compute-only plan of a schedule (plan.lowered == false, no costs).
/// Throws tdpipe::Error for an unknown name or impossible parameters (e.g.
/// interleaved with m % p != 0), naming what was expected.
ir::Plan make_schedule(std::string_view name, const ScheduleParams& params);

}  // namespace tdpipe::planner
