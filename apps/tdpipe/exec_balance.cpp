// exec_balance.cpp — the load balancer in the training loop (see exec_balance.hpp).
#include "exec_balance.hpp"

#include "exec_common.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/balance.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/traces/metrics.hpp"

namespace tdpipe::apps {
namespace {

/// One layout the loop can run: the partition, and which device (pipeline slot at the
/// start) runs each stage.
struct Layout {
  ir::Scenario scenario;
  std::vector<int> layers;
  std::vector<int> origin;  ///< stage k runs on the device that started in slot origin[k]
  auto key() const { return std::pair(layers, origin); }
};

/// Each rank's F+B+W per micro-batch in ms, the median over the segment's steps.
std::vector<double> stage_ms(const ir::Plan& plan, const std::vector<traces::Trace>& steps) {
  std::vector<std::vector<double>> per_step(static_cast<std::size_t>(plan.num_ranks()));
  for (const auto& t : steps) {
    std::vector<double> ms(per_step.size(), 0.0);
    for (const auto& e : t.events)
      if (e.kind && e.rank >= 0 && e.rank < plan.num_ranks() && ir::is_chunk_work(*e.kind))
        ms[static_cast<std::size_t>(e.rank)] += 1e-6 * static_cast<double>(e.dur_ns) / plan.microbatches;
    for (std::size_t k = 0; k < ms.size(); ++k) per_step[k].push_back(ms[k]);
  }
  std::vector<double> out;
  for (auto& v : per_step) out.push_back(traces::median(v));
  return out;
}

}  // namespace

exec::cpu::RunResult run_balanced(const ir::Scenario& sc, ir::Plan& plan, int steps,
                                  const std::vector<double>& rank_speed, const BalanceLoop& loop,
                                  const RunSegment& run_segment) {
  if (sc.synthetic)
    throw Error(fmt::format("--balance-every: {} is synthetic; the balancer re-partitions a model's layers", sc.name));
  if (plan.chunks != 1)
    throw Error(fmt::format("--balance-every: the balancer re-partitions one model chunk per rank; {} runs {} "
                            "chunks",
                            plan.schedule, plan.chunks));
  if (loop.every < 1) throw Error(fmt::format("--balance-every {}: expected at least 1 step", loop.every));
  const int p = plan.num_ranks();
  // Device factors move with the devices; the ends' factors stay with their stages.
  planner::Ewma device(loop.alpha), ends(loop.alpha);
  Layout current{sc, plan.stage_layers, std::vector<int>(static_cast<std::size_t>(p))};
  std::iota(current.origin.begin(), current.origin.end(), 0);
  std::map<decltype(current.key()), std::pair<Layout, double>> measured;  // layout → its last segment's iteration
  std::optional<exec::cpu::TrainState> state;
  exec::cpu::RunResult out;
  std::vector<double> losses, iterations;
  std::vector<std::int64_t> wire;
  std::vector<exec::LossScaleStep> scaler;
  std::vector<double> busy;  // per world rank, over every segment
  for (int done = 0; done < steps;) {
    const int n = std::min(loop.every, steps - done);
    std::vector<double> speed;
    for (int k = 0; k < p; ++k) speed.push_back(rank_speed.at(static_cast<std::size_t>(current.origin[k])));
    out = run_segment(plan, n, state, speed);
    for (const auto& t : out.step_traces) {
      const planner::Slowdown s = planner::measured_slowdown(current.scenario, plan, t);
      device.add(s.device);
      ends.add(s.ends);
    }
    state = out.state;
    losses.insert(losses.end(), out.loss_per_step.begin(), out.loss_per_step.end());
    iterations.insert(iterations.end(), out.iteration_seconds.begin(), out.iteration_seconds.end());
    wire.insert(wire.end(), out.dp_wire_bytes.begin(), out.dp_wire_bytes.end());
    scaler.insert(scaler.end(), out.loss_scale.begin(), out.loss_scale.end());
    busy.resize(out.rank_compute_seconds.size(), 0.0);
    for (std::size_t w = 0; w < busy.size(); ++w) busy[w] += out.rank_compute_seconds[w];
    const std::vector<double> ms = stage_ms(plan, out.step_traces);
    // Each segment starts a fresh run whose first step pays for allocations: its
    // iteration is the median of the steps after it (of the only step, for K = 1).
    const double iteration = steady_iteration_seconds(out.iteration_seconds);
    fmt::print(stderr,
               "steps {}-{} on layers [{}]: F+B+W per micro-batch [{:.1f}] ms, slowest / fastest {:.0f} % "
               "(measured, median of {} steps), iteration {:.1f} ms\n",
               done, done + n - 1, fmt::join(plan.stage_layers, ","), fmt::join(ms, ", "),
               100 * (*std::max_element(ms.begin(), ms.end()) / *std::min_element(ms.begin(), ms.end()) - 1), n,
               1e3 * iteration);
    done += n;
    measured.insert_or_assign(current.key(), std::pair(current, iteration));
    if (done >= steps) break;

    const planner::Rebalance b = planner::rebalance(current.scenario, {device.value(), ends.value()});
    Layout next{b.scenario, b.layers_after, {}};
    for (int k = 0; k < p; ++k) next.origin.push_back(current.origin[static_cast<std::size_t>(b.device_of_stage[k])]);
    // The fastest layout measured so far: a proposal that already ran slower than it is
    // not tried again (the linear stage model can be wrong; the iteration is not).
    const auto best = std::min_element(measured.begin(), measured.end(), [](const auto& x, const auto& y) {
      return x.second.second < y.second.second;
    });
    if (auto it = measured.find(next.key());
        it != measured.end() && next.key() != best->first && it->second.second > best->second.second) {
      fmt::print(stderr, "step {}: the balancer proposes layers [{}], which measured {:.1f} ms an iteration; "
                 "staying with the fastest measured, [{}] ({:.1f} ms)\n",
                 done, fmt::join(next.layers, ","), 1e3 * it->second.second, fmt::join(best->second.first.layers, ","),
                 1e3 * best->second.second);
      next = best->second.first;
    } else if (next.key() != current.key()) {
      fmt::print(stderr, "step {}: re-balanced to layers [{}] ({:.0f} % predicted)\n", done,
                 fmt::join(next.layers, ","), 100 * b.spread_after);
    }
    if (next.key() == current.key()) continue;
    // The device history follows the devices to their new slots.
    std::vector<int> from;
    for (int k = 0; k < p; ++k)
      from.push_back(static_cast<int>(std::find(current.origin.begin(), current.origin.end(), next.origin[k]) -
                                      current.origin.begin()));
    device.reorder(from);
    current = std::move(next);
    plan = planner::build_plan(current.scenario, loop.schedule, loop.slices, loop.max_ops).lowered;
  }
  out.loss_per_step = std::move(losses);
  out.iteration_seconds = std::move(iterations);
  out.dp_wire_bytes = std::move(wire);
  out.loss_scale = std::move(scaler);
  out.rank_compute_seconds = std::move(busy);
  out.first_step = 0;  // the segments' history starts at the run's first step
  out.step_traces.clear();
  return out;
}

}  // namespace tdpipe::apps
