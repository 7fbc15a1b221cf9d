// evaluator.hpp — the analytic engine: replays a lowered plan with the cost model's
// op durations and latency + bytes/bandwidth communication, no contention.
#pragma once

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::planner {

/// Predicted trace of one iteration (origin "analytic").
traces::Trace evaluate(const ir::Plan& plan);

}  // namespace tdpipe::planner
