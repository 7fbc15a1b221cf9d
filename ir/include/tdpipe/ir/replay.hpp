// replay.hpp — runs a plan's op order as a dependency-driven event simulation
// with given durations and blocking (rendezvous) SEND/RECV semantics. The validator
// (zero durations: can every op complete?) and the analytic evaluator share it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tdpipe/ir/plan.hpp"

namespace tdpipe::ir {

/// Start and end of one op, in nanoseconds. For SEND/RECV: from posting to completion.
struct OpTiming {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

struct ReplayResult {
  std::vector<std::vector<OpTiming>> timing;  ///< [rank][op index]
  std::int64_t makespan_ns = 0;
};

/// Duration of an op in ns; for a SEND/RECV pair it is called with the SEND and
/// gives the transfer time once both sides are posted.
using DurationFn = std::function<std::int64_t(const Op& op, int rank)>;

/// Replays the plan. Semantics: each (rank, stream) runs its ops in plan order; an
/// op starts when the previous op of its stream is done and its `deps` (and, for a
/// compute op, the RECVs carrying its inputs, or in a compute-only plan its producers
/// themselves; for a SEND, the op on its rank that produces what it carries) are
/// done; comm ops sharing a `batch`
/// are posted together and the stream moves on when all of them completed; a
/// SEND/RECV pair completes `duration` after both sides are posted. Compute-only
/// plans: a cross-rank dependency adds the duration the function gives for a
/// synthetic SEND (kind SEND, payload and ids of the producer). An op with
/// ready_after < 1 (a gradient bucket) may start that fraction of the way through its
/// first dependency's run, once that one ended (its duration is fixed).
/// Throws tdpipe::Error naming every blocked rank, its op and its peer if the
/// order deadlocks.
ReplayResult replay(const Plan& plan, const DurationFn& duration);

/// replay() with the timing in one array, rank after rank: op i of rank r at
/// (ops of ranks 0 … r−1) + i. Saves ReplayResult's per-rank copy (16 bytes an op)
/// where millions of ops are replayed (the analytic evaluator).
std::vector<OpTiming> replay_flat(const Plan& plan, const DurationFn& duration);

}  // namespace tdpipe::ir
