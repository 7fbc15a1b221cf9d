// stack_fit.hpp — a software stack's compute efficiency fitted to one observed run
// (`tdpipe calibrate --from-run`): the cluster.compute_efficiency with which the
// analytic engine predicts the run's observed iteration, so that the same stack's other
// layouts, models and scales on those GPUs are predicted with it.
#pragma once

#include <cstdint>
#include <string>

#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/planner/build_plan.hpp"

namespace tdpipe::planner {

struct StackFit {
  double efficiency = 1;         ///< cluster.compute_efficiency that reproduces the observation
  double modelled_seconds = 0;   ///< the iteration predicted at efficiency 1
  double modelled_mfu = 0;
  double fitted_seconds = 0;     ///< the iteration predicted with `efficiency`
  double fitted_mfu = 0;
};

/// The iteration (analytic engine) and MFU of `scenario` under `schedule` (S = `slices`).
StackFit predict_with_efficiency(const ir::Scenario& scenario, const std::string& schedule, int slices,
                                 double efficiency, std::int64_t max_ops = kDefaultMaxOps);

/// Fits cluster.compute_efficiency in [0.01, 100] so that `scenario` under `schedule`
/// predicts `observed_seconds` an iteration (to 1e-7 relative in the efficiency). The
/// predicted iteration falls as the efficiency rises — every compute op shortens,
/// communication stays — so the fit is a bisection on its logarithm. Throws
/// tdpipe::Error naming the scenario when no efficiency in range reproduces it (the
/// run's communication and bubbles alone exceed it, or it is 100× slower than modelled).
StackFit fit_compute_efficiency(const ir::Scenario& scenario, const std::string& schedule, int slices,
                                double observed_seconds, std::int64_t max_ops = kDefaultMaxOps);

}  // namespace tdpipe::planner
