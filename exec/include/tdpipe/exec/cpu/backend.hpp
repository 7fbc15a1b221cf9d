// backend.hpp — the CPU backend: the Eigen GPT as Compute, in-process rendezvous
// channels as Transport (NCCL semantics, ring all-reduce), steady_clock as Clock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "tdpipe/exec/backend.hpp"
#include "tdpipe/exec/checkpoint.hpp"
#include "tdpipe/exec/cpu/corpus.hpp"
#include "tdpipe/exec/cpu/gpt.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/exec/loss_scale.hpp"
#include "tdpipe/exec/run_control.hpp"
#include "tdpipe/ir/plan.hpp"

namespace tdpipe::exec::cpu {

/// What a training run needs besides the plan.
struct TrainOptions {
  int steps = 3;
  AdamConfig adam;
  std::uint64_t data_seed = 7;
  std::uint64_t init_seed = 1234;
  std::string corpus_path;  ///< "" = Corpus::default_path()
  /// Speed of each pipeline rank in [0.01, 1] (empty or missing: 1). The CPU backend makes
  /// a heterogeneous cluster real by stretching each F/B/W of rank r to 1/speed[r] of
  /// its time (it sleeps for the rest); the maths is unchanged.
  std::vector<double> rank_speed;
  /// fp16 training (model.dtype: fp16): at step `step` (counted from the first step ever,
  /// TrainState::steps_done included) world rank `rank` (replica · p + pipeline rank)
  /// stores +inf into the first input-gradient backward of temporal slice `slice` on its
  /// first chunk — an overflow, to watch the loss scaler skip the step. step < 0: none.
  struct OverflowInjection {
    int step = -1, rank = 0, slice = 0;
  } inject_overflow;
  /// Activations and their gradients cross stages as bf16 (not with model.dtype fp16): the CUDA
  /// backend sends them as bf16 (half the bytes of fp32, what the planner prices), the
  /// CPU backend rounds them through bf16 (round_to_bf16), so that each compares like
  /// with like. Off: fp32 on the GPU, exact on the CPU. `tdpipe exec --wire`.
  bool bf16_wire = false;
  /// CUDA backend: each F, B, BW and W is captured into a CUDA graph at its first step and
  /// replayed after (exec/cuda/op_graphs.hpp); refused with parameter offload. The CPU
  /// backend ignores it. `tdpipe exec --cuda-graphs`.
  bool cuda_graphs = false;
};

/// options.rank_speed of pipeline rank `rank` (1 when not given). Throws tdpipe::Error
/// for a speed outside [0.01, 1].
double rank_speed_of(const TrainOptions& options, int rank);

/// The emulated slower device of both backends: after an op that took `work`, idles the
/// calling thread for work · (1/speed − 1), so the op takes work / speed.
void stretch_to_speed(std::chrono::steady_clock::duration work, double speed);

/// Token boundaries of the plan's slices: S + 1 offsets from 0 to seq
/// (plan.slice_tokens, or an equal split when it is empty).
std::vector<int> slice_offsets(const ir::Plan& plan, int seq);

/// Compute of one pipeline rank of one replica: one GptStage per chunk.
class CpuCompute final : public Compute {
 public:
  CpuCompute(const GptConfig& config, const ir::Plan& plan, int rank, int replica,
             const Corpus& corpus, const TrainOptions& options);

  void begin_step(int step) override;
  Buffer run(const ComputeOp& op, Buffer input) override;
  std::int64_t last_layers_ns() const override { return last_layers_ns_; }
  void copy(const CopyOp& op) override;
  std::int64_t param_state_peak_bytes() const override { return memory_.peak(); }
  std::vector<std::uint8_t> overflow_flags() const override;
  /// fp16 training's per-slice loss scaler (null without fp16).
  const LossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  /// Continues the loss scaler from a run's state (TrainState::loss_scale); throws
  /// tdpipe::Error without fp16 or for another number of slices.
  void set_loss_scale_state(const LossScaleState& state);
  /// This rank's whole state between steps, exactly: per chunk its weights, Adam moments
  /// and 1-bit Adam's error feedback, and the loss scaler (a checkpoint).
  RankCheckpoint checkpoint();
  int world_rank() const { return world_rank_; }
  /// Takes back a checkpoint() of the same rank of the same plan; throws tdpipe::Error
  /// naming the array when its shape differs.
  void restore(const RankCheckpoint& state);
  /// run() without the rank-speed stretch.
  Buffer run_op(const ComputeOp& op, Buffer input);
  Buffer allocate(const TensorKey& key) override;
  Buffer grad_bucket(int chunk, int index, int count) override;
  Buffer param_bucket(int chunk, int index, int count) override;
  OnebitMessages onebit_compress(int chunk, int index, int count, int members) override;
  void onebit_serve(int chunk, int index, int count, int member, int members, OnebitMessages& m) override;
  void onebit_expand(int chunk, int index, int count, int members, const OnebitMessages& m) override;
  double end_step() override;

  /// The stage of local chunk `chunk`.
  GptStage& chunk_stage(int chunk) { return stages_.at(static_cast<std::size_t>(chunk)); }
  int chunks() const { return static_cast<int>(stages_.size()); }

 private:
  const MicroBatch& micro_batch(int mb);

  GptConfig config_;
  const Corpus* corpus_;
  TrainOptions options_;
  int rank_, replica_, world_rank_, microbatches_, virtual_stages_;
  std::vector<int> offsets_;
  double loss_scale_;
  double speed_ = 1;  ///< options.rank_speed of this rank
  std::int64_t last_layers_ns_ = -1;
  std::optional<LossScaler> scaler_;  ///< model.dtype fp16
  std::vector<GptStage> stages_;
  DeviceMemory memory_;  ///< the stages' weights and Adam state on the "device"
  /// 1-bit Adam's error feedback per chunk: the worker's, flat like its parameters, and
  /// the server's over this member's segments only (owned_segments_offset).
  std::vector<std::vector<double>> worker_error_, server_error_;
  std::map<int, MicroBatch> batches_;
  int step_ = 0;
  double loss_ = 0;
};

/// A transfer the fabric delivered again: why, and how long the sender waited first.
struct RetryRecord {
  int comm = 0, from = 0, to = 0, step = 0;
  int attempt = 0;     ///< the delivery that failed (1: the first)
  std::string why;     ///< "lost" (no acknowledgement) or "corrupt" (checksum mismatch)
  std::string label;   ///< the SEND's op text
  std::int64_t bytes = 0;
  std::chrono::steady_clock::time_point failed, resent;  ///< the failure was seen; the retry left
};

/// The in-process network of one run: FIFO rendezvous channels per (communicator,
/// sender, receiver) over world ranks (replica · p + pipeline rank). Every message carries
/// the CRC-32 of its payload, computed by the sender; the receiver checks it and
/// acknowledges, and the SEND completes on the acknowledgement. A message lost on the
/// wire (no acknowledgement within the retry timeout) or received corrupt is sent again
/// after a backoff that doubles per retry; after max_retries the transfer fails with a
/// RankFault (exec/faults.hpp), which a launcher may recover from by a restart.
class CpuFabric {
 public:
  static constexpr int kP2P = 0;  ///< pipeline point-to-point communicator
  static constexpr int kDP = 1;   ///< data-parallel communicator
  static constexpr int kWorld = 2;  ///< every rank of every replica (fp16's overflow agreement)
  /// `faults`: injected drops and corruptions (null: none); `retry_timeout`, `max_retries`:
  /// FaultOptions'.
  explicit CpuFabric(RunControl& control, FaultInjector* faults = nullptr, double retry_timeout = 0.02,
                     int max_retries = 3)
      : control_(&control), faults_(faults), retry_timeout_(retry_timeout), max_retries_(max_retries) {}
  /// Posts `ops` of world rank `self` (peers given as world ranks) together and
  /// blocks until all completed. Throws tdpipe::Error on a mismatch, RankFault when a
  /// transfer failed more than max_retries times, Aborted on abort.
  void post(int comm, int self, std::span<P2POp> ops);
  /// post() without the wait (Transport::start): the request owns `ops`, whose RECV
  /// buffers share their memory with the caller's.
  std::unique_ptr<P2PRequest> start(int comm, int self, std::vector<P2POp> ops, std::function<void()> wake);
  /// Bytes delivered on communicator `comm` so far (every delivery's payload, retries included).
  std::int64_t bytes_moved(int comm);
  /// Called between steps (no post in flight): messages of step `step` follow; their
  /// count per (communicator, sender, receiver) starts again (FaultSpec::message).
  void begin_step(int step);
  /// The retries since the last call.
  std::vector<RetryRecord> take_retries();

 private:
  // A transfer completes when both sides are posted, the payload delivered and its
  // checksum checked; either poster does the work as it posts or progresses (a retry
  // too), so a rank busy computing does not hold up its peer.
  struct Pending;
  struct Batch;
  class Request;
  void enter(Batch& b);
  bool progress(Batch& b, std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point& next);
  void withdraw(Batch& b, std::unique_lock<std::mutex>& lock);
  void deliver(Pending& send, std::chrono::steady_clock::time_point now);
  std::chrono::steady_clock::duration backoff(int attempt) const;
  RunControl* control_;
  FaultInjector* faults_;
  double retry_timeout_;
  int max_retries_;
  int step_ = 0;
  std::int64_t moved_[3] = {0, 0, 0};  ///< per communicator; guarded by control_->mutex()
  std::map<std::tuple<int, int, int>, std::vector<Pending*>> sends_, recvs_;
  std::map<std::tuple<int, int, int>, int> sent_;  ///< messages posted this step per channel
  std::vector<RetryRecord> retries_;
  /// A checksum check of another poster's RECV ended (withdraw waits for those).
  std::condition_variable checked_;
};

/// Transport of one (replica, pipeline rank) over a CpuFabric.
class CpuTransport final : public Transport {
 public:
  CpuTransport(CpuFabric& fabric, int replica, int rank, int stages, int data)
      : fabric_(&fabric), replica_(replica), rank_(rank), stages_(stages), data_(data) {}
  void post(std::span<P2POp> batch) override;
  bool can_start() const override { return true; }
  std::unique_ptr<P2PRequest> start(std::span<P2POp> batch, std::function<void()> wake) override;
  /// Ring all-reduce (reduce-scatter then all-gather, d − 1 steps each) over the
  /// replicas of this pipeline rank; every element's sum is formed once, so all
  /// replicas end bit-identical.
  void all_reduce(const Buffer& buffer, int tag) override;
  /// all_reduce's first half: after it replica i holds segment owned_segment(i, d).
  void reduce_scatter(const Buffer& buffer, int tag) override;
  /// all_reduce's second half.
  void all_gather(const Buffer& buffer, int tag) override;
  /// One batch of d − 1 sends and d − 1 receives (block j to replica j), as NCCL groups them.
  void all_to_all(const Buffer& send, const Buffer& recv, int tag) override;
  /// Every rank sends its flags to every other (one batch of world − 1 sends and receives
  /// on the world communicator) and ORs what it receives.
  void agree_overflow(std::span<std::uint8_t> flags, int tag) override;
  std::pair<int, int> dp_member() const override { return {replica_, data_}; }

 private:
  /// Ring steps [first, first + d − 1): reduce-scatter from step 0, all-gather from d − 1.
  void ring(const Buffer& buffer, int tag, bool reduce);
  /// The batch checked (every op, before any is posted) and its peers as world ranks.
  std::vector<P2POp> world_ops(std::span<P2POp> batch) const;
  CpuFabric* fabric_;
  int replica_, rank_, stages_, data_;
};

/// ns since a common origin.
class CpuClock final : public Clock {
 public:
  explicit CpuClock(std::chrono::steady_clock::time_point origin) : origin_(origin) {}
  std::int64_t now_ns(ir::Stream) override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now() - origin_).count();
  }
  /// A time point on this clock.
  std::int64_t ns_of(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count();
  }

 private:
  std::chrono::steady_clock::time_point origin_;
};

/// A host buffer of `elements` doubles, owned by the Buffer.
Buffer host_buffer(std::int64_t elements);
/// A zeroed host buffer of `bytes` bytes (DType::U8), owned by the Buffer.
Buffer host_bytes(std::int64_t bytes);

}  // namespace tdpipe::exec::cpu
