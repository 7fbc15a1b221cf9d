// cpu_backend.cpp — CpuCompute (Eigen GPT per chunk), CpuFabric rendezvous
// channels with NCCL matching rules, ring all-reduce.
#include "tdpipe/exec/cpu/backend.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "tdpipe/exec/onebit.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cpu {

Buffer host_buffer(std::int64_t elements) {
  Buffer b;
  b.data = std::shared_ptr<void>(new double[static_cast<std::size_t>(std::max<std::int64_t>(elements, 1))](),
                                 [](void* p) { delete[] static_cast<double*>(p); });
  b.elements = elements;
  b.dtype = DType::F64;
  return b;
}

Buffer host_bytes(std::int64_t bytes) {
  Buffer b;
  b.data = std::shared_ptr<void>(new std::uint8_t[static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1))](),
                                 [](void* p) { delete[] static_cast<std::uint8_t*>(p); });
  b.elements = bytes;
  b.dtype = DType::U8;
  return b;
}

namespace {
// `bf16`: rounded through bf16, as the CUDA backend sends a stage's output (bf16_wire).
Buffer to_buffer(const Mat& m, bool bf16 = false) {
  Buffer b = host_buffer(m.size());
  if (bf16)
    std::transform(m.data(), m.data() + m.size(), b.as<double>(), round_to_bf16);
  else
    std::copy(m.data(), m.data() + m.size(), b.as<double>());
  return b;
}
Mat to_mat(const Buffer& b, Eigen::Index rows, Eigen::Index cols, const char* what) {
  if (b.empty() || b.elements != rows * cols || b.dtype != DType::F64)
    throw Error(fmt::format("{}: got a buffer of {} elements, expected {}×{} doubles", what,
                            b.elements, rows, cols));
  return Eigen::Map<const Mat>(b.as<double>(), rows, cols);
}
}  // namespace

std::vector<int> slice_offsets(const ir::Plan& plan, int seq) {
  const int slices = std::max(1, plan.slices);
  std::vector<int> offsets{0};
  if (!plan.slice_tokens.empty()) {
    if (static_cast<int>(plan.slice_tokens.size()) != slices)
      throw Error(fmt::format("plan: slice_tokens has {} entries, expected slices = {}",
                              plan.slice_tokens.size(), slices));
    for (int t : plan.slice_tokens) {
      if (t <= 0) throw Error(fmt::format("plan: slice_tokens has a slice of {} tokens", t));
      offsets.push_back(offsets.back() + t);
    }
    if (offsets.back() != seq)
      throw Error(fmt::format("plan: slice_tokens sum to {}, expected the sequence length {}",
                              offsets.back(), seq));
    return offsets;
  }
  if (slices > seq)
    throw Error(fmt::format("plan: {} slices of a {}-token sequence", slices, seq));
  for (int j = 1; j <= slices; ++j) offsets.push_back(seq * j / slices);
  return offsets;
}

CpuCompute::CpuCompute(const GptConfig& config, const ir::Plan& plan, int rank, int replica,
                       const Corpus& corpus, const TrainOptions& options)
    : config_(config),
      corpus_(&corpus),
      options_(options),
      rank_(rank),
      replica_(replica),
      world_rank_(replica * plan.num_ranks() + rank),
      microbatches_(plan.microbatches),
      virtual_stages_(plan.virtual_stages()),
      offsets_(slice_offsets(plan, config.seq)) {
  if (corpus.vocab() > config.vocab)
    throw Error(fmt::format("model.vocab = {} is smaller than the corpus's {} characters",
                            config.vocab, corpus.vocab()));
  loss_scale_ = 1.0 / (static_cast<double>(plan.data) * plan.microbatches * config.micro_batch *
                       config.seq);
  const auto& chunks = plan.stage_of.at(static_cast<std::size_t>(rank));
  for (int stage : chunks) stages_.emplace_back(config_, stage, virtual_stages_);
  for (GptStage& s : stages_) s.attach_memory(&memory_, plan.scenario.parallel.offload());
  scaler_ = make_loss_scaler(plan, static_cast<int>(offsets_.size()) - 1);
  worker_error_.resize(stages_.size());
  server_error_.resize(stages_.size());
  speed_ = rank_speed_of(options, rank);
}

double rank_speed_of(const TrainOptions& options, int rank) {
  const double speed = rank >= 0 && static_cast<std::size_t>(rank) < options.rank_speed.size()
                           ? options.rank_speed[static_cast<std::size_t>(rank)]
                           : 1.0;
  if (!(speed >= 0.01 && speed <= 1))
    throw Error(fmt::format("rank speed of rank {} is {}; expected 0.01 ≤ speed ≤ 1 (a fraction of this device's)",
                            rank, speed));
  return speed;
}

void stretch_to_speed(std::chrono::steady_clock::duration work, double speed) {
  if (speed != 1)
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::nanoseconds>(work * (1 / speed - 1)));
}

namespace {
// While an F, B or BW runs, before each block: the runtime's poll (ComputeOp::poll), and
// with parameter offload the wait at the gate for the block's LOAD, whose device copy is
// dropped when the block is done (the weights did not change).
class GatedBlocks {
 public:
  GatedBlocks(const ComputeOp& op, GptStage& st) : st_(st) {
    if (!op.gate && !op.poll) return;
    st.set_block_hooks(
        [gate = op.gate, poll = op.poll, chunk = op.chunk, this](int b) {
          const auto t0 = std::chrono::steady_clock::now();
          if (poll) (*poll)();
          if (gate) gate->acquire(next_++, chunk, b);
          waited_ += std::chrono::steady_clock::now() - t0;
        },
        [gate = op.gate, &st, this](int b) {
          if (!gate) return;
          st.release_block(b);
          gate->release(next_ - 1);
        });
  }
  ~GatedBlocks() { st_.set_block_hooks({}, {}); }
  /// Time spent waiting for LOADs and in the runtime's poll: not the op's work (nor the layers').
  std::chrono::steady_clock::duration waited() const { return waited_; }
  GatedBlocks(const GatedBlocks&) = delete;
  GatedBlocks& operator=(const GatedBlocks&) = delete;

 private:
  GptStage& st_;
  int next_ = 0;
  std::chrono::steady_clock::duration waited_{0};
};
}  // namespace

Buffer CpuCompute::run(const ComputeOp& op, Buffer input) {
  last_layers_ns_ = -1;
  if (op.kind == ir::OpKind::OPT || op.chunk < 0 || op.chunk >= chunks())
    return run_op(op, std::move(input));  // (which names a chunk out of range)
  GptStage& st = chunk_stage(op.chunk);
  st.take_block_ns();
  const GatedBlocks gated(op, st);
  const auto t0 = std::chrono::steady_clock::now();
  Buffer out = run_op(op, std::move(input));
  const auto work = std::chrono::steady_clock::now() - t0 - gated.waited();
  // A slower device stretches every part of the op alike (waits for LOADs aside).
  const auto waited_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(gated.waited()).count();
  last_layers_ns_ = std::llround(static_cast<double>(std::max<std::int64_t>(0, st.take_block_ns() - waited_ns)) / speed_);
  stretch_to_speed(work, speed_);
  return out;
}

const MicroBatch& CpuCompute::micro_batch(int mb) {
  auto it = batches_.find(mb);
  if (it == batches_.end())
    it = batches_.emplace(mb, load_micro_batch(*corpus_, options_.data_seed, step_, replica_,
                                               microbatches_, mb, config_.micro_batch, config_.seq))
             .first;
  return it->second;
}

void CpuCompute::begin_step(int step) {
  step_ = step;
  loss_ = 0;
  batches_.clear();
  for (auto& s : stages_) {
    if (scaler_) s.set_fp16(scaler_->scales());
    s.begin_step();
  }
  const auto& inject = options_.inject_overflow;
  if (inject.step == step && inject.rank == world_rank_ && !stages_.empty()) stages_.front().inject_overflow(inject.slice);
}

std::vector<std::uint8_t> CpuCompute::overflow_flags() const {
  if (!scaler_) return {};
  std::vector<std::uint8_t> flags(static_cast<std::size_t>(scaler_->slices()), 0);
  for (const GptStage& s : stages_)
    for (std::size_t j = 0; j < flags.size() && j < s.overflowed().size(); ++j) flags[j] |= s.overflowed()[j];
  return flags;
}

void CpuCompute::set_loss_scale_state(const LossScaleState& state) {
  if (!scaler_) throw Error("a loss scaler state to continue from, but the run is not fp16 (model.dtype)");
  scaler_->set_state(state);
}

double CpuCompute::end_step() { return loss_; }

RankCheckpoint CpuCompute::checkpoint() {
  RankCheckpoint out;
  out.world_rank = world_rank_;
  for (int ch = 0; ch < chunks(); ++ch) {
    GptStage& st = chunk_stage(ch);
    const auto c = static_cast<std::size_t>(ch);
    out.arrays.emplace_back(fmt::format("c{}.params", ch), st.params());
    out.arrays.emplace_back(fmt::format("c{}.m1", ch), st.moments(1));
    out.arrays.emplace_back(fmt::format("c{}.m2", ch), st.moments(2));
    out.arrays.emplace_back(fmt::format("c{}.worker_error", ch), worker_error_[c]);
    out.arrays.emplace_back(fmt::format("c{}.server_error", ch), server_error_[c]);
  }
  if (scaler_) out.loss_scale = scaler_->state();
  return out;
}

void CpuCompute::restore(const RankCheckpoint& state) {
  if (state.world_rank != world_rank_)
    throw Error(fmt::format("restore: a checkpoint of world rank {} given to world rank {}", state.world_rank,
                            world_rank_));
  if (state.arrays.size() != static_cast<std::size_t>(5 * chunks()))
    throw Error(fmt::format("restore: world rank {} has {} chunks, its checkpoint {} arrays (5 per chunk)",
                            world_rank_, chunks(), state.arrays.size()));
  std::size_t i = 0;
  for (int ch = 0; ch < chunks(); ++ch) {
    GptStage& st = chunk_stage(ch);
    const auto c = static_cast<std::size_t>(ch);
    // Weights and moments have the stage's size; the error feedback is sized when first used.
    auto take = [&](std::vector<double>& into, const char* what, bool sized) {
      const auto& [name, values] = state.arrays[i++];
      if (name != fmt::format("c{}.{}", ch, what) || (sized && values.size() != into.size()))
        throw Error(fmt::format("restore: world rank {}: the checkpoint's {} ({} values) is not chunk {}'s {} "
                                "({} values)", world_rank_, name, values.size(), ch, what, into.size()));
      into = values;
    };
    take(st.params(), "params", true);
    take(st.moments(1), "m1", true);
    take(st.moments(2), "m2", true);
    take(worker_error_[c], "worker_error", false);
    take(server_error_[c], "server_error", false);
  }
  if (scaler_ && !state.loss_scale.scales.empty()) scaler_->set_state(state.loss_scale);
}

namespace {
// The interpreter's progress callback as the stage's per-part hook (none: no hook).
std::function<void(std::int64_t)> progress_of(const ComputeOp& op, GptStage& st) {
  if (!op.progress) return {};
  const auto total = static_cast<std::int64_t>(st.grads().size());
  return [f = op.progress, total](std::int64_t tail) { (*f)(tail, total); };
}
}  // namespace

void CpuCompute::copy(const CopyOp& op) {
  if (op.chunk < 0 || op.chunk >= chunks())
    throw Error(fmt::format("{} of chunk {}: this rank has {} chunks", ir::to_string(op.kind), op.chunk, chunks()));
  GptStage& st = chunk_stage(op.chunk);
  if (op.kind == ir::OpKind::LOAD)
    st.load_block(op.layer, op.state);
  else if (op.kind == ir::OpKind::OFFLOAD && op.state)
    st.offload_block(op.layer);
  else
    throw Error(fmt::format("{} of chunk {} layer {}: expected a LOAD, or an OFFLOAD of optimizer state",
                            ir::to_string(op.kind), op.chunk, op.layer));
}

Buffer CpuCompute::run_op(const ComputeOp& op, Buffer input) {
  // Adam's step count: the steps it took (skipped fp16 steps do not count).
  const int t = step_ + 1 - (scaler_ ? scaler_->state().skipped : 0);
  bool skip = false;
  if (op.kind == ir::OpKind::OPT && scaler_) {
    if (!op.overflow)
      throw Error(fmt::format("OPT of step {} on rank {}: fp16 training needs the overflow flags every rank agreed on",
                              step_, rank_));
    skip = scaler_->update(*op.overflow);
  }
  if (op.kind == ir::OpKind::OPT && op.gate) {
    // Parameter offload: the blocks' state arrives chunk by chunk, layer by layer; each
    // is stepped on the device and written back by its OFFLOAD. The rest is resident.
    step_gated_blocks(
        *op.gate, chunks(), [&](int c) { return chunk_stage(c).blocks(); },
        [&](int c, int b) {
          if (!skip) chunk_stage(c).adam_block(options_.adam, t, b);
        },
        [&](int c) {
          if (!skip) chunk_stage(c).adam_resident(options_.adam, t);
        });
    return {};
  }
  if (op.kind == ir::OpKind::OPT) {
    if (skip) return {};
    for (int c = 0; c < chunks(); ++c) {
      GptStage& s = chunk_stage(c);
      if (op.variance_frozen_at > 0) {
        s.adam_frozen_variance(options_.adam, t, op.variance_frozen_at);
        continue;
      }
      if (!op.shard) {
        s.adam(options_.adam, t);
        continue;
      }
      for (const auto& [b, e] : owned_ranges(static_cast<std::int64_t>(s.params().size()), op.shard->buckets(c), *op.shard))
        s.adam(options_.adam, t, b, e);
    }
    return {};
  }
  if (op.chunk < 0 || op.chunk >= chunks())
    throw Error(fmt::format("chunk {} out of range (this rank has {})", op.chunk, chunks()));
  if (op.slice < 0 || op.slice + 1 >= static_cast<int>(offsets_.size()))
    throw Error(fmt::format("slice {} out of range (the plan has {})", op.slice, offsets_.size() - 1));
  if (op.mb < 0 || op.mb >= microbatches_)
    throw Error(fmt::format("micro-batch {} out of range (m = {})", op.mb, microbatches_));
  GptStage& st = chunk_stage(op.chunk);
  const int t0 = offsets_[static_cast<std::size_t>(op.slice)];
  const int t1 = offsets_[static_cast<std::size_t>(op.slice) + 1];
  const Eigen::Index rows = static_cast<Eigen::Index>(config_.micro_batch) * (t1 - t0);
  switch (op.kind) {
    case ir::OpKind::F: {
      const MicroBatch* data = (st.is_first() || st.is_last()) ? &micro_batch(op.mb) : nullptr;
      Mat x;
      if (!st.is_first()) x = to_mat(input, rows, config_.hidden, "F input");
      Mat y = st.forward(op.mb, op.slice, t0, t1, x, data ? &data->tokens : nullptr,
                         data ? &data->targets : nullptr, loss_scale_, &loss_);
      if (st.is_last()) return {};
      return to_buffer(y, options_.bf16_wire);
    }
    case ir::OpKind::B:
    case ir::OpKind::BW: {
      Mat dy;
      if (!st.is_last()) dy = to_mat(input, rows, config_.hidden, "B input");
      Mat dx = op.kind == ir::OpKind::BW ? st.backward(op.mb, op.slice, dy, progress_of(op, st))
                                         : st.backward_input(op.mb, op.slice, dy);
      if (st.is_first()) return {};
      return to_buffer(dx, options_.bf16_wire);
    }
    case ir::OpKind::W:
      st.backward_weight(op.mb, op.slice, progress_of(op, st));
      return {};
    default:
      throw Error(fmt::format("{} is not a compute op", ir::to_string(op.kind)));
  }
}

Buffer CpuCompute::allocate(const TensorKey& key) {
  if (key.slice < 0 || key.slice + 1 >= static_cast<int>(offsets_.size()))
    throw Error(fmt::format("RECV of slice {}: the plan has {} slices", key.slice, offsets_.size() - 1));
  const int tokens = offsets_[static_cast<std::size_t>(key.slice) + 1] - offsets_[static_cast<std::size_t>(key.slice)];
  return host_buffer(static_cast<std::int64_t>(config_.micro_batch) * tokens * config_.hidden);
}

namespace {
// A view of part `index` of `count` of a stage's flat vector: the stage owns the memory,
// valid until end_step (see Compute::grad_bucket).
Buffer part_view(std::vector<double>& v, int chunk, int index, int count, const char* what) {
  if (count < 1 || index < 0 || index >= count)
    throw Error(fmt::format("{} bucket {} of {} of chunk {}: out of range", what, index, count, chunk));
  const auto [begin, end] = part_range(static_cast<std::int64_t>(v.size()), index, count);
  Buffer b;
  b.data = std::shared_ptr<void>(v.data() + begin, [](void*) {});
  b.elements = end - begin;
  b.dtype = DType::F64;
  return b;
}
}  // namespace

Buffer CpuCompute::grad_bucket(int chunk, int index, int count) {
  if (chunk < 0 || chunk >= chunks())
    throw Error(fmt::format("gradient bucket {} of {} of chunk {}: out of range", index, count, chunk));
  return part_view(chunk_stage(chunk).grads(), chunk, index, count, "gradient");
}

Buffer CpuCompute::param_bucket(int chunk, int index, int count) {
  if (chunk < 0 || chunk >= chunks())
    throw Error(fmt::format("parameter bucket {} of {} of chunk {}: out of range", index, count, chunk));
  return part_view(chunk_stage(chunk).params(), chunk, index, count, "parameter");
}

// ---------------------------------------------------------------------------------
// 1-bit Adam (tdpipe/exec/onebit.hpp)

OnebitMessages CpuCompute::onebit_compress(int chunk, int index, int count, int members) {
  const auto n = chunk >= 0 && chunk < chunks() ? static_cast<std::int64_t>(chunk_stage(chunk).params().size()) : 0;
  const auto [first, last] = onebit_bucket_range(n, chunk, chunks(), index, count, members);
  GptStage& st = chunk_stage(chunk);
  auto& error = worker_error_[static_cast<std::size_t>(chunk)];
  if (error.empty()) error.assign(static_cast<std::size_t>(n), 0.0);
  double* m = st.moments(1).data() + first;
  const double* g = st.grads().data() + first;
  const double b1 = options_.adam.beta1;
  // The gradients carry the 1/d of the data-parallel mean: the replica's own mean is d·g.
  for (std::int64_t k = 0; k < last - first; ++k) m[k] = b1 * m[k] + (1 - b1) * members * g[k];
  const std::int64_t block = onebit::block_bytes(last - first, members);
  OnebitMessages out{host_bytes(members * block), host_bytes(members * block), host_bytes(members * block)};
  for (int j = 0; j < members; ++j) {
    const auto [s0, s1] = part_range(last - first, owned_segment(j, members), members);
    onebit::compress(m + s0, error.data() + first + s0, s1 - s0, out.sent.as<std::uint8_t>() + j * block);
  }
  return out;
}

void CpuCompute::onebit_serve(int chunk, int index, int count, int member, int members, OnebitMessages& msg) {
  const auto n = chunk >= 0 && chunk < chunks() ? static_cast<std::int64_t>(chunk_stage(chunk).params().size()) : 0;
  const auto [first, last] = onebit_bucket_range(n, chunk, chunks(), index, count, members);
  const std::int64_t block = onebit::block_bytes(last - first, members);
  check_onebit_messages(msg, members * block);
  const auto [offset, owned] = owned_segments_offset(n, index, count, member, members);
  auto& error = server_error_[static_cast<std::size_t>(chunk)];
  if (error.empty()) error.assign(static_cast<std::size_t>(owned), 0.0);
  const int seg = owned_segment(member, members);
  const auto [s0, s1] = part_range(last - first, seg, members);
  std::vector<double> mean(static_cast<std::size_t>(s1 - s0), 0.0);
  for (int i = 0; i < members; ++i)
    onebit::expand(msg.received.as<std::uint8_t>() + i * block, s1 - s0, 1.0 / members, mean.data(), true);
  onebit::compress(mean.data(), error.data() + offset, s1 - s0, msg.gathered.as<std::uint8_t>() + seg * block);
}

void CpuCompute::onebit_expand(int chunk, int index, int count, int members, const OnebitMessages& msg) {
  const auto n = chunk >= 0 && chunk < chunks() ? static_cast<std::int64_t>(chunk_stage(chunk).params().size()) : 0;
  const auto [first, last] = onebit_bucket_range(n, chunk, chunks(), index, count, members);
  GptStage& st = chunk_stage(chunk);
  const std::int64_t block = onebit::block_bytes(last - first, members);
  check_onebit_messages(msg, members * block);
  double* m = st.moments(1).data() + first;
  const double* v = st.moments(2).data() + first;  // the momentum mask (onebit.hpp)
  for (int s = 0; s < members; ++s) {
    const auto [s0, s1] = part_range(last - first, s, members);
    onebit::expand(msg.gathered.as<std::uint8_t>() + s * block, s1 - s0, 1.0, m + s0, false, v + s0);
  }
}

// ---------------------------------------------------------------------------------
// Fabric

struct CpuFabric::Pending {
  P2POp* op = nullptr;
  Batch* batch = nullptr;  ///< its poster's
  int self = 0;
  bool done = false;  ///< a SEND: acknowledged; a RECV: received and its checksum checked
  std::chrono::steady_clock::time_point done_at;
  // A SEND:
  std::uint32_t crc = 0;    ///< of the payload, by the sender
  int message = 0;          ///< its number on its channel this step (1-based)
  int attempts = 0;         ///< deliveries so far
  Pending* to = nullptr;    ///< the RECV it was matched with, until acknowledged
  bool resend = false;      ///< the last delivery failed: deliver again at resend_at
  std::chrono::steady_clock::time_point failed_at, resend_at;
  std::string why;          ///< of the failure: "lost", "corrupt"
  // A RECV:
  Pending* from = nullptr;  ///< the SEND it was matched with, until acknowledged
  bool delivered = false;   ///< payload in the buffer, checksum not yet checked
  bool checking = false;    ///< a poster checks the checksum, outside the lock
};

/// One posted batch: its ops and their Pendings (stable addresses while posted).
struct CpuFabric::Batch {
  int comm = 0, self = 0;
  std::span<P2POp> ops;
  std::vector<Pending> mine;
  std::function<void()> wake;  ///< called under the lock when the batch may have progressed

  Batch(int comm_, int self_, std::span<P2POp> ops_, std::function<void()> wake_)
      : comm(comm_), self(self_), ops(ops_), mine(ops_.size()), wake(std::move(wake_)) {}
  void notify() const {
    if (wake) wake();
  }
};

namespace {
std::uint32_t crc32_of(const Buffer& b) { return exec::crc32_of(b.data.get(), static_cast<std::size_t>(b.bytes())); }
}  // namespace

std::chrono::steady_clock::duration CpuFabric::backoff(int attempt) const {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(retry_timeout_ * std::ldexp(1.0, std::max(0, attempt - 1))));
}

void CpuFabric::begin_step(int step) {
  std::lock_guard lock(control_->mutex());
  step_ = step;
  sent_.clear();
}

std::vector<RetryRecord> CpuFabric::take_retries() {
  std::lock_guard lock(control_->mutex());
  return std::exchange(retries_, {});
}

// Under the lock: one delivery of `s` to its matched RECV, as the (injected) wire does it.
void CpuFabric::deliver(Pending& s, std::chrono::steady_clock::time_point now) {
  Pending& r = *s.to;
  ++s.attempts;
  const FaultSpec* f = faults_ ? faults_->at_delivery(s.self, r.self, step_, s.message, s.attempts) : nullptr;
  if (f && f->kind == FaultSpec::Kind::Drop) {  // lost on the wire: nobody sees an acknowledgement
    s.resend = true;
    s.why = "lost";
    s.failed_at = now;
    s.resend_at = now + backoff(s.attempts);
  } else {
    const auto bytes = static_cast<std::size_t>(s.op->buffer.bytes());
    std::memcpy(r.op->buffer.data.get(), s.op->buffer.data.get(), bytes);
    if (f && f->kind == FaultSpec::Kind::Corrupt && bytes > 0)  // one bit flipped in flight
      static_cast<std::uint8_t*>(r.op->buffer.data.get())[(static_cast<std::size_t>(s.message) * 7919) % bytes] ^= 0x10;
    moved_[s.batch->comm] += s.op->buffer.bytes();
    r.delivered = true;
  }
  s.batch->notify();
  r.batch->notify();
}

// Under the lock: registers the batch's ops on their channels and matches the heads of
// each touched channel in posting order (NCCL: per peer, FIFO), delivering each match.
void CpuFabric::enter(Batch& b) {
  if (b.comm < kP2P || b.comm > kWorld) throw Error(fmt::format("fabric: no communicator {}", b.comm));
  if (control_->failed()) throw Aborted{};
  std::vector<std::tuple<int, int, int>> touched;
  for (std::size_t i = 0; i < b.ops.size(); ++i) {
    P2POp& op = b.ops[i];
    Pending& p = b.mine[i];
    if (op.kind == ir::OpKind::SEND) {
      auto key = std::make_tuple(b.comm, b.self, op.peer);
      p.message = ++sent_[key];
      sends_[key].push_back(&p);
      touched.push_back(key);
    } else if (op.kind == ir::OpKind::RECV) {
      auto key = std::make_tuple(b.comm, op.peer, b.self);
      recvs_[key].push_back(&p);
      touched.push_back(key);
    } else {
      throw Error(fmt::format("transport: {} is not SEND or RECV", ir::to_string(op.kind)));
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (const auto& key : touched) {
    auto& sq = sends_[key];
    auto& rq = recvs_[key];
    while (!sq.empty() && !rq.empty()) {
      Pending* s = sq.front();
      Pending* r = rq.front();
      const P2POp& so = *s->op;
      P2POp& ro = *r->op;
      if (!(so.key == ro.key) || so.buffer.bytes() != ro.buffer.bytes() || so.buffer.dtype != ro.buffer.dtype)
        throw Error(fmt::format(
            "rank {} {} ({} bytes) was matched with rank {} {} ({} bytes): the k-th SEND "
            "between two ranks must carry the tensor of the k-th RECV",
            s->self, so.label, so.buffer.bytes(), r->self, ro.label, ro.buffer.bytes()));
      s->to = r;
      r->from = s;
      sq.erase(sq.begin());
      rq.erase(rq.begin());
      deliver(*s, now);
    }
  }
}

// Under the lock (released while checksums are computed): does the work due on the
// batch's unacknowledged pairs — a retry whose time came, the checksum of a delivered
// payload — whichever side of the pair this poster is. True once all of it completed.
bool CpuFabric::progress(Batch& b, std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point& next) {
  if (control_->failed()) throw Aborted{};
  // A transfer out of retries, said while the lock is held (the SEND may be the peer's,
  // gone once the lock is released) and thrown once no check is claimed.
  std::string failed;
  auto give_up = [&](const Pending& s) {
    if (failed.empty())
      failed = fmt::format("transfer {} from rank {} to rank {} ({} bytes) failed {} times ({}): more than {} "
                           "retries, given up", s.op->label, s.self, s.op->peer, s.op->buffer.bytes(), s.attempts,
                           s.why, max_retries_);
  };
  const auto t = std::chrono::steady_clock::now();
  std::vector<Pending*> check;  // RECVs whose payload this poster checks
  for (Pending& p : b.mine) {
    if (p.done) continue;
    Pending* s = p.op->kind == ir::OpKind::SEND ? (p.to ? &p : nullptr) : p.from;  // the pair's SEND, once matched
    if (!s) continue;
    if (s->resend) {
      if (s->attempts > max_retries_) {
        give_up(*s);
        continue;
      }
      if (t >= s->resend_at) {
        s->resend = false;
        retries_.push_back({b.comm, s->self, s->to->self, step_, s->attempts, s->why, s->op->label,
                            s->op->buffer.bytes(), s->failed_at, t});
        deliver(*s, t);
      } else {
        next = std::min(next, s->resend_at);
      }
    }
    Pending* r = s->to;
    if (r->delivered && !r->checking) {
      r->delivered = false;
      r->checking = true;
      check.push_back(r);
    }
  }
  if (!check.empty()) {
    std::vector<std::uint32_t> got(check.size());
    lock.unlock();
    for (std::size_t i = 0; i < check.size(); ++i) got[i] = crc32_of(check[i]->op->buffer);
    lock.lock();
    const auto seen = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < check.size(); ++i) {
      Pending& r = *check[i];
      r.checking = false;
      if (!r.from) continue;  // the sender withdrew (the run is stopping)
      Pending& s = *r.from;
      if (got[i] == s.crc) {
        r.done = s.done = true;  // acknowledged: either side may now return and free its Pending
        r.done_at = s.done_at = seen;
        r.from = nullptr;
        s.to = nullptr;
      } else {
        s.why = "corrupt";
        s.resend = true;
        s.failed_at = seen;
        s.resend_at = seen + backoff(s.attempts);
        next = std::min(next, s.resend_at);
        if (s.attempts > max_retries_) give_up(s);
      }
      s.batch->notify();
      r.batch->notify();
    }
    checked_.notify_all();
  }
  if (!failed.empty()) throw RankFault(failed);
  return std::all_of(b.mine.begin(), b.mine.end(), [](const Pending& p) { return p.done; });
}

// Under the lock, on leaving early (a mismatch, an escalated transfer, an abort): nothing
// may point at the batch's Pendings any more; a peer left matched with them waits for
// the abort.
void CpuFabric::withdraw(Batch& b, std::unique_lock<std::mutex>& lock) {
  auto checking = [&] {
    return std::any_of(b.mine.begin(), b.mine.end(), [](const Pending& p) { return p.checking; });
  };
  while (checking()) checked_.wait(lock);  // another poster reads one of our buffers
  auto is_mine = [&](const Pending* p) { return p >= b.mine.data() && p < b.mine.data() + b.mine.size(); };
  for (auto* table : {&sends_, &recvs_})
    for (auto& [key, queue] : *table) std::erase_if(queue, is_mine);
  for (Pending& p : b.mine) {  // (an acknowledged pair is unlinked already: its peer may be gone)
    if (p.to) p.to->from = nullptr;
    if (p.from) p.from->to = nullptr;
    p.to = p.from = nullptr;
  }
}

namespace {
// Fills in each Pending of `b` (before the lock: the SENDs' checksums).
template <class B>
void prepare(B& b) {
  for (std::size_t i = 0; i < b.ops.size(); ++i) {
    b.mine[i].op = &b.ops[i];
    b.mine[i].batch = &b;
    b.mine[i].self = b.self;
    if (b.ops[i].kind == ir::OpKind::SEND) b.mine[i].crc = crc32_of(b.ops[i].buffer);
  }
}
}  // namespace

void CpuFabric::post(int comm, int self, std::span<P2POp> ops) {
  std::condition_variable cv;
  Batch b(comm, self, ops, [&cv] { cv.notify_all(); });
  prepare(b);
  std::unique_lock lock(control_->mutex());
  try {
    enter(b);
    while (true) {
      auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(RunControl::kAbortPollMs);
      if (progress(b, lock, next)) return;
      cv.wait_until(lock, next);
    }
  } catch (...) {
    withdraw(b, lock);
    throw;
  }
}

class CpuFabric::Request final : public P2PRequest {
 public:
  Request(CpuFabric& fabric, int comm, int self, std::vector<P2POp> ops, std::function<void()> wake)
      : fabric_(&fabric), owned_(std::move(ops)), b_(comm, self, owned_, std::move(wake)) {
    prepare(b_);
    std::unique_lock lock(fabric_->control_->mutex());
    auto next = std::chrono::steady_clock::time_point::max();
    progress(lock, next, true);  // and the checksums of what the posting delivered
  }
  ~Request() override {
    if (done_ || withdrawn_) return;
    std::unique_lock lock(fabric_->control_->mutex());
    fabric_->withdraw(b_, lock);
  }
  bool test(std::chrono::steady_clock::time_point& next) override {
    if (done_) return true;
    std::unique_lock lock(fabric_->control_->mutex());
    progress(lock, next, false);
    return done_;
  }
  bool op_done(std::size_t k, std::chrono::steady_clock::time_point& at) const override {
    if (!seen_[k]) return false;
    at = at_[k];
    return true;
  }

 private:
  // Under the lock: (enters the batch, then) progresses it and notes which pairs are
  // acknowledged, and when, for op_done to read without the lock; on an error the batch
  // is withdrawn.
  void progress(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point& next, bool enter) {
    try {
      if (enter) fabric_->enter(b_);
      done_ = fabric_->progress(b_, lock, next);
    } catch (...) {
      fabric_->withdraw(b_, lock);
      withdrawn_ = true;
      throw;
    }
    for (std::size_t k = 0; k < b_.mine.size(); ++k)
      if (b_.mine[k].done && !seen_[k]) {
        seen_[k] = 1;
        at_[k] = b_.mine[k].done_at;
      }
  }
  CpuFabric* fabric_;
  std::vector<P2POp> owned_;
  Batch b_;
  std::vector<char> seen_ = std::vector<char>(owned_.size(), 0);
  std::vector<std::chrono::steady_clock::time_point> at_ = std::vector<std::chrono::steady_clock::time_point>(owned_.size());
  bool done_ = false, withdrawn_ = false;
};

std::unique_ptr<P2PRequest> CpuFabric::start(int comm, int self, std::vector<P2POp> ops, std::function<void()> wake) {
  return std::make_unique<Request>(*this, comm, self, std::move(ops), std::move(wake));
}

std::int64_t CpuFabric::bytes_moved(int comm) {
  if (comm < kP2P || comm > kWorld) throw Error(fmt::format("fabric: no communicator {}", comm));
  std::lock_guard lock(control_->mutex());
  return moved_[comm];
}

std::vector<P2POp> CpuTransport::world_ops(std::span<P2POp> batch) const {
  std::vector<P2POp> world(batch.begin(), batch.end());
  for (const auto& op : world) check_p2p_op(op, stages_);  // all checked before any is posted
  for (auto& op : world) op.peer = replica_ * stages_ + op.peer;
  return world;
}

void CpuTransport::post(std::span<P2POp> batch) {
  std::vector<P2POp> world = world_ops(batch);
  fabric_->post(CpuFabric::kP2P, replica_ * stages_ + rank_, world);
}

std::unique_ptr<P2PRequest> CpuTransport::start(std::span<P2POp> batch, std::function<void()> wake) {
  return fabric_->start(CpuFabric::kP2P, replica_ * stages_ + rank_, world_ops(batch), std::move(wake));
}

void CpuTransport::all_reduce(const Buffer& buffer, int tag) {
  ring(buffer, tag, true);
  ring(buffer, tag, false);
}

void CpuTransport::reduce_scatter(const Buffer& buffer, int tag) { ring(buffer, tag, true); }

void CpuTransport::all_gather(const Buffer& buffer, int tag) { ring(buffer, tag, false); }

void CpuTransport::all_to_all(const Buffer& send, const Buffer& recv, int tag) {
  const int n = data_;
  if (send.empty() || recv.empty() || send.bytes() != recv.bytes() || send.bytes() % n != 0)
    throw Error(fmt::format("CPU all-to-all: send {} and receive {} bytes; expected equal sizes of {} blocks",
                            send.bytes(), recv.bytes(), n));
  const std::int64_t block = send.bytes() / n;
  const auto* from = static_cast<const std::uint8_t*>(send.data.get());
  auto* to = static_cast<std::uint8_t*>(recv.data.get());
  std::memcpy(to + replica_ * block, from + replica_ * block, static_cast<std::size_t>(block));
  if (n <= 1) return;
  std::vector<P2POp> ops;
  for (int j = 0; j < n; ++j) {
    if (j == replica_) continue;
    P2POp s;
    s.kind = ir::OpKind::SEND;
    s.peer = j * stages_ + rank_;
    s.key = TensorKey{ir::OpKind::COMPRESSED_ALLREDUCE, tag, replica_, j};
    s.buffer = host_bytes(block);
    std::memcpy(s.buffer.data.get(), from + j * block, static_cast<std::size_t>(block));
    s.label = fmt::format("1-bit all-to-all(b{}) send to replica {}", tag, j);
    ops.push_back(std::move(s));
    P2POp r;
    r.kind = ir::OpKind::RECV;
    r.peer = j * stages_ + rank_;
    r.key = TensorKey{ir::OpKind::COMPRESSED_ALLREDUCE, tag, j, replica_};
    r.buffer = host_bytes(block);
    r.label = fmt::format("1-bit all-to-all(b{}) receive from replica {}", tag, j);
    ops.push_back(std::move(r));
  }
  fabric_->post(CpuFabric::kDP, replica_ * stages_ + rank_, ops);
  for (const P2POp& r : ops)
    if (r.kind == ir::OpKind::RECV)
      std::memcpy(to + r.key.mb * block, r.buffer.data.get(), static_cast<std::size_t>(block));  // key.mb: the sender
}

void CpuTransport::agree_overflow(std::span<std::uint8_t> flags, int tag) {
  const int world = stages_ * data_, self = replica_ * stages_ + rank_;
  if (world <= 1) return;
  const auto n = static_cast<std::int64_t>(flags.size());
  std::vector<P2POp> ops;
  for (int w = 0; w < world; ++w) {
    if (w == self) continue;
    P2POp s;
    s.kind = ir::OpKind::SEND;
    s.peer = w;
    s.key = TensorKey{ir::OpKind::OPT, tag, self, w};
    s.buffer = host_bytes(n);
    std::memcpy(s.buffer.data.get(), flags.data(), static_cast<std::size_t>(n));
    s.label = fmt::format("overflow flags of step {} to rank {}", tag, w);
    ops.push_back(std::move(s));
    P2POp r;
    r.kind = ir::OpKind::RECV;
    r.peer = w;
    r.key = TensorKey{ir::OpKind::OPT, tag, w, self};
    r.buffer = host_bytes(n);
    r.label = fmt::format("overflow flags of step {} from rank {}", tag, w);
    ops.push_back(std::move(r));
  }
  fabric_->post(CpuFabric::kWorld, self, ops);
  for (const P2POp& r : ops)
    if (r.kind == ir::OpKind::RECV)
      for (std::int64_t j = 0; j < n; ++j) flags[static_cast<std::size_t>(j)] |= r.buffer.as<std::uint8_t>()[j];
}

void CpuTransport::ring(const Buffer& buffer, int tag, bool reduce) {
  const int n = data_;
  if (n <= 1) return;
  // Sums need doubles; an all-gather copies any elements (1-bit Adam's packed bytes).
  if (buffer.dtype != DType::F64 && (reduce || buffer.dtype != DType::U8))
    throw Error("CPU data-parallel collective: expected doubles (or bytes to gather)");
  const std::int64_t es = dtype_bytes(buffer.dtype);
  auto* data = static_cast<std::uint8_t*>(buffer.data.get());
  const std::int64_t len = buffer.elements;
  auto seg_begin = [&](int s) { return part_range(len, s, n).first; };
  auto seg_len = [&](int s) { const auto [b, e] = part_range(len, s, n); return e - b; };
  auto seg_bytes = [&](int s) { return static_cast<std::size_t>(seg_len(s) * es); };
  const int self = replica_ * stages_ + rank_;
  const int next = ((replica_ + 1) % n) * stages_ + rank_;
  const int prev = ((replica_ + n - 1) % n) * stages_ + rank_;
  const int i = replica_;
  const char* name = reduce ? "reduce-scatter" : "all-gather";
  auto fresh = [&](int s) { return buffer.dtype == DType::U8 ? host_bytes(seg_len(s)) : host_buffer(seg_len(s)); };
  auto exchange = [&](int step, int send_seg, int recv_seg) {
    P2POp ops[2];
    ops[0].kind = ir::OpKind::SEND;
    ops[0].peer = next;
    ops[0].key = TensorKey{ir::OpKind::ALLREDUCE, tag, step, send_seg};
    ops[0].buffer = fresh(send_seg);
    std::memcpy(ops[0].buffer.data.get(), data + seg_begin(send_seg) * es, seg_bytes(send_seg));
    ops[0].label = fmt::format("{}(b{}) ring step {} send to rank {}", name, tag, step, next);
    ops[1].kind = ir::OpKind::RECV;
    ops[1].peer = prev;
    ops[1].key = TensorKey{ir::OpKind::ALLREDUCE, tag, step, recv_seg};
    ops[1].buffer = fresh(recv_seg);
    ops[1].label = fmt::format("{}(b{}) ring step {} receive from rank {}", name, tag, step, prev);
    fabric_->post(CpuFabric::kDP, self, ops);
    return ops[1].buffer;
  };
  if (reduce) {
    // Reduce-scatter: after n − 1 steps, replica i holds the full sum of segment
    // i + 1 = owned_segment(i, n).
    for (int s = 0; s < n - 1; ++s) {
      const int send_seg = ((i - s) % n + n) % n;
      const int recv_seg = ((i - s - 1) % n + n) % n;
      Buffer got = exchange(s, send_seg, recv_seg);
      double* dst = buffer.as<double>() + seg_begin(recv_seg);
      const double* src = got.as<double>();
      for (std::int64_t k = 0; k < seg_len(recv_seg); ++k) dst[k] += src[k];
    }
    return;
  }
  // All-gather the owned segments around the ring.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = ((i + 1 - s) % n + n) % n;
    const int recv_seg = ((i - s) % n + n) % n;
    Buffer got = exchange(n - 1 + s, send_seg, recv_seg);
    std::memcpy(data + seg_begin(recv_seg) * es, got.data.get(), seg_bytes(recv_seg));
  }
}

}  // namespace tdpipe::exec::cpu
