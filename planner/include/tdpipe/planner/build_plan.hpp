// build_plan.hpp — scenario → validated, lowered plan with costs: the one path
// every command takes (generate, cost, lower, validate).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

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

/// Plans with more ops than this (all ranks, compute and communication) are refused
/// before anything is allocated; the commands' --max-ops raises it. 10 M ops hold
/// about 2.5 GiB while planned and take seconds to simulate.
inline constexpr std::int64_t kDefaultMaxOps = 10'000'000;

/// build_plan's `slices` for "slices auto" (--slices auto): TeraPipe's cuts.
inline constexpr int kAutoSlices = -1;

/// The grid of TeraPipe's cut points that `slices: auto` plans on (units of the sequence).
inline constexpr int kAutoSliceUnits = 128;

/// The slice lengths `slices: auto` runs for this scenario: solve_slices_terapipe over a
/// grid of `max_units` cut points, with one slice's compute = the bottleneck stage's
/// F+B+W at that length and prefix (cost model) and its transfer = activation and
/// gradient over the slowest pipeline link (analytic placement). Model scenarios only.
std::vector<int> auto_slice_tokens(const ir::Scenario& scenario, int max_units = kAutoSliceUnits);

/// Upper bound on the ops of the lowered plan: per rank and per (micro-batch, chunk,
/// slice) F, B and W plus at most four SEND/RECV (and under parameter offload a LOAD per
/// layer of the fullest stage for F and for B), and a few per rank for the optimizer and
/// data-parallel buckets (and OPT's copies). Computed in 64 bits from the scenario alone;
/// slices auto counts the most slices the solver can choose (one per grid unit).
std::int64_t estimate_ops(const ir::Scenario& scenario, std::string_view schedule, int slices = 0);

/// Builds the plan of `schedule` for `scenario`; `slices` = 0 takes the
/// scenario's, kAutoSlices TeraPipe's (tdpipe and auto only; other schedules use 1). Throws tdpipe::Error when the
/// schedule cannot run this scenario (e.g. layers not divisible by p·v) or when
/// estimate_ops exceeds `max_ops` (naming the estimate, its memory and the limit).
BuiltPlan build_plan(const ir::Scenario& scenario, std::string_view schedule, int slices = 0,
                     std::int64_t max_ops = kDefaultMaxOps);

}  // namespace tdpipe::planner
