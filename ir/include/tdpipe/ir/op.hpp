// op.hpp — one step of a schedule on one rank: the unit of the schedule IR.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tdpipe/ir/op_deps.hpp"

namespace tdpipe::ir {

/// What an op does. F/B/W/BW/OPT are compute; the rest move data.
enum class OpKind : std::uint8_t {
  F,               ///< forward of one (micro-batch, chunk, slice)
  B,               ///< backward, input gradient only
  W,               ///< backward, weight gradient only
  BW,              ///< fused backward (B then W)
  OPT,             ///< optimizer step
  SEND,            ///< point-to-point send to `peer`
  RECV,            ///< point-to-point receive from `peer`
  ALLREDUCE,       ///< data-parallel gradient all-reduce of one bucket
  REDUCE_SCATTER,  ///< data-parallel reduce-scatter of one bucket
  ALL_GATHER,      ///< data-parallel all-gather of one bucket
  /// Copy of one layer block's 16-bit weights from host to device memory
  /// (parallel.param_offload): `chunk`, `tag` = the block (layer within the chunk),
  /// `bytes`; ready for the compute op that lists it among its deps (see
  /// is_weight_gate).
  LOAD,
  OFFLOAD,         ///< offload to host memory
  CKPT,            ///< activation checkpoint
  /// 1-bit Adam's all-reduce of one bucket's momentum (after its warm-up steps): sign
  /// bits plus one scale per segment, error-compensated on the sending (worker) and the
  /// reducing (server) side; `bytes` is the packed message (compressed_bucket_bytes).
  /// During warm-up the executor runs it as a plain ALLREDUCE of the gradients.
  COMPRESSED_ALLREDUCE,
  /// Serving (ir/serving.hpp): batch `mb` of the plan's serving table on this stage, a
  /// batch with at least one prompt (prefill, possibly with decode tokens beside it:
  /// continuous batching). `bytes`: the rank's KV-cache bytes once the op is done.
  PREFILL,
  /// Serving: batch `mb` of decode tokens only (one token of each request). `bytes` as
  /// for PREFILL.
  DECODE,
};

/// The stream an op is issued on. Ops of one rank and one stream run in plan
/// order; ops on different streams overlap unless `deps` say otherwise.
enum class Stream : std::uint8_t {
  Compute,  ///< F, B, W, BW, OPT
  P2P,      ///< SEND / RECV between pipeline stages
  DP,       ///< data-parallel collectives
  Copy,     ///< LOAD / OFFLOAD between host and device memory (parameter offload)
};
/// How many streams there are (Stream's values are 0 … kStreamCount − 1).
inline constexpr int kStreamCount = 4;

// OpRef (rank, index) lives in op_deps.hpp with OpDeps, the type of Op::deps.

/// Field order packs an Op into 80 bytes (the 1-byte enums first, then the ints);
/// a lowered plan holds millions of them.
struct Op {
  OpKind kind = OpKind::F;
  OpKind payload = OpKind::F;      ///< SEND/RECV: F = activation, B = input gradient
  Stream stream = Stream::Compute;
  int mb = -1;     ///< micro-batch; -1 where none (OPT, collectives)
  int chunk = 0;   ///< model chunk on this rank (virtual stage = Plan::stage_of)
  int slice = 0;   ///< temporal slice (TD-Pipe); 0 without slicing

  // Communication (SEND/RECV and collectives).
  int peer = -1;               ///< SEND/RECV: the other pipeline rank
  int tag = 0;                 ///< collectives: gradient bucket index
  int batch = -1;  ///< adjacent comm ops of one rank with the same batch id are
                   ///< posted together (one NCCL group); -1: alone
  /// Collectives: the fraction of the run of their first dependency (the chunk's last
  /// backward op) after which this bucket's gradients are final — the backward reaches
  /// the chunk's last parameters first, so bucket 0 is ready earliest (Megatron's
  /// overlap_grad_reduce); 1: at its end. Fills the padding before `bytes`.
  float ready_after = 1.0f;
  std::int64_t bytes = 0;      ///< bytes moved (comm) — for compute, 0

  OpDeps deps;  ///< explicit dependencies not implied by order (a std::vector-like list)

  // Cost as the planner's cost model sees it.
  double flops = 0;
  double mem_bytes = 0;     ///< activation bytes this op adds (F) or frees (B/BW, negative)
  double est_seconds = 0;

  friend bool operator==(const Op&, const Op&) = default;
};

/// True for F, B, W, BW, OPT, PREFILL and DECODE.
bool is_compute(OpKind kind);
/// True for PREFILL and DECODE (a serving plan's compute ops).
inline bool is_serving(OpKind kind) { return kind == OpKind::PREFILL || kind == OpKind::DECODE; }
/// True for F, B, W and BW: a micro-batch's (slice's) work on a model chunk — the
/// compute ops but the optimizer step.
bool is_chunk_work(OpKind kind);
/// Most activations alive at once over one rank's ops in issue order: an F adds one,
/// a B or BW frees one (the W-held GEMM inputs are not counted).
int peak_inflight(const std::vector<Op>& rank_ops);
/// True for SEND and RECV.
bool is_p2p(OpKind kind);
/// True for ALLREDUCE, REDUCE_SCATTER, ALL_GATHER and COMPRESSED_ALLREDUCE.
bool is_collective(OpKind kind);
/// True for the collectives that reduce a gradient bucket before OPT: ALLREDUCE,
/// REDUCE_SCATTER and COMPRESSED_ALLREDUCE.
bool is_gradient_reduction(OpKind kind);
/// Bytes of one bucket of `elements` gradients as 1-bit Adam sends it: per data-parallel
/// member's segment (part of `members` near-equal parts) a 4-byte fp32 scale and one
/// bit per element, each segment padded to the longest's whole bytes.
std::int64_t compressed_bucket_bytes(std::int64_t elements, int members);
/// "F", "BW", "SEND", "ALLREDUCE", …
std::string_view to_string(OpKind kind);
/// Inverse of to_string; nullopt for an unknown name.
std::optional<OpKind> op_kind_from_string(std::string_view name);
/// True for a dependency of a compute op on a LOAD: the weights of one layer block of
/// the op's chunk. A compute op's LOAD deps, in their order, gate the n equal segments
/// of its run (n = how many it lists): segment i starts once the i-th LOAD is done.
/// A LOAD's own `ready_after` dependency on a compute op names the end of one of its
/// segments, gate_segment(ready_after, n) (the block it may overwrite is released there).
/// W reads no weights: a LOAD among its deps is a plain dependency.
inline bool is_weight_gate(OpKind consumer, OpKind dependency) {
  return dependency == OpKind::LOAD && (consumer == OpKind::F || consumer == OpKind::B ||
                                        consumer == OpKind::BW || consumer == OpKind::OPT);
}
/// The segment (0 … n − 1) of a gated op of n segments whose end a dependency with
/// `ready_after` waits for: the one in which that fraction of the op is reached,
/// ⌈ready_after·n⌉ − 1. Lowering writes a segment end (s + 1)/n as a float; the slack
/// of 1e-3 absorbs its rounding for any n below 16,000 segments.
int gate_segment(float ready_after, int n);
/// "compute", "p2p", "dp", "copy".
std::string_view to_string(Stream stream);
std::optional<Stream> stream_from_string(std::string_view name);
/// The stream an op of this kind is issued on unless the plan says otherwise.
Stream default_stream(OpKind kind);

}  // namespace tdpipe::ir
