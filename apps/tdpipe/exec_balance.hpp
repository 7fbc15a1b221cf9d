// exec_balance.hpp — the load balancer in the training loop (`tdpipe exec
// --balance-every K`), for either backend: run K steps, read each rank's slowdown from
// every step's measured trace (EWMA), re-partition (planner::rebalance), re-plan, and go
// on from the same weights and Adam state. A partition that measured slower than one
// already run is not kept: the loop goes back to the fastest measured.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::apps {

/// Runs `steps` steps of `plan` from `start` (a fresh model when unset) with pipeline
/// rank k at speed rank_speed[k]; the result must carry step_traces (every step's) and
/// state.
using RunSegment = std::function<exec::cpu::RunResult(const ir::Plan& plan, int steps,
                                                      const std::optional<exec::cpu::TrainState>& start,
                                                      const std::vector<double>& rank_speed)>;

/// `base` (CpuRunOptions or CudaRunOptions) as one segment runs it: its steps, its
/// ranks' speeds, the state it starts from, and every step's trace kept.
template <class RunOptions>
RunOptions segment_options(RunOptions base, int steps, const std::optional<exec::cpu::TrainState>& start,
                           const std::vector<double>& rank_speed) {
  base.train.steps = steps;
  base.train.rank_speed = rank_speed;
  base.start = start;
  base.keep_step_traces = true;
  // An injected overflow goes to the segment whose steps hold its step.
  const int first = start ? start->steps_done : 0;
  if (base.train.inject_overflow.step < first || base.train.inject_overflow.step >= first + steps)
    base.train.inject_overflow = {};
  return base;
}

struct BalanceLoop {
  int every = 0;        ///< steps per segment (K)
  double alpha = 0.3;   ///< EWMA weight of each newer step
  std::string schedule;
  int slices = 0;
  std::int64_t max_ops = 0;
};

/// Trains `scenario` for `steps` steps in segments of loop.every, re-balancing between
/// them (progress on stderr). `plan` is the scenario's plan on entry and the last
/// segment's on return; `rank_speed` is per device (pipeline slot at the start). The
/// result holds every segment's losses and iteration times in order, and the last
/// segment's trace, weights, gradients and state.
exec::cpu::RunResult run_balanced(const ir::Scenario& scenario, ir::Plan& plan, int steps,
                                  const std::vector<double>& rank_speed, const BalanceLoop& loop,
                                  const RunSegment& run_segment);

}  // namespace tdpipe::apps
