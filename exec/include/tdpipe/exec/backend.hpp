// backend.hpp — what the interpreter needs from a device: compute, transport, clock.
//
// The interpreter (interpreter.hpp) executes one rank's lowered-plan ops in plan
// order per stream (compute, p2p, dp, copy) on host threads (Runtime), and calls these
// three parts.
// Every call returns when its op is complete as far as the interpreter can tell: it
// orders ops across streams with host-side waits only. A device backend may return
// from Compute::run with the op's work still in flight on its stream (stream order),
// provided that whatever the op hands on is ordered after it on the device: the CUDA
// backend fences each Buffer it returns with an event that its transports and its
// other streams wait for (cudaStreamWaitEvent), frees an input in order on the stream
// that used it last, and times ops with Clock::mark. Transports still return complete
// (a RECV's buffer is filled when the interpreter sees the RECV end). Calls on one part
// come from one stream thread at a time, except where noted; different parts are
// called concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>
#include <string>

#include "tdpipe/exec/buffer.hpp"
#include "tdpipe/ir/op.hpp"

namespace tdpipe::exec {

/// [first, second) of part `index` of `count` near-equal contiguous parts of `n`
/// elements: how a chunk's flattened gradients are cut into buckets and a bucket into
/// the data-parallel members' segments.
std::pair<std::int64_t, std::int64_t> part_range(std::int64_t n, int index, int count);

/// The segment of a bucket (of `members` parts) that data-parallel member `member` holds
/// reduced after a reduce-scatter, steps the optimizer on, and gives to the all-gather:
/// segment (member + 1) mod members — where a ring reduce-scatter leaves each member's sum.
int owned_segment(int member, int members);

/// A sharded optimizer step (ZeRO-1): which parameters this member updates.
struct OptimizerShard {
  int member = 0, members = 1;         ///< this replica, of the data-parallel group
  std::vector<int> buckets_per_chunk;  ///< per chunk: its buckets (REDUCE_SCATTER ops)
  /// Buckets of local chunk `chunk` (0 for a chunk the list does not name).
  int buckets(int chunk) const {
    return chunk >= 0 && chunk < static_cast<int>(buckets_per_chunk.size())
               ? buckets_per_chunk[static_cast<std::size_t>(chunk)]
               : 0;
  }
};

/// Element ranges [first, second) of a chunk of `n` parameters cut into `buckets`
/// buckets that `shard`'s member owns: its segment of each bucket.
std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges(std::int64_t n, int buckets,
                                                                const OptimizerShard& shard);

/// Reports, during a backward op, how far its weight gradients are final:
/// (trailing elements of the chunk's flattened gradients done, all of them). The
/// backward finishes the chunk's last parameters first (head, last block, …, embedding).
using GradProgress = std::function<void(std::int64_t tail_done, std::int64_t total)>;

/// Parameter offload (ir::is_weight_gate): how a compute op whose plan lists LOADs waits
/// for its layer blocks. The backend calls acquire(k, chunk, layer) before using the k-th
/// block (in the order it uses them; `layer` its layer within local chunk `chunk`,
/// 0-based) — it returns once that block's LOAD is done, and throws if the plan's k-th
/// LOAD brings another block — and release(k) when it is done with it (the copy that
/// reuses its slot may start). Called on run()'s thread.
struct WeightGate {
  std::function<void(int segment, int chunk, int layer)> acquire;
  std::function<void(int segment)> release;
};

/// An OPT under parameter offload, in the order its LOADs bring the state (the
/// lowering's): chunk by chunk, each chunk's blocks in order — step(chunk, block) between
/// that block's acquire and release — then resident(chunk) for the chunk's embedding/head.
template <class BlocksOf, class Step, class Resident>
void step_gated_blocks(const WeightGate& gate, int chunks, BlocksOf blocks_of, Step step, Resident resident) {
  int segment = 0;
  for (int c = 0; c < chunks; ++c) {
    for (int b = 0; b < blocks_of(c); ++b) {
      gate.acquire(segment, c, b);
      step(c, b);
      gate.release(segment++);
    }
    resident(c);
  }
}

/// A LOAD or OFFLOAD of parameter offload, as the backend sees it: layer `layer` of local
/// chunk `chunk`; `state`: the block's optimizer state too (OPT's copies), else its
/// weights only (a LOAD for an F, B or BW).
struct CopyOp {
  ir::OpKind kind = ir::OpKind::LOAD;
  int chunk = 0;
  int layer = 0;
  bool state = false;
};

/// A compute op as the backend sees it: kind F, B, W, BW or OPT of
/// (mb, chunk, slice) of this rank's model chunk `chunk` = virtual stage `stage`; or, in a
/// serving plan, PREFILL/DECODE of batch `mb` of the plan's serving table (ir/serving.hpp).
struct ComputeOp {
  ir::OpKind kind = ir::OpKind::F;
  int mb = -1;
  int chunk = 0;
  int slice = 0;
  int stage = 0;  ///< plan.stage_of[rank][chunk]; -1 for OPT
  /// OPT of a plan with REDUCE_SCATTER/ALL_GATHER buckets: step only the parameters
  /// this member owns (the gradients elsewhere are not reduced); null: every parameter.
  const OptimizerShard* shard = nullptr;
  /// W or BW that is its chunk's last gradient op of the step: call it as the gradients
  /// become final (on run()'s thread), so the dp stream can start the finished buckets
  /// while the op goes on; null, or a backend that does not call it: at the op's end.
  const GradProgress* progress = nullptr;
  /// OPT of a 1-bit Adam step after its warm-up (the plan's COMPRESSED_ALLREDUCE buckets
  /// already set the momentum): step with that momentum and the second moment as it was
  /// after step `variance_frozen_at` (the warm-up's last, 1-based), leaving both as they
  /// are; 0: an Adam step.
  int variance_frozen_at = 0;
  /// Parameter offload: the op's layer blocks arrive through this gate (F, B, BW: the
  /// weights; OPT: the optimizer state, stepped block by block); null: all resident.
  const WeightGate* gate = nullptr;
  /// OPT of fp16 training (Compute::overflow_flags not empty): per temporal slice, whether
  /// any rank's stores overflowed this step, as every rank agreed (Transport::agree_overflow).
  /// Any set: the step is skipped (no parameter changes) and the loss scales move.
  const std::vector<std::uint8_t>* overflow = nullptr;
  /// Cooperative runtime (Runtime::cooperative): call it between the op's layer blocks,
  /// on run()'s thread, so the p2p streams of the rank (and of the ranks sharing its
  /// thread: run_rank_steps) post and complete their transfers while a long op runs; its
  /// time is the runtime's, not the op's work. Null: nothing to call.
  const std::function<void()>* poll = nullptr;
  /// Serving, stage 0 of a pipeline: the tokens the last stage sampled for the earlier
  /// batches this op's requests were last in (the RECVs its `deps` name), as {batch, its
  /// buffer: one 4-byte token id per item of that batch, in the table's order}. A buffer
  /// may be handed to several ops (a batch's requests go on in different batches); empty
  /// otherwise.
  std::vector<std::pair<int, Buffer>> token_inputs = {};
};

/// The buffers of one bucket's 1-bit all-reduce, each in the backend's memory and
/// `members` blocks of onebit::block_bytes (tdpipe/exec/onebit.hpp) long.
struct OnebitMessages {
  Buffer sent;      ///< block j: the segment member j reduces (owned_segment(j))
  Buffer received;  ///< block i: this member's segment as member i compressed it
  Buffer gathered;  ///< block s: segment s as its owner re-compressed it (all-gathered)
};

/// [first, last) of part `index` of `count` of local chunk `chunk` (of `chunks`), which
/// holds `n` parameters, for a 1-bit all-reduce over `members`; throws tdpipe::Error
/// naming the bucket when any of them is out of range.
std::pair<std::int64_t, std::int64_t> onebit_bucket_range(std::int64_t n, int chunk, int chunks, int index,
                                                          int count, int members);
/// 1-bit Adam's server error feedback is kept for this member's segment of each bucket
/// only, bucket after bucket: for a chunk of `n` parameters cut into `count` buckets,
/// {where bucket `index`'s segment starts in it, its length over all buckets} (≈ n / members).
std::pair<std::int64_t, std::int64_t> owned_segments_offset(std::int64_t n, int index, int count, int member,
                                                            int members);
/// Throws tdpipe::Error unless each of m's buffers holds `bytes` bytes (DType::U8).
void check_onebit_messages(const OnebitMessages& m, std::int64_t bytes);

/// Runs the model. One instance per rank; it owns the rank's weights, gradients,
/// optimizer state, stashed activations and (TD-Pipe) per-(mb, chunk) KV caches.
class Compute {
 public:
  virtual ~Compute() = default;

  /// Before a training step's first op: zero gradients, load the step's data.
  virtual void begin_step(int step) = 0;

  /// Runs one op. `input` (ownership moves in) is what the op consumes from another
  /// virtual stage: for F at stage > 0 the activation {F, stage−1, mb, slice}; for
  /// B/BW at stage < last the gradient {B, stage+1, mb, slice}; empty otherwise.
  /// Returns what it produces for another stage: F below the last stage → its output
  /// activation {F, stage, mb, slice}; B/BW above stage 0 → the gradient w.r.t. its
  /// input {B, stage, mb, slice}; otherwise an empty Buffer. W and OPT take and give
  /// nothing. TD-Pipe: F of slice j reads the KV cache of slices < j of (mb, chunk);
  /// B of slice j adds key/value gradients for them (B runs slices in reverse order).
  /// Serving: PREFILL/DECODE of batch mb takes {F, stage−1, mb, 0} at stage > 0 and, in a
  /// plan of several stages, gives {F, stage, mb, 0}: hidden states below the last stage,
  /// the batch's sampled tokens (ComputeOp::token_inputs' format) on it.
  virtual Buffer run(const ComputeOp& op, Buffer input) = 0;

  /// After run() returned `out` and the interpreter marked the op's end (Clock::mark): a
  /// backend whose ops return with their work in flight records here what waits for it
  /// (CUDA: the Buffer's fence, the gradients' and OPT's events), so that nothing
  /// ordered after the op on another stream is timed before its end. Called on run()'s
  /// thread; default: nothing.
  virtual void issued(const ComputeOp& op, const Buffer& out) {
    (void)op;
    (void)out;
  }

  /// Of the last run()'s time, the nanoseconds spent in the model's decoder layers (the
  /// rest: embedding, head, loss), as the trace's TraceEvent::layers_ns; −1 when the
  /// backend does not measure it. Called on the thread that called run().
  virtual std::int64_t last_layers_ns() const { return -1; }

  /// A fresh buffer sized for tensor `key`, for a RECV to fill. Called from the p2p
  /// stream thread, concurrently with run(): must be thread-safe.
  virtual Buffer allocate(const TensorKey& key) = 0;

  /// A view of part `index` of `count` (contiguous, near-equal) of chunk `chunk`'s
  /// flattened gradients, for an in-place all-reduce on the dp stream. The interpreter
  /// calls it only after every W/BW of that chunk completed, and OPT only after every
  /// ALLREDUCE. The view aliases compute's memory and is valid until end_step().
  virtual Buffer grad_bucket(int chunk, int index, int count) = 0;

  /// The same part of chunk `chunk`'s flattened parameters (the fp32 master copy where
  /// the backend keeps one), for an in-place ALL_GATHER after a sharded OPT. Parameters
  /// the backend derives from them (a bf16 copy) are refreshed before the next step.
  virtual Buffer param_bucket(int chunk, int index, int count) = 0;

  /// 1-bit Adam after warm-up: the local arithmetic of the compressed all-reduce of part
  /// `index` of `count` of chunk `chunk`'s flattened parameters, around the transport's
  /// all_to_all(sent → received) and all_gather(gathered). Called on the dp stream, with
  /// grad_bucket's rules; a backend without it throws tdpipe::Error.
  /// Worker side: momentum ← β1·momentum + (1 − β1)·members·gradient over the part (the
  /// gradients are 1/members of the replica's mean), then compressed with the worker's
  /// error feedback into `sent`; `received` and `gathered` allocated.
  virtual OnebitMessages onebit_compress(int chunk, int index, int count, int members);
  /// Server side: the mean of the `received` blocks plus the server's error feedback for
  /// this member's segment, compressed into its block of `gathered`.
  virtual void onebit_serve(int chunk, int index, int count, int member, int members, OnebitMessages& m);
  /// The part's momentum ← the decoded blocks of `gathered` (every member the same), 0
  /// where the frozen second moment is 0 (the momentum mask, tdpipe/exec/onebit.hpp).
  virtual void onebit_expand(int chunk, int index, int count, int members, const OnebitMessages& m);

  /// Parameter offload, on the copy stream (concurrently with run() on other blocks):
  /// LOAD brings a decoder layer's weights (with `state`: and its optimizer state) from
  /// host memory into device memory; OFFLOAD writes a stepped block's state and weights
  /// back and frees it. A backend without it throws tdpipe::Error.
  virtual void copy(const CopyOp& op);
  /// The most bytes of weights and optimizer state the device held at once so far (what
  /// parameter offload moves to the host; gradients and activations aside); −1: not
  /// measured.
  virtual std::int64_t param_state_peak_bytes() const { return -1; }

  /// fp16 training with loss scaling: per temporal slice, whether this rank's stores of this
  /// step overflowed so far (inf / NaN); called on the compute thread before OPT. Empty:
  /// the backend does not scale the loss (OPT then gets no flags).
  virtual std::vector<std::uint8_t> overflow_flags() const { return {}; }

  /// After the step's last op: the loss this rank computed (sum of per-token
  /// cross-entropy / tokens in the global batch over its micro-batches; 0 unless
  /// it holds the last virtual stage).
  virtual double end_step() = 0;
};

/// One point-to-point op of a batch. Peers are pipeline ranks of this replica.
struct P2POp {
  ir::OpKind kind = ir::OpKind::SEND;  ///< SEND or RECV
  int peer = -1;
  TensorKey key;  ///< the producer's tensor; both sides must name the same one
  Buffer buffer;  ///< SEND: data to send (read only); RECV: destination (written)
  std::string label;  ///< op text for diagnostics, e.g. "SEND(F0.c1:s2>r1)"
};

/// A batch of point-to-point ops started without waiting (Transport::start). Destroying
/// an unfinished one withdraws it (the run is stopping); a peer matched with it then
/// waits for the abort.
class P2PRequest {
 public:
  virtual ~P2PRequest() = default;
  /// Progresses the batch without blocking (a transfer's checksum, a retry that is due);
  /// true once every op completed and the RECV buffers are filled. Throws as
  /// Transport::post does. Lowers `next` to the latest time by which to test again even
  /// if not woken (a retry's deadline).
  virtual bool test(std::chrono::steady_clock::time_point& next) = 0;
  /// Had op k of the batch completed by the last test() (its pair acknowledged: a
  /// RECV's buffer filled and checked, a SEND's tensor free)? If so, `at` is when. Each
  /// pair completes on its own, as in the plan's semantics (ir/replay.hpp): a RECV's
  /// consumer need not wait for the rest of its batch.
  virtual bool op_done(std::size_t k, std::chrono::steady_clock::time_point& at) const = 0;
};

/// Throws tdpipe::Error unless `op` is a SEND or RECV whose peer is a pipeline rank
/// (0 … stages − 1): what every Transport::post checks of each op before posting any.
void check_p2p_op(const P2POp& op, int stages);

/// Moves tensors between ranks, with NCCL semantics: the k-th SEND from rank a to
/// rank b matches the k-th RECV on b from a (per ordered pair, in posting order);
/// a SEND completes only when its RECV is posted and the data transferred
/// (rendezvous), so an order that deadlocks NCCL deadlocks here too.
class Transport {
 public:
  virtual ~Transport() = default;

  /// Before a batch is timed and posted (its ops' buffers in place): a transport whose
  /// SEND tensors may still be in the making on the device (Compute::issued) makes its
  /// stream wait for them here, so that the batch's start is not timed before their
  /// producers' end. post() and start() order them too. Default: nothing.
  virtual void prepare(std::span<P2POp> batch) { (void)batch; }

  /// Posts the ops of one batch together (one NCCL group) and returns once all of
  /// them completed. RECV buffers are filled in place. Throws tdpipe::Error on a
  /// key or size mismatch with the peer's op, or when the run is aborted.
  virtual void post(std::span<P2POp> batch) = 0;

  /// Can this transport start() batches? The cooperative runtime (interpreter.hpp) needs
  /// it; both runtimes use it where it can, so that each pair of a batch ends on its own.
  virtual bool can_start() const { return false; }
  /// Posts the batch as post() does but returns at once; `batch` must outlive the
  /// request. `wake` is called whenever the batch may have progressed (a peer matched,
  /// delivered or acknowledged it), with RunControl::mutex() held so that a waiter on that
  /// mutex misses no wake-up; it must not block. Throws tdpipe::Error unless can_start().
  virtual std::unique_ptr<P2PRequest> start(std::span<P2POp> batch, std::function<void()> wake);

  /// Sums `buffer` in place over this rank's data-parallel group (the same pipeline
  /// rank of every replica); every member calls it with the same `tag` in the same
  /// order. Result identical on every member.
  virtual void all_reduce(const Buffer& buffer, int tag) = 0;

  /// Sums `buffer` over the group into each member's owned segment (owned_segment,
  /// part_range over the members); the rest of the buffer is left unspecified. Same
  /// calling rules as all_reduce. The CPU ring and the CUDA loopback sum exactly as their
  /// all_reduce does (bit for bit); NCCL's ncclReduce need not add in ncclAllReduce's order.
  virtual void reduce_scatter(const Buffer& buffer, int tag) = 0;

  /// Copies each member's owned segment of `buffer` to every other member, in place.
  virtual void all_gather(const Buffer& buffer, int tag) = 0;

  /// Block j of `send` (members equal blocks) to member j's `recv` block (this member's
  /// index): NCCL's grouped ncclSend/ncclRecv all-to-all. Same calling rules as
  /// all_reduce; a transport without it throws tdpipe::Error.
  virtual void all_to_all(const Buffer& send, const Buffer& recv, int tag);

  /// ORs `flags` (one byte per temporal slice, 0 or 1) over every rank of every replica in
  /// place — fp16 training's overflow check before OPT (Megatron all-reduces found_inf over
  /// its model-parallel group; with per-slice flags every replica must see every slice's).
  /// Every rank calls it once per step with `tag` the step; a transport without it throws
  /// tdpipe::Error.
  virtual void agree_overflow(std::span<std::uint8_t> flags, int tag);

  /// This rank's place in its data-parallel group: {member, members}.
  virtual std::pair<int, int> dp_member() const = 0;
};

/// Timestamps for the measured trace, in ns since the run's origin (common to all
/// ranks of one run).
class Clock {
 public:
  virtual ~Clock() = default;
  /// Now, as seen by work issued on `stream` (a CUDA backend records an event and waits
  /// for it: the host waits for the stream's work).
  virtual std::int64_t now_ns(ir::Stream stream) = 0;
  /// The point `stream`'s issued work has reached, as a mark that resolve() turns into ns
  /// later: a backend whose ops return with their work in flight (CUDA: an event recorded
  /// behind the stream's kernels) times them without waiting. Default: now_ns itself.
  virtual std::int64_t mark(ir::Stream stream) { return now_ns(stream); }
  /// Turns this step's marks into ns, in place, after its last op (waiting for the work
  /// they stand behind); every mark of the step is resolved in one call. Default: they
  /// are ns already.
  virtual void resolve(std::span<std::int64_t> marks) { (void)marks; }
};

/// The three parts for one rank. Not owning.
class FaultInjector;  // exec/faults.hpp
class Heartbeats;

/// How the interpreter gives a rank's streams host threads. `threaded`: a thread per
/// stream, each blocking in its op's waits and transport calls. `cooperative`: the
/// compute and p2p streams take turns on one thread, p2p batches started without waiting
/// (Transport::start), so a hand-off from compute to p2p costs no thread switch; the dp
/// and copy streams keep their own threads. Cooperative needs Transport::can_start() and
/// falls back to threaded without it (the CUDA transports).
enum class Runtime { threaded, cooperative };

struct Backend {
  Compute* compute = nullptr;
  Transport* transport = nullptr;
  Clock* clock = nullptr;
  /// Injected faults the interpreter applies at its ops (kill, hang, slow); null: none.
  FaultInjector* faults = nullptr;
  /// Where a killed or hung rank stops beating, for the others to notice; null: it
  /// reports itself (RankFault) at once.
  Heartbeats* heartbeats = nullptr;
  Runtime runtime = Runtime::cooperative;
};

}  // namespace tdpipe::exec
