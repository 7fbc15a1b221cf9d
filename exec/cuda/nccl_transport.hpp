// nccl_transport.hpp — internal to exec/cuda: pipeline SEND/RECV and data-parallel
// all-reduce over NCCL, one process per GPU. A batch of the plan is one
// ncclGroupStart/End (the lowering's batching rule keeps that deadlock-free); the
// p2p communicator spans the world (replica · p + rank), the dp communicator the
// replicas of one pipeline rank (ncclCommSplit).
#pragma once

#include <set>
#include <span>
#include <vector>

#include <nccl.h>

#include "device_context.hpp"
#include "tdpipe/exec/backend.hpp"

namespace tdpipe::exec::cuda {

class NcclTransport final : public Transport {
 public:
  /// `restartable`: a peer's remote error (a process that failed or left) is a RankFault,
  /// which a run with checkpoints or injected faults restarts from; else an Error.
  /// `ctl`: fp16 training's communicator over the world for the overflow agreement (null:
  /// none — not fp16, or a world of one).
  NcclTransport(ncclComm_t world, ncclComm_t dp, const DeviceContext& ctx, int replica, int rank, int stages,
                RunControl* control, bool restartable = false, ncclComm_t ctl = nullptr)
      : world_(world), dp_(dp), ctl_(ctl), ctx_(&ctx), replica_(replica), rank_(rank), stages_(stages),
        control_(control), restartable_(restartable) {}
  void prepare(std::span<P2POp> batch) override;
  void post(std::span<P2POp> batch) override;
  void all_reduce(const Buffer& buffer, int tag) override;
  /// One group of d ncclReduce calls, segment s to its owner (owned_segment): NCCL's own
  /// ncclReduceScatter needs equal segments, the near-equal split need not be.
  void reduce_scatter(const Buffer& buffer, int tag) override;
  /// One group of d ncclBroadcast calls, each owner's segment to the others.
  void all_gather(const Buffer& buffer, int tag) override;
  /// One group of ncclSend/ncclRecv with every other member (NCCL's all-to-all).
  void all_to_all(const Buffer& send, const Buffer& recv, int tag) override;
  /// One max all-reduce of the flags (as floats) over `ctl` on the compute stream, from
  /// the compute thread (Megatron all-reduces found_inf the same way).
  void agree_overflow(std::span<std::uint8_t> flags, int tag) override;
  std::pair<int, int> dp_member() const override;

  /// Connects every pipeline peer of this rank (one tiny send and receive each way,
  /// in one group) and the dp communicator with one all-reduce of each gradient bucket
  /// the plan reduces (NCCL picks its algorithm by size and connects it on first use:
  /// mid-step, that setup would run while p2p kernels spin on the other communicator),
  /// so no timed op pays NCCL's lazy setup.
  /// `sharded`: the plan reduce-scatters and all-gathers its buckets instead;
  /// `compressed`: it also runs 1-bit Adam's all-to-all and byte all-gather.
  void warm_up(const std::set<int>& pipeline_peers, const std::vector<Buffer>& dp_buckets, bool sharded,
               bool compressed);

 private:
  /// Polls `stream` until NCCL's work on it is done; throws on `comm`'s asynchronous
  /// error and Aborted once the run failed elsewhere (never blocks in the driver).
  void wait(cudaStream_t stream, ncclComm_t comm);
  /// reduce_scatter (reduce) or all_gather over the owners' segments.
  void segments(const Buffer& buffer, int tag, bool reduce);
  ncclComm_t world_, dp_, ctl_;
  const DeviceContext* ctx_;
  int replica_, rank_, stages_;
  RunControl* control_;
  bool restartable_;
};

}  // namespace tdpipe::exec::cuda
