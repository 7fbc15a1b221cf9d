// lowering.hpp — compute-only plan → plan with SEND/RECV and DP collectives.
//
// Batching rule (what keeps blocking NCCL-style transports deadlock-free, as
// Megatron's batch_isend_irecv does): between two consecutive compute ops of a
// rank, the SENDs of the first op's outputs and the RECVs of the second op's
// inputs are posted as one batch.
#pragma once

#include <cstdint>
#include <functional>

#include "tdpipe/ir/plan.hpp"

namespace tdpipe::ir {

struct LoweringOptions {
  /// Bytes of the activation (payload F) or gradient (payload B) that op `producer` sends.
  std::function<std::int64_t(const Op& producer)> p2p_bytes;
  /// Gradient bytes of one model chunk on one rank (for DP buckets); 0 = no DP reduction.
  std::function<std::int64_t(int rank, int chunk)> grad_bytes;
  std::int64_t bucket_bytes = 40 << 20;  ///< DP bucket size (Megatron's 40 MB default)
  bool overlap_dp = true;   ///< start a bucket's all-reduce as soon as its gradients are ready
  bool optimizer_step = true;  ///< append OPT on every rank
};

/// Inserts SEND/RECV for every cross-rank dependency and, when plan.data > 1, one
/// ALLREDUCE per gradient bucket (on Stream::DP), plus OPT after them.
Plan lower(const Plan& compute_only, const LoweringOptions& options);

}  // namespace tdpipe::ir
