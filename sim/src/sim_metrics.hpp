// sim_metrics.hpp — internal: peak activation memory from a predicted timeline (the
// other metrics are traces::compute_metrics, shared with every engine).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tdpipe/ir/plan.hpp"

namespace tdpipe::sim::detail {

/// Per rank: max over time of the running sum of compute ops' mem_bytes, in start order.
/// Empty when no op carries mem_bytes.
std::vector<double> peak_activation_bytes(
    const ir::Plan& plan, const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>& timing);

/// Per rank: union of comm ops' [data starts moving, end) and its part outside compute.
void transfer_time(const ir::Plan& plan,
                   const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>& timing,
                   const std::vector<std::vector<std::int64_t>>& xfer_ns, std::vector<std::int64_t>& transfer,
                   std::vector<std::int64_t>& exposed);

}  // namespace tdpipe::sim::detail
