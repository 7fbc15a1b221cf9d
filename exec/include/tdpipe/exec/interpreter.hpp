// interpreter.hpp — executes one rank's ops of a lowered plan over a Backend.
//
// Nothing schedule-specific: each stream's ops run in plan order, on a host thread of
// their own or (Backend::runtime, cooperative) the compute and p2p streams taking turns
// on one thread (of one rank, or of several: run_rank_steps) with p2p batches in flight while compute runs (and tested between its
// layer blocks: ComputeOp::poll); a stream's order and its one op (batch) at a time are
// the same either way. A started batch's SEND/RECVs each end when their own pair
// completed (P2PRequest::op_done), as in the plan's semantics (ir/replay.hpp); a batch
// through Transport::post (CUDA: one NCCL group) ends as a whole. An op starts once the
// previous op of its stream (batch) ended and
//  - its explicit `deps` ended;
//  - compute: its input tensor is present (produced locally or received); a serving
//    PREFILL/DECODE gets the token buffers of the RECVs among its deps besides its input
//    (ComputeOp::token_inputs), and a RECV no op reads (a serving plan's last tokens) is
//    dropped as it arrives;
//  - SEND: the tensor it sends was produced; consecutive comm ops with one `batch`
//    id are posted together (Transport::start, or post);
//  - ALLREDUCE (or REDUCE_SCATTER) of chunk c: every W/BW of chunk c on this rank
//    ended; the rank's ALLREDUCEs of chunk c split its gradients into that many
//    contiguous buckets (Compute::grad_bucket), bucket 0 the chunk's last parameters.
//    When the plan lets a bucket start part-way through the chunk's last backward op
//    (Op::ready_after < 1, overlap_grad_reduce), it starts as soon as that op reports
//    its part final (GradProgress), on the dp thread while the op goes on;
//  - OPT: every ALLREDUCE / REDUCE_SCATTER of the rank ended; with REDUCE_SCATTER
//    buckets (ZeRO-1) it steps only the parameters this replica owns (OptimizerShard);
//    in fp16 training (Compute::overflow_flags) every rank's per-slice overflow flags
//    are first ORed over the world (Transport::agree_overflow), and OPT gets them;
//  - ALL_GATHER of chunk c: OPT ended; it gathers the same bucket of the parameters
//    (Compute::param_bucket).
#pragma once

#include <cstdint>
#include <vector>

#include "tdpipe/exec/backend.hpp"
#include "tdpipe/exec/run_control.hpp"
#include "tdpipe/ir/plan.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::exec {

struct RankStepResult {
  std::vector<traces::TraceEvent> events;  ///< one per op, start/end from the Clock
  double loss = 0;                         ///< Compute::end_step()
};

/// Runs step `step` of pipeline rank `rank` (of plan.ranks) and returns its measured
/// events, labelled with `trace_rank` (the world rank: replica · p + rank). Throws
/// tdpipe::Error on a plan the backend cannot execute, or Aborted when `control`
/// failed elsewhere; any error inside is reported to `control` first.
RankStepResult run_rank_step(const ir::Plan& plan, int rank, int trace_rank, int step,
                             const Backend& backend, RunControl& control);

/// One rank of a thread's group (run_rank_steps).
struct RankSlot {
  int rank = 0;        ///< pipeline rank (of plan.ranks)
  int trace_rank = 0;  ///< world rank: replica · p + rank
  Backend backend;
};

/// Runs step `step` of several ranks on the calling thread, as run_rank_step runs one:
/// the cooperative runtime with every rank's compute and p2p streams taking turns (a
/// running op takes every rank's p2p turn between its layer blocks), so that on a
/// machine with fewer cores than ranks a hand-off between ranks of one thread costs no
/// OS thread switch. Each rank's dp and copy streams keep threads of their own. Ranks
/// sharing a thread must not block inside an op on another rank: fp16's overflow
/// agreement and injected faults are refused (the run fails naming the rank), as is a
/// transport that cannot start batches. Results in the order of `slots`.
std::vector<RankStepResult> run_rank_steps(const ir::Plan& plan, const std::vector<RankSlot>& slots, int step,
                                           RunControl& control);

/// The virtual stage that F/B of `op` (on `rank`) runs, checking plan.stage_of.
int stage_of(const ir::Plan& plan, int rank, int chunk);

}  // namespace tdpipe::exec
