// profile_costs.hpp — op durations from a calibration profile (tdpipe calibrate) instead
// of the cost model's est_seconds.
#pragma once

#include <functional>
#include <optional>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/profile.hpp"

namespace tdpipe::sim {

/// A SimOptions::op_seconds function reading compute op durations from `profile`
/// (ops it does not list keep est_seconds). Throws tdpipe::Error when the profile was
/// measured for another scenario or pipeline depth than the plan's.
std::function<std::optional<double>(const ir::Op&, int rank)> profile_op_seconds(
    const traces::Profile& profile, const ir::Plan& plan);

}  // namespace tdpipe::sim
