// lowering.hpp — compute-only plan → plan with SEND/RECV and DP collectives.
//
// Batching rule (what keeps blocking NCCL-style transports deadlock-free, as
// Megatron's batch_isend_irecv does): every rank posts its SENDs and RECVs in one
// global order (transfers sorted by when their producer ends in a replay of the
// compute-only plan); a SEND goes right after its producer, a RECV as late as
// possible before its consumer but no later than its data is ready; the comm ops
// between two consecutive compute ops Y, Z of a rank (SENDs of Y's outputs, RECVs
// of Z's inputs) are posted as one batch. For 1F1B this gives Megatron's
// send_forward_recv_backward pairs on the first rank, while later ranks post a
// forward's RECV as soon as its data is ready (the zero-bubble event timing);
// for interleaved, zero-bubble and TD-Pipe orders it stays deadlock-free where
// "pair Y's SENDs with Z's RECVs" alone does not (see lowering.cpp).
#pragma once

#include <cstdint>
#include <functional>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/validate.hpp"

namespace tdpipe::ir {

struct LoweringOptions {
  /// Bytes of the activation (payload F) or gradient (payload B) that op `producer` sends.
  std::function<std::int64_t(const Op& producer)> p2p_bytes;
  /// Gradient bytes of one model chunk on one rank (for DP buckets); 0 = no DP reduction.
  std::function<std::int64_t(int rank, int chunk)> grad_bytes;
  std::int64_t bucket_bytes = 40 << 20;  ///< DP bucket size (Megatron's 40 MB default)
  /// Start a bucket's all-reduce as soon as its gradients are ready: part-way through
  /// its chunk's last backward op (Op::ready_after); false: after the rank's last backward.
  bool overlap_dp = true;
  /// Megatron's --overlap-p2p-communication: pipeline SEND/RECV run beside compute on the
  /// p2p stream. false: the rank's compute waits for its sends, as Megatron's does without
  /// the flag (its p2p calls wait for their batch; a receive is posted just before the
  /// op that needs it, which the RECV → consumer dependency already is): every compute op
  /// depends on the SENDs posted since the compute op before it.
  bool overlap_p2p = true;
  /// ZeRO-1 (Megatron's distributed optimizer): each bucket is a REDUCE_SCATTER before OPT
  /// (which then steps 1/d of the parameters) and an ALL_GATHER of the updated parameters
  /// after it, instead of one ALLREDUCE.
  bool shard_optimizer = false;
  /// 1-bit Adam: each bucket is a COMPRESSED_ALLREDUCE of its momentum instead of an
  /// ALLREDUCE, `bytes` = compressed_bucket_bytes of its elements (gradient bytes ÷
  /// this many bytes per gradient); 0: no compression. Not with shard_optimizer.
  int compress_element_bytes = 0;
  /// est_seconds of a COMPRESSED_ALLREDUCE of `elements` on rank `rank`: its compression
  /// kernels' device time, which the engines add to the wire's; empty: 0.
  std::function<double(int rank, std::int64_t elements)> compress_seconds;
  /// Parameter offload (time-shared parameter loading, parallel.param_offload): the bytes
  /// of the 16-bit weights of each decoder layer of chunk `chunk` on rank `rank`, in
  /// layer order; empty function, or an empty list for a chunk: its weights stay on the
  /// device. Every F, B and BW of such a chunk then lists one LOAD per layer, in the
  /// order it uses them (F: first layer first; B, BW: last first), and OPT one LOAD of
  /// each block's optimizer state plus an OFFLOAD of the state and updated weights.
  std::function<std::vector<std::int64_t>(int rank, int chunk)> offload_blocks;
  /// est_seconds of a host ↔ device copy of `bytes` on rank `rank`; empty: 0.
  std::function<double(int rank, std::int64_t bytes)> copy_seconds;
  /// Layer blocks on the device at once (≥ 1): the one in use and those prefetched. A LOAD
  /// waits until the block offload_window loads before it is released (its segment of the
  /// consumer ended, or for OPT's blocks its OFFLOAD finished).
  int offload_window = 2;
  /// Optimizer-state bytes per weight byte that OPT's LOAD brings in (fp32 master and two
  /// Adam moments per 16-bit weight: 12 / 2 = 6); its OFFLOAD carries them back plus the
  /// updated 16-bit weights (7×). 0: the optimizer state stays on the device.
  int offload_state_ratio = 6;
  bool optimizer_step = true;  ///< append OPT on every rank
  /// est_seconds of rank `rank`'s OPT; empty = keep the compute-only plan's OPT cost, or 0.
  std::function<double(int rank)> optimizer_seconds;
};

/// Inserts SEND/RECV for every cross-rank dependency and, when plan.data > 1, one
/// ALLREDUCE per gradient bucket (on Stream::DP), plus OPT after them — or, with
/// shard_optimizer, a REDUCE_SCATTER per bucket, OPT, then an ALL_GATHER per bucket
/// (each depending on OPT, in the same bucket order); with compress_element_bytes, a
/// COMPRESSED_ALLREDUCE per bucket where the ALLREDUCE would be; with offload_blocks,
/// LOAD/OFFLOAD ops on Stream::Copy after the rank's other ops (see is_weight_gate).
Plan lower(const Plan& compute_only, const LoweringOptions& options);

struct LoweredPlan {
  Plan plan;                    ///< lower()'s result
  ValidationReport report;      ///< validate()'s report of it
};

/// validate(lower(compute_only, options), checks) in one call: the same plan, report
/// and errors, faster (lower() leaves its output's op index to the validator, which
/// otherwise builds it again over millions of ops).
LoweredPlan lower_validated(const Plan& compute_only, const LoweringOptions& options,
                            const ValidateOptions& checks);

}  // namespace tdpipe::ir
