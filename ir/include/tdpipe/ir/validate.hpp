// validate.hpp — rejects broken plans before anything runs; reports memory.
#pragma once

#include <vector>

#include "tdpipe/ir/plan.hpp"

namespace tdpipe::ir {

struct RankMemory {
  int peak_inflight = 0;               ///< activations alive at once (F done, its B/BW not yet)
  double peak_activation_bytes = 0;    ///< from ops' mem_bytes
};

struct ValidationReport {
  std::vector<RankMemory> ranks;
};

/// Checks: every compute op of every (mb, virtual stage, slice) exactly once, B/BW
/// after its F, W after its B, slice order, every SEND has its RECV (peer, payload,
/// ids, bytes), and that the blocking order cannot deadlock (via replay()).
/// Throws tdpipe::Error naming the ranks and ops involved.
ValidationReport validate(const Plan& plan);

}  // namespace tdpipe::ir
