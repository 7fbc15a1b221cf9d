// shared_device.hpp — predictions for ranks that share one device (the CPU backend's
// threads on a few cores, several pipeline stages on one GPU): processor sharing on
// top of either engine. Downstream of both (the caller hands in the engine), so that
// the planner never calls the simulator.
#pragma once

#include <functional>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::report {

using Engine = std::function<traces::Trace(const ir::Plan&)>;

/// Without plan.scenario.cluster.shared_capacity: engine(plan). With capacity C: each
/// compute op's est_seconds is its work alone on the device; the prediction runs
/// `engine`, gives every compute op the duration work / (its average rate in that
/// prediction under processor sharing of C / plan.data among the compute ops running
/// at once — replicas run alike and split the device), and repeats until no duration
/// moves by more than 0.1 %. The fixed point is the processor-sharing timeline under
/// the engine's own rules (order, dependencies, rendezvous, links). Damped when the
/// iteration oscillates; stops after `max_iterations` and says so in the trace's
/// metadata ("shared_device_iterations", "shared_device_converged").
traces::Trace predict_shared(const ir::Plan& plan, const Engine& engine, int max_iterations = 40);

}  // namespace tdpipe::report
