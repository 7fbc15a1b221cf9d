// plan_input.hpp — what `tdpipe sim|exec|calibrate` take: a scenario (built into a plan
// here) or a plan file (`tdpipe plan --format json -o PLAN.json`), which carries its
// scenario and its ops' costs, so that no consumer re-plans it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tdpipe/planner/build_plan.hpp"

namespace tdpipe::planner {

struct PlanInput {
  ir::Scenario scenario;  ///< the scenario file's, or the plan file's own
  std::string schedule;   ///< the plan's schedule
  BuiltPlan built;        ///< from a plan file: `lowered` and `report` (no compute_only)
  bool plan_file = false; ///< read from a plan file, as it is
};

/// Whether `path` holds a tdpipe plan in JSON (an object with "ranks" and "scenario").
bool is_plan_file(const std::string& path);

/// load_plan_input's plan-file half: the plan in `path`, or nullopt when `path` is not a
/// plan file (the file is read once either way).
std::optional<PlanInput> load_plan_file(const std::string& path, const std::string& schedule = "", int slices = 0,
                                        std::int64_t max_ops = kDefaultMaxOps);

/// A scenario file built for `schedule` (empty: the scenario's) with `slices` (0: the
/// scenario's), or a plan file taken as it is — lowered or lowered here, then validated.
/// A plan file refuses a `schedule` or `slices` other than its own, naming both.
/// Throws tdpipe::Error naming the file.
PlanInput load_plan_input(const std::string& path, const std::string& schedule = "", int slices = 0,
                          std::int64_t max_ops = kDefaultMaxOps);

}  // namespace tdpipe::planner
