// generators.hpp — schedule generators: compute-only plans (F/B/W/BW per rank).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tdpipe/ir/plan.hpp"

namespace tdpipe::planner {

struct ScheduleParams {
  int stages = 1;        ///< p
  int microbatches = 1;  ///< m
  int chunks = 1;        ///< v (interleaved; zb-v always uses 2)
  int slices = 1;        ///< S (tdpipe)
  /// tdpipe: relative cost of F, B, W of each slice (size S; empty = equal), used
  /// by its list scheduler; and the cap on in-flight activations per rank
  /// (0 = 1F1B's p − r, in slice units ×S).
  std::vector<double> slice_costs;
  int max_inflight = 0;
};

/// All generator names: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, tdpipe.
const std::vector<std::string>& schedule_names();

/// Builds the compute-only plan of a schedule (plan.lowered == false, no costs).
/// Throws tdpipe::Error for an unknown name or impossible parameters (e.g.
/// interleaved with m % p != 0), naming what was expected.
ir::Plan make_schedule(std::string_view name, const ScheduleParams& params);

}  // namespace tdpipe::planner
