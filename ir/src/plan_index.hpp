// plan_index.hpp — internal: flat look-up tables over a plan's ops, shared by
// replay, lowering and the validator. Compute ops are found by (micro-batch,
// virtual stage, slice) and SEND/RECV by their producer's (payload, micro-batch,
// virtual stage, slice), so dependency derivation and rendezvous matching are
// array reads instead of hashing.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/ir/validate.hpp"

namespace tdpipe::ir::detail {

/// Virtual stage ↔ (rank, chunk). Without plan.stage_of, chunk c of rank r runs
/// virtual stage c·p + r (Megatron's interleaved placement).
struct StageMap {
  int ranks = 0;
  int chunks = 1;
  std::vector<int> stage;     ///< [rank·chunks + chunk] → virtual stage, −1 if invalid
  std::vector<int> rank_of;   ///< [virtual stage] → rank, −1 if no chunk runs it
  std::vector<int> chunk_of;  ///< [virtual stage] → chunk

  int virtual_stages() const { return static_cast<int>(rank_of.size()); }
  int stage_of(int rank, int chunk) const {
    if (rank < 0 || rank >= ranks || chunk < 0 || chunk >= chunks) return -1;
    return stage[static_cast<std::size_t>(rank) * chunks + chunk];
  }
};

/// Builds the map; tolerant of malformed stage_of (the validator reports it).
StageMap make_stage_map(const Plan& plan);

/// Which table an op is filed in.
enum Slot : int { kSlotF, kSlotBwd, kSlotW, kSlotSendF, kSlotSendB, kSlotRecvF, kSlotRecvB, kSlots };

struct PlanIndex {
  StageMap stages;
  int microbatches = 0;  ///< key range: max(plan.microbatches, largest mb + 1)
  int slices = 1;        ///< key range: max(plan.slices, largest slice + 1)
  std::vector<int> offset;  ///< global index of (rank, 0); size ranks + 1
  /// [key·kSlots + slot] → global op index, −1 if none. kSlotBwd holds B or BW. A key's
  /// slots share a cache line, and keys run stage-major so a rank's ops sit together.
  std::vector<std::int32_t> cells;
  struct Duplicate {
    Slot slot;
    int first, second;  ///< global indices
  };
  std::vector<Duplicate> duplicates;  ///< a second op filed under a taken key

  int total() const { return offset.back(); }
  int keys() const { return microbatches * stages.virtual_stages() * slices; }
  /// (mb, vs, s) → key, −1 out of range.
  int key(int mb, int vs, int s) const {
    if (mb < 0 || mb >= microbatches || vs < 0 || vs >= stages.virtual_stages() || s < 0 ||
        s >= slices)
      return -1;
    return (vs * microbatches + mb) * slices + s;
  }
  int stage_of_key(int k) const { return k / (microbatches * slices); }
  int mb_of_key(int k) const { return (k / slices) % microbatches; }
  int slice_of_key(int k) const { return k % slices; }
  std::int32_t cell(int slot, int k) const {
    return cells[static_cast<std::size_t>(k) * kSlots + static_cast<std::size_t>(slot)];
  }
  std::int32_t& cell(int slot, int k) {
    return cells[static_cast<std::size_t>(k) * kSlots + static_cast<std::size_t>(slot)];
  }
  std::int32_t find(Slot slot, int mb, int vs, int s) const {
    const int k = key(mb, vs, s);
    return k < 0 ? -1 : cell(slot, k);
  }
  /// Global index → (rank, index in the rank's list).
  std::pair<int, int> locate(int global) const;
};

/// ir::is_p2p / is_compute / is_collective inlined for the per-op loops over
/// millions of ops (those are out of line in op.cpp, a call each).
inline bool p2p_kind(OpKind kind) { return kind == OpKind::SEND || kind == OpKind::RECV; }
inline bool compute_kind(OpKind kind) { return kind <= OpKind::OPT || is_serving(kind); }
inline bool collective_kind(OpKind kind) {
  return kind == OpKind::ALLREDUCE || kind == OpKind::REDUCE_SCATTER || kind == OpKind::ALL_GATHER ||
         kind == OpKind::COMPRESSED_ALLREDUCE;
}

/// The slot an op is filed under and its key; {kSlots, −1} if none. Inline: every
/// index build and the validator's pairing pass call it once per op.
inline std::pair<Slot, int> slot_and_key(const PlanIndex& ix, const Op& op, int rank) {
  Slot slot = kSlots;
  int sender = rank;
  switch (op.kind) {
    case OpKind::F: slot = kSlotF; break;
    case OpKind::B:
    case OpKind::BW: slot = kSlotBwd; break;
    case OpKind::W: slot = kSlotW; break;
    case OpKind::SEND:
      if (op.payload == OpKind::F) slot = kSlotSendF;
      else if (op.payload == OpKind::B) slot = kSlotSendB;
      break;
    case OpKind::RECV:
      sender = op.peer;
      if (op.payload == OpKind::F) slot = kSlotRecvF;
      else if (op.payload == OpKind::B) slot = kSlotRecvB;
      break;
    default: break;
  }
  if (slot == kSlots) return {kSlots, -1};
  return {slot, ix.key(op.mb, ix.stages.stage_of(sender, op.chunk), op.slice)};
}

PlanIndex build_index(const Plan& plan);

/// build_index in two steps, for a plan built rank by rank (ir::lower's output):
/// start_index sizes the tables (stage map, key range, empty cells; the key range
/// scans the ops only where plan.microbatches or plan.slices is unset), then
/// file_rank files rank `rank`'s ops once ranks 0..rank−1 are filed, exactly as
/// build_index does.
PlanIndex start_index(const Plan& plan);
void file_rank(PlanIndex& ix, const std::vector<Op>& ops, int rank);
/// file_rank's filing alone: `rank`'s ops get global indices base, base + 1, …
/// (ix.offset untouched).
void file_ops(PlanIndex& ix, const std::vector<Op>& ops, int rank, int base);

/// ir::validate over an index already built for `plan` (as build_index builds it).
ValidationReport validate_indexed(const Plan& plan, PlanIndex index, const ValidateOptions& options);

/// ir::replay over an index already built for `plan` (saves building it twice);
/// without want_timing only makespan_ns is filled (the validator's question).
ReplayResult replay_indexed(const Plan& plan, const PlanIndex& index, const DurationFn& duration,
                            bool want_timing = true);

/// The same replay, its timing by global index (offset[rank] + index) without the
/// per-rank copy ReplayResult makes.
std::vector<OpTiming> replay_flat(const Plan& plan, const PlanIndex& index, const DurationFn& duration);

/// Calls visit(producer_global, producer_slot, producer_key, cross_rank) for each data dependency of compute op
/// `op` on `rank` (F: previous stage, previous slice; B/BW: next stage, own F, next
/// slice; W: its B). Missing producers are skipped.
template <typename Visit>
void for_each_data_dep(const PlanIndex& ix, const Op& op, int rank, Visit&& visit) {
  const int vs = ix.stages.stage_of(rank, op.chunk);
  if (vs < 0) return;
  const int mb = op.mb, s = op.slice;
  const int last = ix.stages.virtual_stages() - 1;
  auto emit = [&](Slot slot, int mb2, int vs2, int s2) {
    const int k = ix.key(mb2, vs2, s2);
    if (k < 0) return;
    const std::int32_t g = ix.cell(slot, k);
    if (g >= 0) visit(g, slot, k, ix.stages.rank_of[static_cast<std::size_t>(vs2)] != rank);
  };
  switch (op.kind) {
    case OpKind::F:
      if (vs > 0) emit(kSlotF, mb, vs - 1, s);
      if (s > 0) emit(kSlotF, mb, vs, s - 1);
      break;
    case OpKind::B:
    case OpKind::BW:
      if (vs < last) emit(kSlotBwd, mb, vs + 1, s);
      emit(kSlotF, mb, vs, s);
      if (s + 1 < ix.slices) emit(kSlotBwd, mb, vs, s + 1);
      break;
    case OpKind::W:
      emit(kSlotBwd, mb, vs, s);
      break;
    default:
      break;
  }
}

}  // namespace tdpipe::ir::detail
