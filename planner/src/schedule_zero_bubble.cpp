// schedule_zero_bubble.cpp — the zero-bubble paper's handcrafted schedules (Qi et al.,
// ICLR 2024, section 2), backward split into B (input gradient) and W (weight gradient).
//
// ZB-H1 (1F1B's memory): rank r issues min(p−r−1, m) warm-up forwards, then (F, B)
// pairs, then the remaining B's, like 1F1B; a W follows every B except that the first r
// W's are deferred (each W trails its B by r backward steps), the last r W's close the
// rank. This is the order of PyTorch's ScheduleInterleavedZeroBubble ("ZB1P") with one
// chunk per rank (num_1f1b_microbatches = rank). Every rank then holds at most p
// activations (F done, W not), the last rank's deferred W's fill what is 1F1B's
// cool-down bubble, and a dependency-driven replay with W ≤ F leaves (p−1)(F+B−W) idle
// per rank instead of 1F1B's (p−1)(F+B+W).
//
// ZB-H2 (up to 2p−1 activations): the warm-up grows to min(2(p−r−1), m) forwards, so
// rank r runs 2p−2r−1 forwards before its first B — filling the bubble before the
// first backward — and the W's trail their B's by 2r backward steps, which moves the
// tail W's of the later ranks to the end: the trapezoid becomes a parallelogram. Every
// rank holds at most 2p−1 activations; with F = B = W the only idle time left is the
// unavoidable start offset, (p−1)·F per rank; in general (p−1)·max(F, F+B−2W).
// The paper gives ZB-H2 as a figure, not code; this rule reproduces its shape with
// PyTorch's zero-bubble template.
#include <algorithm>

#include "schedule_common.hpp"

namespace tdpipe::planner::detail {
namespace {

ir::Plan zero_bubble(std::string_view name, const ScheduleParams& params, int warmup_per_hop,
                     int deferral_per_rank) {
  const int p = params.stages, m = params.microbatches;
  ir::Plan plan = plan_skeleton(name, p, m, 1, 1);
  for (int r = 0; r < p; ++r) {
    RankTemplate spec;
    spec.chunks = 1;
    spec.microbatches = m;
    spec.warmup = std::min(warmup_per_hop * (p - r - 1), m);
    spec.split_backward = true;
    spec.deferred_w = deferral_per_rank * r;
    spec.forward_chunk = [](int) { return 0; };
    spec.backward_chunk = [](int) { return 0; };
    plan.ranks[r] = template_rank_ops(spec);
  }
  return plan;
}

}  // namespace

ir::Plan make_zb_h1(const ScheduleParams& params) { return zero_bubble("zb-h1", params, 1, 1); }
ir::Plan make_zb_h2(const ScheduleParams& params) { return zero_bubble("zb-h2", params, 2, 2); }

}  // namespace tdpipe::planner::detail
