// schedule_common.cpp — helpers shared by the schedule generators.
#include "schedule_common.hpp"

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::planner::detail {

ir::Op compute_op(ir::OpKind kind, int mb, int chunk, int slice) {
  ir::Op op;
  op.kind = kind;
  op.mb = mb;
  op.chunk = chunk;
  op.slice = slice;
  op.stream = ir::Stream::Compute;
  return op;
}

std::vector<std::vector<int>> stage_placement(std::string_view schedule, int stages, int chunks) {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(std::max(stages, 0)));
  for (int r = 0; r < stages; ++r) {
    if (schedule == "zb-v") out[r] = {r, 2 * stages - 1 - r};
    else
      for (int c = 0; c < chunks; ++c) out[r].push_back(c * stages + r);
  }
  return out;
}

ir::Plan plan_skeleton(std::string_view name, int stages, int microbatches, int chunks,
                       int slices) {
  ir::Plan plan;
  plan.schedule = std::string(name);
  plan.stages = stages;
  plan.microbatches = microbatches;
  plan.chunks = chunks;
  plan.slices = slices;
  plan.lowered = false;
  plan.stage_of = stage_placement(name, stages, chunks);
  plan.ranks.assign(stages, {});
  return plan;
}

void check_common(std::string_view name, const ScheduleParams& params) {
  auto fail = [&](std::string_view field, int value, std::string_view expected) {
    throw Error(fmt::format("schedule {}: {} = {}: expected {}", name, field, value, expected));
  };
  if (params.stages < 1) fail("stages (p)", params.stages, "at least 1 pipeline stage");
  if (params.microbatches < 1)
    fail("microbatches (m)", params.microbatches, "at least 1 micro-batch");
  if (params.chunks < 1) fail("chunks (v)", params.chunks, "at least 1 model chunk per rank");
  if (params.slices < 1) fail("slices (S)", params.slices, "at least 1 temporal slice");
}

std::vector<ir::Op> template_rank_ops(const RankTemplate& spec) {
  const int total = spec.chunks * spec.microbatches;  // forwards (and backwards) on this rank
  const int warmup = spec.warmup;
  const ir::OpKind backward = spec.split_backward ? ir::OpKind::B : ir::OpKind::BW;

  std::vector<int> next_f(spec.chunks, 0), next_b(spec.chunks, 0), next_w(spec.chunks, 0);
  std::vector<int> backward_chunks;  // chunk of each backward issued, for its W
  backward_chunks.reserve(total);
  std::size_t w_issued = 0;
  std::vector<ir::Op> ops;
  ops.reserve(static_cast<std::size_t>(total) * (spec.split_backward ? 3 : 2));

  auto forward = [&](int step) {
    const int c = spec.forward_chunk(step);
    ops.push_back(compute_op(ir::OpKind::F, next_f[c]++, c));
  };
  auto weight = [&] {
    const int c = backward_chunks[w_issued++];
    ops.push_back(compute_op(ir::OpKind::W, next_w[c]++, c));
  };
  auto backward_step = [&](int step) {
    const int c = spec.backward_chunk(step - warmup);
    ops.push_back(compute_op(backward, next_b[c]++, c));
    backward_chunks.push_back(c);
    // The W of an earlier B fills the slot once `deferred_w` backwards have been issued.
    if (spec.split_backward && step - warmup >= spec.deferred_w) weight();
  };

  for (int step = 0; step < total + warmup; ++step) {
    if (step < warmup) {
      forward(step);
    } else if (step < total) {
      forward(step);
      backward_step(step);
    } else {
      backward_step(step);
    }
  }
  while (spec.split_backward && w_issued < backward_chunks.size()) weight();
  return ops;
}

}  // namespace tdpipe::planner::detail
