// schedule_interleaved.cpp — interleaved 1F1B (Narayanan et al. 2021) with v model
// chunks per rank, chunk c of rank r being virtual stage c·p + r.
//
// Order as Megatron-LM's `forward_backward_pipelining_with_interleaving` (recent
// versions, microbatch_group_size_per_vp_stage = p) and PyTorch's
// ScheduleInterleaved1F1B issue it:
// - micro-batches go through the chunks in groups of p: the k-th forward of a rank
//   runs chunk (k / p) mod v, the k-th backward chunk v−1 − (k / p) mod v
//   (Megatron's `get_model_chunk_id`); within a chunk, micro-batches in order;
// - rank r issues min((v−1)·p + 2·(p−r−1), m·v) warm-up forwards, then (F, BW)
//   pairs, then the remaining backwards.
// Requires m % p == 0 (Megatron's grouping; PyTorch's rounds of p micro-batches).
// Older Megatron made every rank all-warm-up when m == p; recent Megatron and PyTorch
// do not, and neither do we. With v = 1 the warm-up stays 2·(p−r−1) (PyTorch's
// formula), so interleaved with one chunk is not 1F1B.
#include <fmt/format.h>

#include <algorithm>

#include "schedule_common.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::planner::detail {

ir::Plan make_interleaved(const ScheduleParams& params) {
  const int p = params.stages, m = params.microbatches, v = params.chunks;
  if (m % p != 0)
    throw Error(fmt::format(
        "schedule interleaved: microbatches m = {} is not a multiple of stages p = {}: "
        "expected m % p == 0 (micro-batches go through the chunks in groups of p), "
        "e.g. m = {}",
        m, p, (m + p - 1) / p * p));
  ir::Plan plan = plan_skeleton("interleaved", p, m, v, 1);
  for (int r = 0; r < p; ++r) {
    RankTemplate spec;
    spec.chunks = v;
    spec.microbatches = m;
    spec.warmup = std::min((v - 1) * p + 2 * (p - r - 1), m * v);
    spec.split_backward = false;
    spec.forward_chunk = [p, v](int k) { return (k / p) % v; };
    spec.backward_chunk = [p, v](int k) { return v - 1 - (k / p) % v; };
    plan.ranks[r] = template_rank_ops(spec);
  }
  return plan;
}

}  // namespace tdpipe::planner::detail
