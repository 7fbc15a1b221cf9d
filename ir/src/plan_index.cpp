// plan_index.cpp — flat look-up tables over a plan's ops (see plan_index.hpp).
#include "plan_index.hpp"

#include <algorithm>

#include "prefault.hpp"

namespace tdpipe::ir::detail {

StageMap make_stage_map(const Plan& plan) {
  StageMap map;
  map.ranks = plan.num_ranks();
  map.chunks = std::max(1, plan.chunks);
  if (!plan.stage_of.empty()) {
    for (const auto& row : plan.stage_of) map.chunks = std::max<int>(map.chunks, static_cast<int>(row.size()));
  }
  const int v_stages = map.ranks * map.chunks;
  map.stage.assign(static_cast<std::size_t>(v_stages), -1);
  map.rank_of.assign(static_cast<std::size_t>(v_stages), -1);
  map.chunk_of.assign(static_cast<std::size_t>(v_stages), -1);
  for (int r = 0; r < map.ranks; ++r) {
    for (int c = 0; c < map.chunks; ++c) {
      int vs = c * map.ranks + r;
      if (!plan.stage_of.empty()) {
        vs = -1;
        if (r < static_cast<int>(plan.stage_of.size()) &&
            c < static_cast<int>(plan.stage_of[static_cast<std::size_t>(r)].size()))
          vs = plan.stage_of[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)];
      }
      // A stage claimed twice keeps its first owner; the validator reports it.
      if (vs < 0 || vs >= v_stages || map.rank_of[static_cast<std::size_t>(vs)] >= 0) continue;
      map.stage[static_cast<std::size_t>(r) * map.chunks + c] = vs;
      map.rank_of[static_cast<std::size_t>(vs)] = r;
      map.chunk_of[static_cast<std::size_t>(vs)] = c;
    }
  }
  return map;
}

std::pair<int, int> PlanIndex::locate(int global) const {
  const auto it = std::upper_bound(offset.begin(), offset.end(), global);
  const int rank = static_cast<int>(it - offset.begin()) - 1;
  return {rank, global - offset[static_cast<std::size_t>(rank)]};
}

PlanIndex start_index(const Plan& plan) {
  PlanIndex ix;
  ix.stages = make_stage_map(plan);
  ix.microbatches = std::max(plan.microbatches, 0);
  ix.slices = std::max(plan.slices, 1);
  ix.offset.assign(static_cast<std::size_t>(plan.num_ranks()) + 1, 0);
  // Without m and S in the plan, the key range comes from the ops themselves (an
  // op outside a stated range is not filed; the validator reports it).
  if (plan.microbatches <= 0 || plan.slices <= 0)
    for (const auto& ops : plan.ranks)
      for (const Op& op : ops) {
        if (op.mb >= ix.microbatches && op.mb < (1 << 24)) ix.microbatches = op.mb + 1;
        if (op.slice >= ix.slices && op.slice < (1 << 16)) ix.slices = op.slice + 1;
      }
  const std::size_t keys = static_cast<std::size_t>(ix.microbatches) *
                           static_cast<std::size_t>(ix.stages.virtual_stages()) *
                           static_cast<std::size_t>(ix.slices);
  assign_prefaulted(ix.cells, keys * kSlots, std::int32_t{-1});
  return ix;
}

void file_rank(PlanIndex& ix, const std::vector<Op>& ops, int rank) {
  const int base = ix.offset[static_cast<std::size_t>(rank)];
  ix.offset[static_cast<std::size_t>(rank) + 1] = base + static_cast<int>(ops.size());
  file_ops(ix, ops, rank, base);
}

void file_ops(PlanIndex& ix, const std::vector<Op>& ops, int rank, int base) {
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    const auto [slot, key] = slot_and_key(ix, ops[static_cast<std::size_t>(i)], rank);
    if (key < 0) continue;
    auto& cell = ix.cell(slot, key);
    if (cell < 0) cell = base + i;
    else ix.duplicates.push_back({slot, cell, base + i});
  }
}

PlanIndex build_index(const Plan& plan) {
  PlanIndex ix = start_index(plan);
  for (int r = 0; r < plan.num_ranks(); ++r) file_rank(ix, plan.ranks[static_cast<std::size_t>(r)], r);
  return ix;
}

}  // namespace tdpipe::ir::detail
