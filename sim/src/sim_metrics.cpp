// sim_metrics.cpp — peak activation memory from a predicted timeline.
#include "sim_metrics.hpp"

#include <algorithm>
#include <utility>

#include "tdpipe/traces/metrics.hpp"

namespace tdpipe::sim::detail {

void transfer_time(const ir::Plan& plan, const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>& timing,
                   const std::vector<std::vector<std::int64_t>>& xfer_ns, std::vector<std::int64_t>& transfer,
                   std::vector<std::int64_t>& exposed) {
  transfer.clear();
  exposed.clear();
  for (int r = 0; r < plan.num_ranks(); ++r) {
    std::vector<traces::TimeSpan> comp, comm;
    for (std::size_t i = 0; i < plan.ranks[r].size(); ++i) {
      const auto kind = plan.ranks[r][i].kind;
      if (ir::is_compute(kind)) comp.emplace_back(timing[r][i]);
      else if (xfer_ns[r][i] >= 0) comm.emplace_back(xfer_ns[r][i], timing[r][i].second);
    }
    const traces::BusyUnion u = traces::busy_union(std::move(comp), std::move(comm));
    transfer.push_back(u.comm_ns);
    exposed.push_back(u.exposed_comm_ns());
  }
}

std::vector<double> peak_activation_bytes(
    const ir::Plan& plan, const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>& timing) {
  bool any = false;
  std::vector<double> peaks;
  for (int r = 0; r < plan.num_ranks(); ++r) {
    const auto& ops = plan.ranks[r];
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (ir::is_compute(ops[i].kind)) {
        order.push_back(i);
        any = any || ops[i].mem_bytes != 0;
      }
    // Allocation at an op's start, release at its end: frees are ordered after allocations.
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return timing[r][a].first < timing[r][b].first;
    });
    double cur = 0, peak = 0;
    for (std::size_t i : order) {
      cur += ops[i].mem_bytes;
      peak = std::max(peak, cur);
    }
    peaks.push_back(peak);
  }
  if (!any) peaks.clear();
  return peaks;
}

}  // namespace tdpipe::sim::detail
