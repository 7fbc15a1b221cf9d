// metrics.hpp — what a timeline says: iteration time, bubbles, compute and
// exposed / hidden communication per rank.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

/// Of one rank. "Idle" has one meaning in tdpipe: time a rank's compute stream does
/// not run, less communication that leaves compute waiting (exposed). idle_ns counts it
/// over the whole iteration (so a rank that starts late or ends early is idle then: the
/// pipeline's fill and drain); idle_in_span_ns over the rank's own first-to-last op,
/// which is what HTA's temporal breakdown calls idle time.
struct RankMetrics {
  std::int64_t compute_ns = 0;         ///< union of compute-stream busy time
  std::int64_t exposed_comm_ns = 0;    ///< comm busy while compute is idle
  std::int64_t hidden_comm_ns = 0;     ///< comm busy while compute is busy
  std::int64_t idle_ns = 0;            ///< iteration − compute − exposed comm
  double idle_fraction = 0;            ///< (iteration − compute) / iteration
  std::int64_t span_ns = 0;            ///< the rank's first op start to last op end
  std::int64_t idle_in_span_ns() const { return span_ns - compute_ns - exposed_comm_ns; }
};

struct Metrics {
  std::int64_t iteration_ns = 0;  ///< last end − first start over all ranks
  double bubble_fraction = 0;     ///< 1 − mean compute time / iteration time
  std::vector<RankMetrics> ranks;
};

Metrics compute_metrics(const Trace& trace);

/// The median of measured samples (the mean of the middle two for an even count); 0
/// for none.
double median(std::vector<double> samples);

/// A [start, end) span in ns; empty or reversed spans are ignored.
using TimeSpan = std::pair<std::int64_t, std::int64_t>;

/// One rank's busy time: each list's union (overlaps inside a list count once) and
/// how much of the communication union lies under the compute union.
struct BusyUnion {
  std::int64_t compute_ns = 0;      ///< length of the union of `compute`
  std::int64_t comm_ns = 0;         ///< length of the union of `comm`
  std::int64_t hidden_comm_ns = 0;  ///< length of their intersection
  std::int64_t exposed_comm_ns() const { return comm_ns - hidden_comm_ns; }
};

/// The union-of-intervals arithmetic behind compute_metrics, for callers that hold
/// spans rather than a Trace (the simulator's predicted timeline).
BusyUnion busy_union(std::vector<TimeSpan> compute, std::vector<TimeSpan> comm);

}  // namespace tdpipe::traces
