// balance.hpp — the design document's load balancer: measured stage times smoothed by
// an exponentially weighted moving average, layers re-partitioned by the min-max
// programme (partition_by) and stages assigned to devices by a bottleneck assignment.
#pragma once

#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::planner {

/// What measured iterations say about a pipeline, relative to the cost model.
struct Slowdown {
  /// Per pipeline slot: its device's decoder-layer time over the cost model's (1 = as
  /// modelled, 2 = twice as slow). A device property: it moves with the device.
  std::vector<double> device;
  /// Per stage: its embedding / head / loss time over the cost model's, once its
  /// device's factor is taken out — the cost model's error on the ends, which stays with
  /// the stage when it moves to another device. Empty or 1: as modelled.
  std::vector<double> ends;
};

/// The Slowdown of one measured iteration of `plan` (of `scenario`). Per rank, the
/// measured durations of its compute ops (F, B, W, BW) in `trace` against the plan's
/// est_seconds of the same ops (matched by kind, micro-batch, chunk and slice); with
/// data-parallel replicas (workers replica · p + rank) all replicas of a rank together.
/// Where every compute event of a rank says how much of it ran in decoder layers
/// (TraceEvent::layers_ns, the CPU backend's) and the plan has one chunk per rank, the
/// layers give `device` and the rest gives `ends`, each against the cost model's
/// one-micro-batch F+B+W of that part (a stage the model gives no ends: its whole time
/// against its layers'); otherwise `device` is the whole ratio and `ends` is 1. Throws tdpipe::Error when the trace has no compute op of a rank, names ops the
/// plan does not have, or says (metadata "stage_layers") it ran another partition.
Slowdown measured_slowdown(const ir::Scenario& scenario, const ir::Plan& plan, const traces::Trace& trace);

/// Exponentially weighted moving average of per-rank values over iterations:
/// x ← α·sample + (1−α)·x, the first sample taken as is (α in (0, 1]).
class Ewma {
 public:
  explicit Ewma(double alpha);
  void add(const std::vector<double>& sample);
  /// value[k] ← value[from[k]]: the devices moved (rebalance's device_of_stage).
  void reorder(const std::vector<int>& from);
  const std::vector<double>& value() const { return value_; }
  int samples() const { return samples_; }

 private:
  double alpha_;
  std::vector<double> value_;
  int samples_ = 0;
};

/// Minimum-cost perfect assignment of rows to columns of a square matrix (Hungarian
/// algorithm, O(n³)); returns column of each row.
std::vector<int> min_sum_assignment(const std::vector<std::vector<double>>& cost);

/// Bottleneck assignment: the perfect assignment whose largest cost is least (the
/// pipeline runs at its slowest stage), then among those the least total (so the other
/// stages are as fast as they can be). Returns column of each row.
std::vector<int> bottleneck_assignment(const std::vector<std::vector<double>>& cost);

struct Rebalance {
  std::vector<int> layers_before, layers_after;   ///< per stage
  std::vector<int> device_of_stage;               ///< stage k runs on pipeline slot device_of_stage[k]
  std::vector<double> seconds_before, seconds_after;  ///< per stage, one micro-batch's F+B+W
  double spread_before = 0, spread_after = 0;     ///< slowest / fastest stage − 1
  int rounds = 0;                                 ///< partition ⇄ assignment alternations
  ir::Scenario scenario;  ///< the input with parallel.layers_per_stage (and groups reordered if moved)
};

/// Re-plans the layer partition (and which device slot runs which stage) for the
/// scenario's plan layout (one chunk per rank) given the measured Slowdown (smoothed).
/// Stage k with n layers on slot j takes device[j] · (n · layer + ends[k] · ends_k) on
/// slot j's GPU (layer, ends_k: the cost model's one-micro-batch F+B+W). Alternates
/// the exact min-max partition for a fixed assignment with the bottleneck assignment
/// for a fixed partition until neither changes (each step can only lower the
/// bottleneck). Assignments that cannot be written as an order of the cluster's node
/// groups (each group's slots consecutive) are not applied: the slots stay in rank
/// order. Throws for scenarios with chunks > 1 or synthetic ones.
Rebalance rebalance(const ir::Scenario& scenario, const Slowdown& slowdown);

}  // namespace tdpipe::planner
