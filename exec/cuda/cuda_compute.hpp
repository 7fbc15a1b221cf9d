// cuda_compute.hpp — internal to exec/cuda: Compute and Clock of one rank on its GPU.
// CudaCompute mirrors cpu::CpuCompute (same data, slices, loss scale, fp16 loss scaler) over
// GptStageCuda. Every op's kernels are issued on the rank's compute stream and run()
// returns without waiting for them (stream order, backend.hpp). Behind the op's end mark
// (issued()) the Buffer it returns is fenced by an event (mark_ready) that a SEND's
// stream waits for, and the gradients' and OPT's events are recorded, which the dp
// stream waits for before a bucket's reduction and an all-gather; an input is freed in
// order on the compute stream (use_on). On the compute stream the host waits only at the
// step's start (begin_step: the data upload) and end (end_step: the loss readout), for
// fp16's overflow flags and for downloads; 1-bit Adam's last part (onebit_expand), the
// copy stream's LOAD/OFFLOAD and transports still return complete. A
// chunk's last W/BW reports its gradients final part by part as it issues them
// (ComputeOp::progress), marked by an event each, and a bucket that starts inside the
// op waits (on the dp stream) for its part's event.
// With TrainOptions::cuda_graphs each F, B, BW and W is one CUDA graph launch after its
// first step (OpGraphs, op_graphs.hpp): the data a step feeds it (micro-batch ids) and
// what a RECV fills (one slot per tensor key) stay at fixed addresses.
// CudaClock timestamps with CUDA events on the op's stream, relative to one origin event;
// a compute op's marks are resolved after the step (Clock::mark).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "device_context.hpp"
#include "device_memory.hpp"
#include "gpt_cuda.hpp"
#include "op_graphs.hpp"
#include "tdpipe/exec/backend.hpp"
#include "tdpipe/exec/cpu/backend.hpp"
#include "tdpipe/exec/cpu/corpus.hpp"
#include "tdpipe/exec/loss_scale.hpp"
#include "tdpipe/ir/plan.hpp"

namespace tdpipe::exec::cuda {

class CudaCompute final : public Compute {
 public:
  CudaCompute(const cpu::GptConfig& config, const ir::Plan& plan, int rank, int replica,
              const cpu::Corpus& corpus, const cpu::TrainOptions& options, const DeviceContext& ctx,
              RunControl* control);
  ~CudaCompute() override;

  void begin_step(int step) override;
  Buffer run(const ComputeOp& op, Buffer input) override;
  void issued(const ComputeOp& op, const Buffer& out) override;
  Buffer allocate(const TensorKey& key) override;
  Buffer grad_bucket(int chunk, int index, int count) override;
  Buffer param_bucket(int chunk, int index, int count) override;
  /// The same part of the gradients (which = 0) or of Adam's moments (1, 2): what a
  /// sharded run gathers at its end so replica 0 reports the whole state.
  Buffer state_bucket(int chunk, int which, int index, int count);
  /// 1-bit Adam's local parts (Compute), as kernels on the dp stream.
  OnebitMessages onebit_compress(int chunk, int index, int count, int members) override;
  void onebit_serve(int chunk, int index, int count, int member, int members, OnebitMessages& m) override;
  void onebit_expand(int chunk, int index, int count, int members, const OnebitMessages& m) override;
  double end_step() override;
  /// Parameter offload's LOAD / OFFLOAD, on the copy stream (GptStageCuda::load_block).
  void copy(const CopyOp& op) override;
  /// Weights, Adam moments and bf16 copies on the device at most, so far (offload's measure).
  std::int64_t param_state_peak_bytes() const override { return memory_.peak(); }
  /// This rank's state between steps, downloaded (fp32 → double, exact): per chunk its
  /// master weights, both Adam moments and 1-bit Adam's error feedback — the arrays
  /// cpu::CpuCompute::checkpoint() names, so one checkpoint format serves both backends.
  RankCheckpoint checkpoint();
  int world_rank() const { return world_rank_; }
  /// Uploads a checkpoint() of the same rank of the same plan (the bf16 weights follow
  /// the master); throws tdpipe::Error naming a mismatched array.
  void restore(const RankCheckpoint& state);
  /// fp16 training's per-slice loss scaler (null in bf16), as cpu::CpuCompute's.
  const LossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  /// Continues the loss scaler from a run's state (TrainState::loss_scale); throws
  /// tdpipe::Error without fp16 or for another number of slices.
  void set_loss_scale_state(const LossScaleState& state);
  /// fp16: per slice, whether this rank's stores overflowed this step (all its chunks).
  std::vector<std::uint8_t> overflow_flags() const override;

  int chunks() const { return static_cast<int>(stages_.size()); }
  /// The per-op graphs (TrainOptions::cuda_graphs), or null without them.
  const OpGraphs* op_graphs() const { return graphs_ ? &*graphs_ : nullptr; }
  GptStageCuda& chunk_stage(int chunk) { return stages_.at(static_cast<std::size_t>(chunk)); }

 private:
  struct DeviceBatch {
    DeviceMemory tokens, targets;  // int32 b × seq
  };
  /// The step's token and target ids of every micro-batch, uploaded by begin_step on a
  /// rank that holds the first or the last stage.
  const DeviceBatch& micro_batch(int mb) const;
  void upload_batches();
  /// Issues the kernels of compute op `op` (not OPT; `name` in errors) on the compute
  /// stream; `input` is already ordered there. Returns what it hands on.
  Buffer issue(const ComputeOp& op, const std::string& name, Buffer input,
               std::chrono::steady_clock::duration& waited);
  /// Records, on the compute stream, that the kernels issued so far finish the trailing
  /// `tail` gradients of `chunk` (its last gradient op's progress, ComputeOp::progress).
  void mark_final_tail(int chunk, std::int64_t tail);
  /// Makes the dp stream wait until the gradients [first, n) of `chunk` are computed: the
  /// first mark covering them, else every gradient op of the chunk issued so far.
  void wait_final(int chunk, std::int64_t first);

  cpu::GptConfig config_;
  const cpu::Corpus* corpus_;
  cpu::TrainOptions options_;
  const DeviceContext* ctx_;
  RunControl* control_;
  int rank_, replica_, world_rank_, microbatches_;
  std::vector<int> offsets_;
  float loss_scale_;
  DType wire_ = DType::F32;  ///< what crosses stages (TrainOptions::bf16_wire: BF16)
  std::optional<LossScaler> scaler_;  ///< model.dtype fp16
  cpu::DeviceMemory memory_;  ///< counts what stages_ hold on the device; before them
  std::vector<GptStageCuda> stages_;
  std::map<int, DeviceBatch> batches_;
  DeviceMemory loss_;  // one double
  /// Recorded after each W/BW of a chunk (per chunk) and after OPT, on the compute stream.
  std::vector<OwnedEvent> grads_done_;
  OwnedEvent opt_done_;
  int step_ = 0;
  double speed_ = 1;  ///< options.rank_speed of this rank (a slower device, emulated)
  bool gathered_ = false;  ///< a sharded OPT ran: the bf16 weights follow the gathered master
  /// 1-bit Adam's error feedback per chunk (fp32, zeroed when first used): the worker's
  /// over the chunk, the server's over this member's segments (owned_segments_offset);
  /// one double of scratch.
  std::vector<DeviceMemory> worker_error_, server_error_;
  DeviceMemory onebit_sum_;
  /// Within-op bucket starts (overlap_grad_reduce): per chunk, this step's marks of its
  /// last gradient op, (tail, event) in issue order; the events are reused every step.
  struct TailMark {
    std::int64_t tail = 0;
    cudaEvent_t event = nullptr;
  };
  std::mutex marks_mu_;  ///< the compute thread adds marks, the dp thread reads them
  std::vector<std::vector<TailMark>> marks_;
  std::vector<std::size_t> marks_used_;
  std::vector<bool> last_issued_;  ///< per chunk: its last gradient op went through issued() this step
  std::optional<OpGraphs> graphs_;  ///< TrainOptions::cuda_graphs
  bool eager_step_ = false;         ///< this step runs without graphs (an injected overflow)
  std::mutex slots_mu_;                ///< allocate() runs on the p2p thread (Compute::allocate)
  std::map<TensorKey, Buffer> slots_;  ///< with graphs: what each RECV fills, every step
};

/// Event timestamps relative to an origin event; one per rank, sharing the origin
/// with every rank on the same device (loopback) or recorded after a barrier (NCCL).
/// mark() records an event of a pool behind the stream's work and returns its index, so a
/// compute op is timed without the host waiting for it; resolve() waits for each at the
/// step's end and frees the pool for the next step. now_ns waits at once.
class CudaClock final : public Clock {
 public:
  CudaClock(const DeviceContext& ctx, cudaEvent_t origin) : ctx_(&ctx), origin_(origin) {}
  ~CudaClock() override;
  CudaClock(const CudaClock&) = delete;
  CudaClock& operator=(const CudaClock&) = delete;
  std::int64_t now_ns(ir::Stream stream) override;
  std::int64_t mark(ir::Stream stream) override;
  void resolve(std::span<std::int64_t> marks) override;

 private:
  const DeviceContext* ctx_;
  cudaEvent_t origin_;
  std::mutex mu_;                   ///< marks come from the rank's stream threads
  std::vector<cudaEvent_t> marks_;  ///< timing events, [0, used_) recorded this step
  std::size_t used_ = 0;
};

}  // namespace tdpipe::exec::cuda
