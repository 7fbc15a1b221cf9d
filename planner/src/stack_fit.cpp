// stack_fit.cpp — cluster.compute_efficiency from one observed iteration (bisection).
#include "tdpipe/planner/stack_fit.hpp"

#include <cmath>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/traces/metrics.hpp"

namespace tdpipe::planner {

StackFit predict_with_efficiency(const ir::Scenario& scenario, const std::string& schedule, int slices,
                                 double efficiency, std::int64_t max_ops) {
  ir::Scenario sc = scenario;
  sc.cluster.compute_efficiency = efficiency;
  const BuiltPlan built = build_plan(sc, schedule, slices, max_ops);
  StackFit f;
  f.efficiency = efficiency;
  f.fitted_seconds = double(traces::compute_metrics(evaluate(built.lowered)).iteration_ns) * 1e-9;
  f.fitted_mfu = mfu(sc, f.fitted_seconds);
  return f;
}

StackFit fit_compute_efficiency(const ir::Scenario& scenario, const std::string& schedule, int slices,
                                double observed_seconds, std::int64_t max_ops) {
  constexpr double kLo = 0.01, kHi = 100;  // the range scenario_check accepts
  if (scenario.synthetic)
    throw Error(fmt::format("{}: a synthetic scenario gives its op times, the cost model does not price them: "
                            "there is no compute efficiency to fit (use a model and a cluster)", scenario.name));
  if (!(observed_seconds > 0) || !std::isfinite(observed_seconds))
    throw Error(fmt::format("{}: observed iteration {} s: expected a positive number of seconds", scenario.name,
                            observed_seconds));
  auto at = [&](double e) { return predict_with_efficiency(scenario, schedule, slices, e, max_ops).fitted_seconds; };
  const double fastest = at(kHi), slowest = at(kLo);
  if (observed_seconds < fastest)
    throw Error(fmt::format("{}: the observed {:.4g} s an iteration is shorter than tdpipe predicts for this layout "
                            "({}) even with compute {:g}x faster than modelled ({:.4g} s): its communication and "
                            "bubbles alone take longer; check the scenario's layout, batch and cluster",
                            scenario.name, observed_seconds, schedule, kHi, fastest));
  if (observed_seconds > slowest)
    throw Error(fmt::format("{}: the observed {:.4g} s an iteration is longer than tdpipe predicts with compute at {:g} "
                            "of the modelled speed ({:.4g} s); check the scenario's layout, batch and cluster",
                            scenario.name, observed_seconds, kLo, slowest));
  double lo = std::log(kLo), hi = std::log(kHi);  // at(e^lo) ≥ observed ≥ at(e^hi)
  for (int k = 0; k < 64 && hi - lo > 1e-7; ++k) {
    const double mid = 0.5 * (lo + hi);
    (at(std::exp(mid)) > observed_seconds ? lo : hi) = mid;
  }
  StackFit fit = predict_with_efficiency(scenario, schedule, slices, std::exp(0.5 * (lo + hi)), max_ops);
  // A plan whose shape moves with the costs (the auto scheduler, auto partitions or slices)
  // may not fall smoothly with the efficiency: say so rather than hand back a poor fit.
  if (std::abs(fit.fitted_seconds / observed_seconds - 1) > 1e-3)
    throw Error(fmt::format("{}: no compute efficiency reproduces {:.6g} s under {} (the closest, {:.4f}, predicts "
                            "{:.6g} s): the plan changes with the costs; fit a schedule with a fixed order and "
                            "partition (e.g. 1f1b)", scenario.name, observed_seconds, schedule, fit.efficiency,
                            fit.fitted_seconds));
  const StackFit modelled = predict_with_efficiency(scenario, schedule, slices, 1, max_ops);
  fit.modelled_seconds = modelled.fitted_seconds;
  fit.modelled_mfu = modelled.fitted_mfu;
  return fit;
}

}  // namespace tdpipe::planner
