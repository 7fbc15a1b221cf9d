// evaluator.hpp — the analytic engine: replays a lowered plan with the cost model's
// op durations and latency + bytes/bandwidth communication, no contention.
//
// Placement (real clusters): tensor-parallel groups of `tensor` consecutive GPUs sit
// inside a node, and pipeline rank r of data-parallel replica d uses GPUs
// (d·p + r)·t … (d·p + r)·t + t − 1, so consecutive pipeline ranks are consecutive TP
// groups. Two pipeline ranks talk over NVLink when their GPUs share a node, else over
// InfiniBand (one NIC's bandwidth per GPU pair); a DP group uses NVLink only if all
// its members share a node. Synthetic scenarios: every link has p2p_latency and
// infinite bandwidth.
#pragma once

#include <cstdint>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::planner {

/// Predicted trace of one iteration (origin "analytic").
traces::Trace evaluate(const ir::Plan& plan);

/// The op durations evaluate() uses (ns): compute llround(est_seconds·1e9); SEND
/// latency + bytes/bandwidth of the link between the two ranks; collectives a ring
/// over the DP group (all-reduce 2(n−1)/n·S/B + 2(n−1)·α; reduce-scatter and
/// all-gather half of that); everything else est_seconds.
ir::DurationFn analytic_durations(const ir::Plan& plan);

/// Seconds to move `bytes` from pipeline rank `from` to `to` under plan.scenario.
double p2p_seconds(const ir::Plan& plan, int from, int to, std::int64_t bytes);

/// Seconds of a ring all-reduce of `bytes` over pipeline rank `rank`'s DP group (plan.data members).
double allreduce_seconds(const ir::Plan& plan, int rank, std::int64_t bytes);
/// The same ring's reduce-scatter (or all-gather): d − 1 steps of bytes/d.
double reduce_scatter_seconds(const ir::Plan& plan, int rank, std::int64_t bytes);
/// A COMPRESSED_ALLREDUCE's exchange of `bytes` (its kernels aside): an all-to-all round
/// and a ring all-gather — an all-reduce's volume in d latencies instead of 2(d − 1).
double compressed_allreduce_seconds(const ir::Plan& plan, int rank, std::int64_t bytes);

}  // namespace tdpipe::planner
