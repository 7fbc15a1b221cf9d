// validate.hpp — rejects broken plans before anything runs; reports memory.
#pragma once

#include <vector>

#include "tdpipe/ir/plan.hpp"

namespace tdpipe::ir {

struct RankMemory {
  int peak_inflight = 0;               ///< activations alive at once (F done, its B/BW not yet)
  double peak_activation_bytes = 0;    ///< from ops' mem_bytes
  double budget_bytes = 0;             ///< the plan's memory budget for this rank (0: none)
};

struct ValidationReport {
  std::vector<RankMemory> ranks;
};

/// Checks: every compute op of every (mb, virtual stage, slice) exactly once, B/BW
/// after its F, W after its B, slice order, every SEND has its RECV (peer, payload,
/// ids, bytes), that the blocking order cannot deadlock (via replay()), and, where the
/// plan has a memory budget, that no rank's peak activation bytes exceed it.
/// Throws tdpipe::Error naming the ranks and ops involved.
ValidationReport validate(const Plan& plan);

struct ValidateOptions {
  /// Replay the plan to prove that blocking send/recv cannot deadlock. Every check
  /// runs by default; ir::lower's output is deadlock-free by construction (its
  /// replay of the compute-only plan succeeded and it posts transfers in that
  /// replay's one global order, see lowering.cpp), so planner::build_plan skips
  /// the replay for the plan lower() just returned. A plan from anywhere else
  /// (a file, a hand edit) must be validated with the replay.
  bool check_deadlock = true;
};

/// validate(plan) with options; the other checks always run.
ValidationReport validate(const Plan& plan, const ValidateOptions& options);

}  // namespace tdpipe::ir
