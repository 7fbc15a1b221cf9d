// schedule_1f1b.cpp — 1F1B (PipeDream-flush), as Megatron-LM's
// `forward_backward_pipelining_without_interleaving` and PyTorch's Schedule1F1B run it:
// rank r issues min(p−r−1, m) warm-up forwards, then (F, BW) pairs while forwards
// remain, then the remaining backwards. Micro-batches go in order on every rank, so
// rank r never holds more than min(p−r, m) activations.
#include <algorithm>

#include "schedule_common.hpp"

namespace tdpipe::planner::detail {

ir::Plan make_1f1b(const ScheduleParams& params) {
  const int p = params.stages, m = params.microbatches;
  ir::Plan plan = plan_skeleton("1f1b", p, m, 1, 1);
  for (int r = 0; r < p; ++r) {
    auto& ops = plan.ranks[r];
    ops.reserve(2 * static_cast<std::size_t>(m));
    const int warmup = std::min(p - r - 1, m);
    int next_f = 0, next_b = 0;
    for (int i = 0; i < warmup; ++i) ops.push_back(compute_op(ir::OpKind::F, next_f++));
    while (next_f < m) {
      ops.push_back(compute_op(ir::OpKind::F, next_f++));
      ops.push_back(compute_op(ir::OpKind::BW, next_b++));
    }
    while (next_b < m) ops.push_back(compute_op(ir::OpKind::BW, next_b++));
  }
  return plan;
}

}  // namespace tdpipe::planner::detail
