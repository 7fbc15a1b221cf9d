// schedule_gpipe.cpp — GPipe (fill, then drain), as PyTorch's ScheduleGPipe runs it:
// every rank issues the forwards of micro-batches 0 … m−1, then their fused backwards
// in the same order 0 … m−1 (torch.distributed.pipelining `_step_microbatches`).
#include "schedule_common.hpp"

namespace tdpipe::planner::detail {

ir::Plan make_gpipe(const ScheduleParams& params) {
  const int p = params.stages, m = params.microbatches;
  ir::Plan plan = plan_skeleton("gpipe", p, m, 1, 1);
  for (auto& ops : plan.ranks) {
    ops.reserve(2 * static_cast<std::size_t>(m));
    for (int mb = 0; mb < m; ++mb) ops.push_back(compute_op(ir::OpKind::F, mb));
    for (int mb = 0; mb < m; ++mb) ops.push_back(compute_op(ir::OpKind::BW, mb));
  }
  return plan;
}

}  // namespace tdpipe::planner::detail
