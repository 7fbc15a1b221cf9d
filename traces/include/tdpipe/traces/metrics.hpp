// metrics.hpp — what a timeline says: iteration time, bubbles, compute and
// exposed / hidden communication per rank.
#pragma once

#include <cstdint>
#include <vector>

#include "tdpipe/traces/trace.hpp"

namespace tdpipe::traces {

struct RankMetrics {
  std::int64_t compute_ns = 0;         ///< union of compute-stream busy time
  std::int64_t exposed_comm_ns = 0;    ///< comm busy while compute is idle
  std::int64_t hidden_comm_ns = 0;     ///< comm busy while compute is busy
  std::int64_t idle_ns = 0;            ///< iteration − compute − exposed comm
  double idle_fraction = 0;            ///< (iteration − compute) / iteration
};

struct Metrics {
  std::int64_t iteration_ns = 0;  ///< last end − first start over all ranks
  double bubble_fraction = 0;     ///< 1 − mean compute time / iteration time
  std::vector<RankMetrics> ranks;
};

Metrics compute_metrics(const Trace& trace);

}  // namespace tdpipe::traces
