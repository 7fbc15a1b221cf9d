// build_plan.hpp — scenario → validated, lowered plan with costs: the one path
// every command takes (generate, cost, lower, validate).
#pragma once

#include <string_view>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/ir/validate.hpp"

namespace tdpipe::planner {

struct BuiltPlan {
  ir::Plan compute_only;         ///< what the generator emitted, with costs
  ir::Plan lowered;              ///< with SEND/RECV, DP collectives, OPT
  ir::ValidationReport report;   ///< validator's memory report of `lowered`
};

/// Chunks a schedule runs with for this scenario: zb-v 2; interleaved the
/// scenario's chunks (2 when the scenario says 1); the others 1.
int chunks_for(std::string_view schedule, const ir::Scenario& scenario);

/// Builds the plan of `schedule` for `scenario`; `slices` = 0 takes the
/// scenario's (tdpipe only; other schedules use 1). Throws tdpipe::Error when the
/// schedule cannot run this scenario (e.g. layers not divisible by p·v).
BuiltPlan build_plan(const ir::Scenario& scenario, std::string_view schedule, int slices = 0);

}  // namespace tdpipe::planner
