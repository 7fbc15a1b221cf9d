// profile_costs.cpp — looks up measured op durations for a plan's ops.
#include "tdpipe/sim/profile_costs.hpp"

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::sim {

std::function<std::optional<double>(const ir::Op&, int rank)> profile_op_seconds(
    const traces::Profile& profile, const ir::Plan& plan) {
  if (!profile.scenario.empty() && profile.scenario != plan.scenario.name)
    throw Error(fmt::format("profile was measured for scenario '{}', but the plan is for '{}'; "
                            "calibrate this scenario first (tdpipe calibrate)",
                            profile.scenario, plan.scenario.name));
  if (profile.stages > 0 && profile.stages != plan.stages)
    throw Error(fmt::format("profile was measured with p = {} pipeline stages, the plan has p = {}; "
                            "its per-chunk op times do not apply",
                            profile.stages, plan.stages));
  return [profile, stage_of = plan.stage_of](const ir::Op& op, int rank) -> std::optional<double> {
    if (!ir::is_compute(op.kind)) return std::nullopt;
    int vs = -1;
    if (rank >= 0 && rank < static_cast<int>(stage_of.size()) && op.chunk >= 0 &&
        op.chunk < static_cast<int>(stage_of[rank].size()))
      vs = stage_of[rank][op.chunk];
    return traces::profile_seconds(profile, op.kind, vs, op.slice);
  };
}

}  // namespace tdpipe::sim
