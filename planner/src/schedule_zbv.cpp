// schedule_zbv.cpp — ZB-V (zero-bubble paper, section 6): 2 chunks per rank placed in a
// V — chunk 0 of rank r is virtual stage r, chunk 1 is virtual stage 2p−1−r — so the
// forward runs down the ranks and back up, and rank 0 holds both the first and the
// last stage. Backward split into B and W.
//
// Order as PyTorch's ScheduleZBVZeroBubble builds it (the handcrafted schedule for
// F = B = W), per rank r, with n = max(m, 2p−1) micro-batches:
// - warm-up: 2(p−r)−1 forwards of chunk 0; then r times (F chunk 1, F chunk 0); then
//   p−r times (F, B, W of chunk 1);
// - steady, while chunk 0 has forwards left or chunk 1 lags chunk 0: (F chunk 0 if
//   any left), B, W of chunk 0, then F, B, W of chunk 1;
// - cool-down: r times (B chunk 0, B chunk 1); p−r times (B, W of chunk 0); then the
//   W's still owed, chunk 1 first, then chunk 0.
// Ops of micro-batches ≥ m are dropped at the end, which is how PyTorch handles
// m < 2p−1 (the remaining order still respects every dependency).
#include <algorithm>

#include "schedule_common.hpp"

namespace tdpipe::planner::detail {

ir::Plan make_zb_v(const ScheduleParams& params) {
  const int p = params.stages, m = params.microbatches;
  ir::Plan plan = plan_skeleton("zb-v", p, m, 2, 1);  // the V placement

  const int n = std::max(m, 2 * p - 1);
  for (int r = 0; r < p; ++r) {
    std::vector<ir::Op> ops;
    ops.reserve(6 * static_cast<std::size_t>(n));
    int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
    auto F = [&](int c) { ops.push_back(compute_op(ir::OpKind::F, f[c]++, c)); };
    auto B = [&](int c) { ops.push_back(compute_op(ir::OpKind::B, b[c]++, c)); };
    auto W = [&](int c) { ops.push_back(compute_op(ir::OpKind::W, w[c]++, c)); };

    for (int i = 0; i < 2 * (p - r) - 1; ++i) F(0);
    for (int i = 0; i < r; ++i) {
      F(1);
      F(0);
    }
    for (int i = 0; i < p - r; ++i) {
      F(1);
      B(1);
      W(1);
    }
    while (f[1] < f[0] || f[0] < n) {
      if (f[0] < n) F(0);
      B(0);
      W(0);
      F(1);
      B(1);
      W(1);
    }
    for (int i = 0; i < r; ++i) {
      B(0);
      B(1);
    }
    for (int i = 0; i < p - r; ++i) {
      B(0);
      W(0);
    }
    while (w[1] < b[1]) W(1);
    while (w[0] < b[0]) W(0);

    std::erase_if(ops, [m](const ir::Op& op) { return op.mb >= m; });
    plan.ranks[r] = std::move(ops);
  }
  return plan;
}

}  // namespace tdpipe::planner::detail
