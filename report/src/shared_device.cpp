// shared_device.cpp — processor sharing as a fixed point over an engine's predictions
// (semantics in shared_device.hpp).
#include "tdpipe/report/shared_device.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tdpipe/traces/sharing.hpp"

namespace tdpipe::report {

traces::Trace predict_shared(const ir::Plan& plan, const Engine& engine, int max_iterations) {
  const double capacity = plan.scenario.cluster.shared_capacity / std::max(1, plan.data);
  if (!(capacity > 0)) return engine(plan);

  ir::Plan cur = plan;
  traces::Trace trace = engine(cur);
  double alpha = 1.0, last_change = INFINITY;
  int iteration = 1;
  bool converged = false;
  for (; iteration < max_iterations; ++iteration) {
    const auto index = traces::plan_event_index(cur, trace);
    const std::vector<double> rate = traces::shared_rates(trace, capacity);
    double change = 0;
    for (std::size_t r = 0; r < cur.ranks.size(); ++r)
      for (std::size_t i = 0; i < cur.ranks[r].size(); ++i) {
        ir::Op& op = cur.ranks[r][i];
        const int e = index[r][i];
        if (!ir::is_compute(op.kind) || e < 0 || !(op.est_seconds > 0)) continue;
        const double target = plan.ranks[r][i].est_seconds / rate[static_cast<std::size_t>(e)];
        const double next = op.est_seconds + alpha * (target - op.est_seconds);
        change = std::max(change, std::abs(next - op.est_seconds) / op.est_seconds);
        op.est_seconds = next;
      }
    if (change < 1e-3) {
      converged = true;
      break;
    }
    if (change >= last_change) alpha = std::max(0.125, alpha / 2);  // oscillating: damp
    last_change = change;
    trace = engine(cur);
  }
  trace.metadata["shared_device_capacity"] = std::to_string(capacity);
  trace.metadata["shared_device_iterations"] = std::to_string(iteration);
  trace.metadata["shared_device_converged"] = converged ? "true" : "false";
  return trace;
}

}  // namespace tdpipe::report
