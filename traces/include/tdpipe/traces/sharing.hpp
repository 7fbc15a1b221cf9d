// sharing.hpp — ranks that share one device (the CPU backend's cores, several pipeline
// stages on one GPU) slow each other down. Processor sharing with capacity C: while k
// compute ops run, each advances at min(1, C/k) of full speed. From a measured trace,
// an op's work (its duration alone on the device) is ∫ min(1, C/k(t)) dt over its
// span; a prediction gives each op its work back by running at the rates its
// neighbours leave it (planner::predict_shared).
#pragma once

#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

/// Per event of `trace`: its average speed under processor sharing of `capacity`
/// among all compute events (every rank), in (0, 1]; 1 for non-compute events and
/// for zero-length ones. capacity ≤ 0: every event 1.
std::vector<double> shared_rates(const Trace& trace, double capacity);

/// [rank][op]: the index in trace.events of plan op (rank, op), or −1. Matched as
/// pair_ops pairs two traces: by (rank, ir::op_to_text name), the n-th op of a name
/// to its n-th event in start order — how the executors and engines name events.
std::vector<std::vector<int>> plan_event_index(const ir::Plan& plan, const Trace& trace);

}  // namespace tdpipe::traces
