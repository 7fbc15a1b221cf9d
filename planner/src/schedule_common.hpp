// schedule_common.hpp — internal: what the schedule generators share (plan skeleton,
// parameter checks, and the warm-up / steady / cool-down template that PyTorch's
// interleaved and zero-bubble schedules are built on). Not a public header.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/planner/generators.hpp"

namespace tdpipe::planner::detail {

/// A compute op (F, B, W or BW) of micro-batch `mb`, local chunk `chunk`, slice `slice`.
ir::Op compute_op(ir::OpKind kind, int mb, int chunk = 0, int slice = 0);

/// rank → the virtual stages of its chunks as the generator `schedule` places them:
/// zb-v's V shape {r, 2p − 1 − r}; every other schedule c·p + r (the interleaved
/// placement, which is `rank` when chunks == 1).
std::vector<std::vector<int>> stage_placement(std::string_view schedule, int stages, int chunks);

/// An empty compute-only plan: p ranks, stage_of = stage_placement(name, p, chunks).
ir::Plan plan_skeleton(std::string_view name, int stages, int microbatches, int chunks,
                       int slices);

/// Throws tdpipe::Error unless p ≥ 1, m ≥ 1, chunks ≥ 1 and slices ≥ 1.
void check_common(std::string_view name, const ScheduleParams& params);

/// The per-rank template of PyTorch's `_get_1f1b_rank_ops`: `warmup` forwards, then
/// (F, backward) pairs until the forwards run out, then the remaining backwards.
/// With `split_backward`, backwards are B and each W follows the B issued `deferred_w`
/// backward steps earlier (so the first `deferred_w` W's slide right), the rest come
/// last; otherwise backwards are fused BW. `forward_chunk(k)` gives the chunk of the
/// k-th forward, `backward_chunk(k)` that of the k-th backward; micro-batches are
/// numbered per chunk in issue order.
struct RankTemplate {
  int chunks = 1;
  int microbatches = 1;  ///< per chunk
  int warmup = 0;        ///< forwards before the first backward (≤ chunks·microbatches)
  bool split_backward = false;
  int deferred_w = 0;
  std::function<int(int)> forward_chunk;
  std::function<int(int)> backward_chunk;
};
std::vector<ir::Op> template_rank_ops(const RankTemplate& spec);

ir::Plan make_gpipe(const ScheduleParams& params);
ir::Plan make_1f1b(const ScheduleParams& params);
ir::Plan make_interleaved(const ScheduleParams& params);
ir::Plan make_zb_h1(const ScheduleParams& params);
ir::Plan make_zb_h2(const ScheduleParams& params);
ir::Plan make_zb_v(const ScheduleParams& params);
ir::Plan make_tdpipe(const ScheduleParams& params);
ir::Plan make_auto(const ScheduleParams& params);

}  // namespace tdpipe::planner::detail
