// cuda_compute.cpp — CudaCompute (GptStageCuda per chunk) and CudaClock (CUDA events).
#include "cuda_compute.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

#include "check.hpp"
#include "kernels.cuh"
#include "nvtx.hpp"
#include "tdpipe/exec/cuda/timeline.hpp"
#include "tdpipe/exec/onebit.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda {

CudaCompute::CudaCompute(const cpu::GptConfig& config, const ir::Plan& plan, int rank, int replica,
                         const cpu::Corpus& corpus, const cpu::TrainOptions& options, const DeviceContext& ctx,
                         RunControl* control)
    : config_(config),
      corpus_(&corpus),
      options_(options),
      ctx_(&ctx),
      control_(control),
      rank_(rank),
      replica_(replica),
      world_rank_(replica * plan.num_ranks() + rank),
      microbatches_(plan.microbatches),
      offsets_(cpu::slice_offsets(plan, config.seq)) {
  if (corpus.vocab() > config.vocab)
    throw Error("model.vocab = " + std::to_string(config.vocab) + " is smaller than the corpus's " +
                std::to_string(corpus.vocab()) + " characters");
  loss_scale_ = static_cast<float>(
      1.0 / (static_cast<double>(plan.data) * plan.microbatches * config.micro_batch * config.seq));
  scaler_ = make_loss_scaler(plan, static_cast<int>(offsets_.size()) - 1);
  if (options.bf16_wire && plan.scenario.model.dtype == "fp16")
    throw Error("bf16 activations between stages (--wire bf16) and model.dtype fp16: fp16 training sends fp32 "
                "(its overflow checks are per stored 16-bit tensor); use --wire fp32");
  wire_ = options.bf16_wire ? DType::BF16 : DType::F32;
  ctx.bind();
  for (int stage : plan.stage_of.at(static_cast<std::size_t>(rank)))
    stages_.emplace_back(config_, stage, plan.virtual_stages(), ctx.compute(), ctx.cublas(), &memory_,
                         plan.scenario.parallel.offload(), scaler_.has_value());
  loss_ = DeviceMemory(sizeof(double), ctx.compute(), true);
  // Recorded once here, so a wait for them before their first op's record is a no-op.
  opt_done_ = OwnedEvent::make();
  TDPIPE_CUDA_CHECK(cudaEventRecord(opt_done_.e, ctx.compute()));
  last_issued_.assign(stages_.size(), false);
  for (std::size_t c = 0; c < stages_.size(); ++c) {
    grads_done_.push_back(OwnedEvent::make());
    TDPIPE_CUDA_CHECK(cudaEventRecord(grads_done_.back().e, ctx.compute()));
  }
  if (options.cuda_graphs) {
    if (plan.scenario.parallel.offload())
      throw Error("--cuda-graphs on with parallel.param_offload: an offloaded block's weights arrive at new "
                  "addresses every step, which a graph cannot follow; run with --cuda-graphs off");
    graphs_.emplace(ctx.compute());  // (cuBLAS has its workspace: DeviceContext)
  }
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.compute()));
  speed_ = cpu::rank_speed_of(options, rank);
}

namespace {
std::vector<double> download_floats(const float* device, std::size_t n, cudaStream_t stream) {
  std::vector<float> host(n);
  if (n > 0) {
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    TDPIPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return {host.begin(), host.end()};
}
void upload_floats(float* device, const std::vector<double>& values, cudaStream_t stream) {
  const std::vector<float> host(values.begin(), values.end());
  if (host.empty()) return;
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(stream));
}
}  // namespace

RankCheckpoint CudaCompute::checkpoint() {
  ctx_->bind();
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx_->dp()));  // 1-bit Adam's kernels run there
  RankCheckpoint out;
  out.world_rank = world_rank_;
  auto errors = [&](const std::vector<DeviceMemory>& e, int ch) {
    const auto c = static_cast<std::size_t>(ch);
    if (c >= e.size() || e[c].empty()) return std::vector<double>();
    return download_floats(e[c].as<float>(), e[c].bytes() / sizeof(float), ctx_->dp());
  };
  for (int ch = 0; ch < chunks(); ++ch) {
    GptStageCuda& st = chunk_stage(ch);
    out.arrays.emplace_back("c" + std::to_string(ch) + ".params", st.download_flat(0));
    out.arrays.emplace_back("c" + std::to_string(ch) + ".m1", st.download_flat(1));
    out.arrays.emplace_back("c" + std::to_string(ch) + ".m2", st.download_flat(2));
    out.arrays.emplace_back("c" + std::to_string(ch) + ".worker_error", errors(worker_error_, ch));
    out.arrays.emplace_back("c" + std::to_string(ch) + ".server_error", errors(server_error_, ch));
  }
  if (scaler_) out.loss_scale = scaler_->state();
  return out;
}

void CudaCompute::restore(const RankCheckpoint& state) {
  if (state.world_rank != world_rank_)
    throw Error("restore: a checkpoint of world rank " + std::to_string(state.world_rank) + " given to world rank " +
                std::to_string(world_rank_));
  if (state.arrays.size() != static_cast<std::size_t>(5 * chunks()))
    throw Error("restore: world rank " + std::to_string(world_rank_) + " has " + std::to_string(chunks()) +
                " chunks, its checkpoint " + std::to_string(state.arrays.size()) + " arrays (5 per chunk)");
  ctx_->bind();
  std::size_t i = 0;
  for (int ch = 0; ch < chunks(); ++ch) {
    GptStageCuda& st = chunk_stage(ch);
    const auto n = static_cast<std::size_t>(st.parameter_count());
    auto next = [&](const char* what, std::size_t size) -> const std::vector<double>& {
      const auto& [name, values] = state.arrays[i++];
      const std::string want = "c" + std::to_string(ch) + "." + what;
      if (name != want || (size > 0 && values.size() != size))
        throw Error("restore: world rank " + std::to_string(world_rank_) + ": the checkpoint's " + name + " (" +
                    std::to_string(values.size()) + " values) is not chunk " + std::to_string(ch) + "'s " + what +
                    " (" + std::to_string(size) + " values)");
      return values;
    };
    st.upload_flat(0, next("params", n));  // the bf16 weights follow
    st.upload_flat(1, next("m1", n));
    st.upload_flat(2, next("m2", n));
    // The error feedback: sized when first used; empty in the checkpoint until then.
    for (auto* errors : {&worker_error_, &server_error_}) {
      const auto& values = next(errors == &worker_error_ ? "worker_error" : "server_error", 0);
      if (errors->size() <= static_cast<std::size_t>(ch)) errors->resize(static_cast<std::size_t>(ch) + 1);
      DeviceMemory& e = (*errors)[static_cast<std::size_t>(ch)];
      e = values.empty() ? DeviceMemory() : DeviceMemory(values.size() * sizeof(float), ctx_->dp());
      upload_floats(e.as<float>(), values, ctx_->dp());
    }
  }
  if (scaler_ && !state.loss_scale.scales.empty()) scaler_->set_state(state.loss_scale);
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx_->compute()));
}

CudaCompute::~CudaCompute() {
  cudaSetDevice(ctx_->device());
  cudaStreamSynchronize(ctx_->compute());
  for (auto& chunk : marks_)
    for (TailMark& m : chunk) cudaEventDestroy(m.event);
}

void CudaCompute::mark_final_tail(int chunk, std::int64_t tail) {
  const auto c = static_cast<std::size_t>(chunk);
  std::lock_guard lock(marks_mu_);
  if (marks_.size() <= c) {
    marks_.resize(c + 1);
    marks_used_.resize(c + 1, 0);
  }
  auto& marks = marks_[c];
  if (marks_used_[c] == marks.size()) {
    TailMark m;
    TDPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&m.event, cudaEventDisableTiming));
    marks.push_back(m);
  }
  TailMark& m = marks[marks_used_[c]++];
  m.tail = tail;
  record_event(m.event, ctx_->compute());
}

void CudaCompute::wait_final(int chunk, std::int64_t first) {
  ctx_->bind();
  const auto c = static_cast<std::size_t>(chunk);
  const std::int64_t n = chunk_stage(chunk).parameter_count();
  cudaEvent_t event = grads_done_.at(c).e;  // every gradient op of the chunk, behind its end mark
  {
    // A part's mark only for a bucket that starts while the chunk's last gradient op is
    // still being issued (overlap_grad_reduce); once that op is through issued(), the
    // whole op's event — so a bucket that waits for the op is timed after its end.
    std::lock_guard lock(marks_mu_);
    if (c < marks_.size() && !last_issued_.at(c))
      for (std::size_t k = 0; k < marks_used_[c]; ++k)
        if (marks_[c][k].tail >= n - first) {
          event = marks_[c][k].event;  // the last gradient op, as far as it covers [first, n)
          break;
        }
  }
  // The dp stream waits; a loopback peer's dp stream that reads these gradients waits
  // for this one (LoopbackFabric::collective).
  TDPIPE_CUDA_CHECK(cudaStreamWaitEvent(ctx_->dp(), event, 0));
}

const CudaCompute::DeviceBatch& CudaCompute::micro_batch(int mb) const {
  const auto it = batches_.find(mb);
  if (it == batches_.end())
    throw Error("micro-batch " + std::to_string(mb) + ": rank " + std::to_string(rank_) +
                " holds neither the first nor the last stage, and has no data");
  return it->second;
}

void CudaCompute::upload_batches() {
  for (int mb = 0; mb < microbatches_; ++mb) {
    cpu::MicroBatch host = cpu::load_micro_batch(*corpus_, options_.data_seed, step_, replica_, microbatches_, mb,
                                                 config_.micro_batch, config_.seq);
    std::vector<int> tokens, targets;
    // Rows of exactly seq ids, b of them (the kernels index them as b × seq).
    auto append = [&](std::vector<int>& to, const std::vector<int>& row) {
      to.insert(to.end(), row.begin(), row.begin() + std::min<std::ptrdiff_t>(std::ssize(row), config_.seq));
    };
    for (const auto& row : host.tokens) append(tokens, row);
    for (const auto& row : host.targets) append(targets, row);
    // Both ids index device tables (embedding rows, logits columns): a bad one would
    // read past them in a kernel, so it is refused here, on the host.
    for (const auto* ids : {&tokens, &targets})
      for (int t : *ids)
        if (t < 0 || t >= config_.vocab)
          throw Error(std::string(ids == &tokens ? "token" : "target") + " id " + std::to_string(t) +
                      " outside the vocabulary of " + std::to_string(config_.vocab));
    if (static_cast<int>(tokens.size()) != config_.micro_batch * config_.seq ||
        static_cast<int>(targets.size()) != config_.micro_batch * config_.seq)
      throw Error("micro-batch " + std::to_string(mb) + ": expected " + std::to_string(config_.micro_batch) + " × " +
                  std::to_string(config_.seq) + " token and target ids");
    // Each micro-batch's ids at the same addresses every step (an op's graph reads them).
    DeviceBatch& b = batches_[mb];
    if (b.tokens.empty()) {
      b.tokens = DeviceMemory(tokens.size() * sizeof(int), ctx_->compute());
      b.targets = DeviceMemory(targets.size() * sizeof(int), ctx_->compute());
    }
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(b.tokens.get(), tokens.data(), tokens.size() * sizeof(int),
                                      cudaMemcpyHostToDevice, ctx_->compute()));
    TDPIPE_CUDA_CHECK(cudaMemcpyAsync(b.targets.get(), targets.data(), targets.size() * sizeof(int),
                                      cudaMemcpyHostToDevice, ctx_->compute()));
    // (Pageable host memory: each copy is staged before the call returns, so the
    // vectors may go; begin_step waits for the stream once, at its end. The step before
    // read them on this stream.)
  }
}

void CudaCompute::begin_step(int step) {
  ctx_->bind();
  step_ = step;
  if (std::any_of(stages_.begin(), stages_.end(), [](const GptStageCuda& s) { return s.is_first() || s.is_last(); }))
    upload_batches();
  TDPIPE_CUDA_CHECK(cudaMemsetAsync(loss_.get(), 0, sizeof(double), ctx_->compute()));
  {
    std::lock_guard lock(marks_mu_);
    std::fill(marks_used_.begin(), marks_used_.end(), 0);
    last_issued_.assign(stages_.size(), false);
  }
  for (auto& s : stages_) {
    if (gathered_) s.refresh_bf16_weights();  // the all-gather wrote other replicas' parts
    if (scaler_) s.set_loss_scales(scaler_->scales());
    s.begin_step();
  }
  gathered_ = false;
  const auto& inject = options_.inject_overflow;
  // An injected overflow is a host copy into the op: that step runs without graphs.
  eager_step_ = inject.step == step && inject.rank == world_rank_ && !stages_.empty();
  if (eager_step_) stages_.front().inject_overflow(inject.slice);
  if (graphs_) graphs_->begin_step();
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx_->compute()));
}

std::vector<std::uint8_t> CudaCompute::overflow_flags() const {
  if (!scaler_) return {};
  ctx_->bind();
  std::vector<std::uint8_t> flags(static_cast<std::size_t>(scaler_->slices()), 0);
  for (const GptStageCuda& s : stages_) {
    const std::vector<std::uint8_t> mine = s.overflowed();
    for (std::size_t j = 0; j < flags.size() && j < mine.size(); ++j) flags[j] |= mine[j];
  }
  return flags;
}

void CudaCompute::set_loss_scale_state(const LossScaleState& state) {
  if (!scaler_) throw Error("a loss scaler state to continue from, but the run is not fp16 (model.dtype)");
  scaler_->set_state(state);
}

double CudaCompute::end_step() {
  ctx_->bind();
  double loss = 0;
  TDPIPE_CUDA_CHECK(cudaMemcpyAsync(&loss, loss_.get(), sizeof(double), cudaMemcpyDeviceToHost, ctx_->compute()));
  TDPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx_->compute()));
  return loss;
}

Buffer CudaCompute::run(const ComputeOp& op, Buffer input) {
  ctx_->bind();
  ir::Op named;
  named.kind = op.kind;
  named.mb = op.mb;
  named.chunk = op.chunk;
  named.slice = op.slice;
  const std::string name = trace_name(named);
  NvtxRange range(std::string("r") + std::to_string(rank_) + " " + name);
  cudaStream_t stream = ctx_->compute();
  // Adam's step count: the steps it took (skipped fp16 steps do not count).
  const int t = step_ + 1 - (scaler_ ? scaler_->state().skipped : 0);
  bool skip = false;
  if (op.kind == ir::OpKind::OPT && scaler_) {
    if (!op.overflow)
      throw Error("OPT of step " + std::to_string(step_) + " on rank " + std::to_string(rank_) +
                  ": fp16 training needs the overflow flags every rank agreed on");
    skip = scaler_->update(*op.overflow);
  }
  if (op.kind == ir::OpKind::OPT && op.gate) {
    // Parameter offload: each block's state arrives by its LOAD, is stepped on the device
    // and written back by its OFFLOAD (after the step's kernels); the rest is resident.
    // A skipped step still takes each block (its OFFLOAD writes it back unchanged).
    step_gated_blocks(
        *op.gate, chunks(), [&](int c) { return chunk_stage(c).blocks(); },
        [&](int c, int b) { chunk_stage(c).adam_block(options_.adam, t, b, skip); },
        [&](int c) {
          if (!skip) chunk_stage(c).adam_resident(options_.adam, t);
        });
    return {};
  }
  if (op.kind == ir::OpKind::OPT && skip) return {};
  if (op.kind == ir::OpKind::OPT) {
    for (int c = 0; c < chunks(); ++c) {
      GptStageCuda& s = chunk_stage(c);
      if (op.variance_frozen_at > 0) {
        s.adam_frozen_variance(options_.adam, t, op.variance_frozen_at);
        continue;
      }
      if (!op.shard) {
        s.adam(options_.adam, t);
        continue;
      }
      for (const auto& [b, e] : owned_ranges(s.parameter_count(), op.shard->buckets(c), *op.shard))
        s.adam(options_.adam, t, b, e);
      gathered_ = true;
    }
    return {};
  }
  if (op.chunk < 0 || op.chunk >= chunks())
    throw Error("chunk " + std::to_string(op.chunk) + " out of range (this rank has " + std::to_string(chunks()) + ")");
  if (op.slice < 0 || op.slice + 1 >= static_cast<int>(offsets_.size()))
    throw Error("slice " + std::to_string(op.slice) + " out of range (the plan has " +
                std::to_string(offsets_.size() - 1) + ")");
  if (op.mb < 0 || op.mb >= microbatches_)
    throw Error("micro-batch " + std::to_string(op.mb) + " out of range (m = " + std::to_string(microbatches_) + ")");
  // A slower device (rank_speed < 1): the op's time stretched to 1/speed by idling the
  // host after it, as the CPU backend does (such a rank waits for each op's kernels).
  const auto host_start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration waited{0};  // parameter offload's waits for a LOAD
  use_on(input, stream);  // after its producer; freed after this op's kernels
  Buffer out;
  if (graphs_ && !eager_step_) {
    // What the op's graph bakes in beyond the addresses earlier ops of the step produce.
    std::vector<std::uint64_t> signature{reinterpret_cast<std::uintptr_t>(input.data.get()),
                                         static_cast<std::uint64_t>(input.elements)};
    if (const auto it = batches_.find(op.mb); it != batches_.end())
      for (const DeviceMemory* ids : {&it->second.tokens, &it->second.targets})
        signature.push_back(reinterpret_cast<std::uintptr_t>(ids->get()));
    if (scaler_)
      for (double scale : scaler_->scales()) signature.push_back(std::bit_cast<std::uint64_t>(scale));
    graphs_->run({static_cast<int>(op.kind), op.mb, op.chunk, op.slice}, std::move(signature),
                 [&] { out = issue(op, name, std::move(input), waited); }, name);
  } else {
    out = issue(op, name, std::move(input), waited);
  }
  if (speed_ != 1) {
    wait_stream(stream, control_);
    cpu::stretch_to_speed(std::chrono::steady_clock::now() - host_start - waited, speed_);
  }
  return out;
}

Buffer CudaCompute::issue(const ComputeOp& op, const std::string& name, Buffer input,
                          std::chrono::steady_clock::duration& waited) {
  cudaStream_t stream = ctx_->compute();
  GptStageCuda& st = chunk_stage(op.chunk);
  // Parameter offload: each block waits at the gate for its LOAD, and its copy is freed
  // (in stream order) once its kernels are issued. Waits are not the op's work.
  int next_block = 0;
  struct Hooks {
    GptStageCuda& st;
    bool gated;
    ~Hooks() {
      if (!gated) return;
      st.set_block_hooks({}, {});
      try {
        st.release_held();  // an op that threw half-way through its blocks
      } catch (...) {
      }
    }
  } hooks{st, op.gate != nullptr};
  if (op.gate)
    st.set_block_hooks(
        [&, gate = op.gate, chunk = op.chunk](int b) {
          const auto t0 = std::chrono::steady_clock::now();
          gate->acquire(next_block++, chunk, b);
          waited += std::chrono::steady_clock::now() - t0;
          st.take_block(b);
        },
        [&, gate = op.gate](int b) {
          st.release_block(b);
          gate->release(next_block - 1);
        });
  const int t0 = offsets_[static_cast<std::size_t>(op.slice)];
  const int t1 = offsets_[static_cast<std::size_t>(op.slice) + 1];
  const std::int64_t elements = std::int64_t(config_.micro_batch) * (t1 - t0) * config_.hidden;
  auto check_input = [&](const char* what) {
    if (input.empty() || input.elements != elements || input.dtype != wire_)
      throw Error(std::string(what) + " of " + name + ": got a buffer of " +
                  std::to_string(input.elements) + " elements, expected " + std::to_string(elements) +
                  (wire_ == DType::BF16 ? " bf16" : " fp32") + " values on the GPU");
    if (wire_ == DType::BF16) {  // widened for the stage's fp32 residual stream
      Buffer wide = device_buffer(elements, stream);
      if (issuing()) kernels::to_f32(input.as<kernels::bf16>(), wide.as<float>(), elements, stream);
      input = std::move(wide);
    }
  };
  // What crosses to another stage: the fp32 output, or (bf16 wire) it rounded to bf16.
  auto narrow = [&](Buffer wide) {
    if (wire_ != DType::BF16 || wide.empty()) return wide;
    Buffer b = device_buffer(elements, stream, DType::BF16);
    if (issuing()) kernels::to_16(wide.as<float>(), b.as<kernels::bf16>(), elements, stream);
    return b;
  };
  // The chunk's last gradient op: each part's gradients are marked final as issued, so
  // the dp thread can start a bucket while the rest still runs (overlap_grad_reduce). In
  // a graph, the mark is a record node and the dp thread hears of it once it is launched.
  std::function<void(std::int64_t)> final_tail;
  if (op.progress)
    final_tail = [this, &op, total = st.parameter_count()](std::int64_t tail) {
      mark_final_tail(op.chunk, tail);
      after_launch([&op, tail, total] { (*op.progress)(tail, total); });
    };
  Buffer out;
  switch (op.kind) {
    case ir::OpKind::F: {
      const DeviceBatch* data = (st.is_first() || st.is_last()) ? &micro_batch(op.mb) : nullptr;
      if (!st.is_first()) check_input("input");
      if (!st.is_last()) out = device_buffer(elements, stream);
      st.forward(op.mb, op.slice, t0, t1, st.is_first() ? nullptr : input.as<float>(),
                 st.is_last() ? nullptr : out.as<float>(), data ? data->tokens.as<int>() : nullptr,
                 data ? data->targets.as<int>() : nullptr, loss_scale_, loss_.as<double>());
      out = narrow(std::move(out));
      break;
    }
    case ir::OpKind::B:
    case ir::OpKind::BW: {
      if (!st.is_last()) check_input("gradient");
      if (!st.is_first()) out = device_buffer(elements, stream);
      st.backward_input(op.mb, op.slice, st.is_last() ? nullptr : input.as<float>(),
                        st.is_first() ? nullptr : out.as<float>());
      out = narrow(std::move(out));
      if (op.kind == ir::OpKind::BW) st.backward_weight(op.mb, op.slice, final_tail);
      break;
    }
    case ir::OpKind::W:
      st.backward_weight(op.mb, op.slice, final_tail);
      break;
    default:
      throw Error(std::string(ir::to_string(op.kind)) + " is not a compute op");
  }
  return out;
}

void CudaCompute::issued(const ComputeOp& op, const Buffer& out) {
  // The op's kernels (and the interpreter's end mark behind them) are in flight: what
  // the op hands on waits for this point of the compute stream on the device.
  cudaStream_t stream = ctx_->compute();
  if (!out.empty()) mark_ready(out, stream);
  if (op.kind == ir::OpKind::W || op.kind == ir::OpKind::BW) {
    TDPIPE_CUDA_CHECK(cudaEventRecord(grads_done_.at(static_cast<std::size_t>(op.chunk)).e, stream));
    if (op.progress) {  // the chunk's last gradient op: its buckets wait for the whole op now
      std::lock_guard lock(marks_mu_);
      last_issued_.at(static_cast<std::size_t>(op.chunk)) = true;
    }
  }
  if (op.kind == ir::OpKind::OPT) TDPIPE_CUDA_CHECK(cudaEventRecord(opt_done_.e, stream));
}

void CudaCompute::copy(const CopyOp& op) {
  ctx_->bind();
  if (op.chunk < 0 || op.chunk >= chunks())
    throw Error(std::string(ir::to_string(op.kind)) + " of chunk " + std::to_string(op.chunk) + ": this rank has " +
                std::to_string(chunks()) + " chunks");
  GptStageCuda& st = chunk_stage(op.chunk);
  if (op.kind == ir::OpKind::LOAD)
    st.load_block(op.layer, op.state, ctx_->copy());
  else if (op.kind == ir::OpKind::OFFLOAD && op.state)
    st.offload_block(op.layer, ctx_->copy());
  else
    throw Error(std::string(ir::to_string(op.kind)) + " of chunk " + std::to_string(op.chunk) + " layer " +
                std::to_string(op.layer) + ": expected a LOAD, or an OFFLOAD of optimizer state");
}

Buffer CudaCompute::allocate(const TensorKey& key) {
  ctx_->bind();
  if (key.slice < 0 || key.slice + 1 >= static_cast<int>(offsets_.size()))
    throw Error("RECV of slice " + std::to_string(key.slice) + ": the plan has " +
                std::to_string(offsets_.size() - 1) + " slices");
  const int tokens = offsets_[static_cast<std::size_t>(key.slice) + 1] - offsets_[static_cast<std::size_t>(key.slice)];
  const std::int64_t elements = std::int64_t(config_.micro_batch) * tokens * config_.hidden;
  if (graphs_) {
    // One buffer per tensor for the run, so the op that reads it, captured against its
    // address, replays. The step before's reader is done: end_step waited for it.
    std::lock_guard lock(slots_mu_);
    Buffer& slot = slots_[key];
    if (slot.empty()) slot = device_buffer(elements, ctx_->p2p(), wire_);
    return slot;
  }
  // The RECV is posted on the p2p stream too, after this allocation: ordered.
  return device_buffer(elements, ctx_->p2p(), wire_);
}

namespace {
// A view of part `index` of `count` of one of a stage's flat fp32 vectors (valid until
// end_step, like Compute::grad_bucket).
Buffer part_view(float* base, std::int64_t n, int index, int count) {
  const auto [begin, end] = part_range(n, index, count);
  Buffer b;
  b.data = std::shared_ptr<void>(base + begin, [](void*) {});
  b.elements = end - begin;
  b.dtype = DType::F32;
  return b;
}
}  // namespace

Buffer CudaCompute::grad_bucket(int chunk, int index, int count) {
  if (chunk < 0 || chunk >= chunks() || count < 1 || index < 0 || index >= count)
    throw Error("gradient bucket " + std::to_string(index) + " of " + std::to_string(count) + " of chunk " +
                std::to_string(chunk) + ": out of range");
  GptStageCuda& st = chunk_stage(chunk);
  wait_final(chunk, part_range(st.parameter_count(), index, count).first);
  return part_view(st.grads(), st.parameter_count(), index, count);
}


Buffer CudaCompute::param_bucket(int chunk, int index, int count) {
  if (chunk < 0 || chunk >= chunks())
    throw Error("parameter bucket " + std::to_string(index) + " of " + std::to_string(count) + " of chunk " +
                std::to_string(chunk) + ": out of range");
  GptStageCuda& st = chunk_stage(chunk);
  ctx_->bind();
  TDPIPE_CUDA_CHECK(cudaStreamWaitEvent(ctx_->dp(), opt_done_.e, 0));  // the step's OPT wrote them
  // The fp32 master weights (Compute::param_bucket); the bf16 copy follows in begin_step.
  return part_view(st.master_params(), st.parameter_count(), index, count);
}

Buffer CudaCompute::state_bucket(int chunk, int which, int index, int count) {
  if (chunk < 0 || chunk >= chunks() || which < 0 || which > 2)
    throw Error("state bucket " + std::to_string(which) + " of chunk " + std::to_string(chunk) + ": out of range");
  GptStageCuda& st = chunk_stage(chunk);
  return part_view(which == 0 ? st.grads() : st.moments(which), st.parameter_count(), index, count);
}

namespace {
float* error_of(std::vector<DeviceMemory>& errors, int chunk, std::int64_t n, cudaStream_t stream) {
  if (errors.size() <= static_cast<std::size_t>(chunk)) errors.resize(static_cast<std::size_t>(chunk) + 1);
  DeviceMemory& e = errors[static_cast<std::size_t>(chunk)];
  if (e.empty()) e = DeviceMemory(static_cast<std::size_t>(n > 0 ? n : 1) * sizeof(float), stream, true);
  return e.as<float>();
}
}  // namespace

OnebitMessages CudaCompute::onebit_compress(int chunk, int index, int count, int members) {
  ctx_->bind();
  const std::int64_t n = chunk >= 0 && chunk < chunks() ? chunk_stage(chunk).parameter_count() : 0;
  const auto [first, last] = onebit_bucket_range(n, chunk, chunks(), index, count, members);
  GptStageCuda& st = chunk_stage(chunk);
  cudaStream_t s = ctx_->dp();
  float* error = error_of(worker_error_, chunk, n, s) + first;
  if (onebit_sum_.empty()) onebit_sum_ = DeviceMemory(sizeof(double), s, true);
  float* m = st.moments(1) + first;
  // The gradients carry the 1/d of the data-parallel mean: the replica's own mean is d·g.
  kernels::onebit_momentum(m, st.grads() + first, last - first, static_cast<float>(options_.adam.beta1),
                           static_cast<float>(members), s);
  const std::int64_t block = onebit::block_bytes(last - first, members);
  OnebitMessages out{device_bytes(members * block, s), device_bytes(members * block, s),
                     device_bytes(members * block, s)};
  for (int j = 0; j < members; ++j) {
    const auto [s0, s1] = part_range(last - first, owned_segment(j, members), members);
    kernels::onebit_compress(m + s0, error + s0, s1 - s0, out.sent.as<unsigned char>() + j * block,
                             onebit_sum_.as<double>(), s);
  }
  // No host wait: the all-to-all that reads `sent` is ordered after this point of the dp
  // stream (NCCL on the same stream; the loopback worker through its arrival events).
  return out;
}

void CudaCompute::onebit_serve(int chunk, int index, int count, int member, int members, OnebitMessages& msg) {
  ctx_->bind();
  const std::int64_t n = chunk >= 0 && chunk < chunks() ? chunk_stage(chunk).parameter_count() : 0;
  const auto [first, last] = onebit_bucket_range(n, chunk, chunks(), index, count, members);
  const std::int64_t block = onebit::block_bytes(last - first, members);
  check_onebit_messages(msg, members * block);
  cudaStream_t s = ctx_->dp();
  if (onebit_sum_.empty()) onebit_sum_ = DeviceMemory(sizeof(double), s, true);
  const int seg = owned_segment(member, members);
  const auto [s0, s1] = part_range(last - first, seg, members);
  const auto [offset, owned] = owned_segments_offset(n, index, count, member, members);
  float* error = error_of(server_error_, chunk, owned, s) + offset;
  Buffer mean = device_buffer(s1 - s0, s);
  for (int i = 0; i < members; ++i)
    kernels::onebit_expand(msg.received.as<unsigned char>() + i * block, s1 - s0, 1.0f / static_cast<float>(members),
                           mean.as<float>(), i > 0, nullptr, s);
  kernels::onebit_compress(mean.as<float>(), error, s1 - s0, msg.gathered.as<unsigned char>() + seg * block,
                           onebit_sum_.as<double>(), s);
  // No host wait, as in onebit_compress: the all-gather follows on the dp stream's order.
}

void CudaCompute::onebit_expand(int chunk, int index, int count, int members, const OnebitMessages& msg) {
  ctx_->bind();
  const std::int64_t n = chunk >= 0 && chunk < chunks() ? chunk_stage(chunk).parameter_count() : 0;
  const auto [first, last] = onebit_bucket_range(n, chunk, chunks(), index, count, members);
  GptStageCuda& st = chunk_stage(chunk);
  const std::int64_t block = onebit::block_bytes(last - first, members);
  check_onebit_messages(msg, members * block);
  cudaStream_t s = ctx_->dp();
  float* m = st.moments(1) + first;
  const float* v = st.moments(2) + first;  // the momentum mask (onebit.hpp)
  for (int j = 0; j < members; ++j) {
    const auto [s0, s1] = part_range(last - first, j, members);
    kernels::onebit_expand(msg.gathered.as<unsigned char>() + j * block, s1 - s0, 1.0f, m + s0, false, v + s0, s);
  }
  wait_stream(s, control_);  // OPT reads the momentum on the compute stream
}

CudaClock::~CudaClock() {
  for (cudaEvent_t e : marks_) cudaEventDestroy(e);
}

std::int64_t CudaClock::mark(ir::Stream stream) {
  ctx_->bind();
  std::lock_guard lock(mu_);
  if (used_ == marks_.size()) {
    cudaEvent_t ev = nullptr;
    TDPIPE_CUDA_CHECK(cudaEventCreate(&ev));
    marks_.push_back(ev);
  }
  TDPIPE_CUDA_CHECK(cudaEventRecord(marks_[used_], ctx_->stream(stream)));
  return static_cast<std::int64_t>(used_++);
}

void CudaClock::resolve(std::span<std::int64_t> marks) {
  ctx_->bind();
  std::lock_guard lock(mu_);
  for (std::int64_t& m : marks) {
    if (m < 0 || static_cast<std::size_t>(m) >= used_)
      throw Error("CudaClock: mark " + std::to_string(m) + " is not one of this step's " + std::to_string(used_));
    cudaEvent_t ev = marks_[static_cast<std::size_t>(m)];
    TDPIPE_CUDA_CHECK(cudaEventSynchronize(ev));
    float ms = 0;
    TDPIPE_CUDA_CHECK(cudaEventElapsedTime(&ms, origin_, ev));
    m = std::llround(static_cast<double>(ms) * 1e6);
  }
  used_ = 0;  // the events are recorded again next step
}

std::int64_t CudaClock::now_ns(ir::Stream stream) {
  ctx_->bind();
  cudaEvent_t ev = nullptr;
  TDPIPE_CUDA_CHECK(cudaEventCreate(&ev));
  float ms = 0;
  try {
    // Recorded behind the stream's work: the time the GPU reaches this point.
    TDPIPE_CUDA_CHECK(cudaEventRecord(ev, ctx_->stream(stream)));
    TDPIPE_CUDA_CHECK(cudaEventSynchronize(ev));
    TDPIPE_CUDA_CHECK(cudaEventElapsedTime(&ms, origin_, ev));
  } catch (...) {
    cudaEventDestroy(ev);
    throw;
  }
  cudaEventDestroy(ev);
  return std::llround(static_cast<double>(ms) * 1e6);
}

}  // namespace tdpipe::exec::cuda
