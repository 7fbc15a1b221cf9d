// gpt_cuda.hpp — internal to exec/cuda: one virtual stage of the CPU executor's GPT
// (exec/cpu/gpt.hpp) on a GPU — same parameters (names, shapes, initial values,
// flat order), same stage split, same temporal slices and B/W split — with 16-bit
// GEMMs on cuBLAS (fp32 accumulation), an fp32 residual stream, fp32 master weights,
// gradients and Adam moments, and a 16-bit copy of the weights for the GEMMs.
//
// The 16-bit type is bf16, or IEEE fp16 for fp16 training (model.dtype: fp16): then
// the loss is scaled per temporal slice (set_loss_scales; TD-Pipe's TDScaler), every
// fp16 tensor a slice stores — activations saved for B and W, gradients between layers,
// the head's dlogits — is checked for inf/NaN on the device and flags its slice
// (overflowed), a slice that read another's inf is tainted rather than flagged (as
// exec/src/cpu_gpt.cpp), and weight gradients, like the key/value gradient sums that
// several slices add to, are accumulated unscaled in fp32 (GEMM alpha = 1 / scale).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "tdpipe/exec/cpu/gpt.hpp"

namespace tdpipe::exec::cuda {

class GptStageCuda {
 public:
  /// Takes its initial weights from cpu::GptStage(config, stage, stages), so both
  /// backends start from the same parameters. Work is issued on `stream`.
  /// `memory` (if given) counts the bytes of weights, Adam moments and bf16 copies the
  /// device holds. With `offload` (parallel.param_offload: layers) the decoder blocks'
  /// weights and moments live in host memory: a block is on the device only while a LOAD's
  /// copy of it is (load_block … release_block / offload_block); gradients stay resident.
  /// `fp16`: fp16 training with loss scaling (else bf16).
  GptStageCuda(const cpu::GptConfig& config, int stage, int stages, cudaStream_t stream,
               cublasHandle_t cublas, cpu::DeviceMemory* memory = nullptr, bool offload = false,
               bool fp16 = false);
  ~GptStageCuda();
  GptStageCuda(GptStageCuda&&) noexcept;
  GptStageCuda& operator=(GptStageCuda&&) noexcept;

  bool is_first() const;
  bool is_last() const;

  /// Zeroes gradients (and fp16's overflow flags), drops activations and KV caches.
  void begin_step();
  /// fp16 training: the per-slice loss scales of the coming step (before begin_step);
  /// tdpipe::Error on a bf16 stage or a scale that is not a positive fp32 number.
  void set_loss_scales(const std::vector<double>& scales);
  /// fp16: per slice, whether its stores this step overflowed (downloads; waits for the
  /// stream). Empty in bf16.
  std::vector<std::uint8_t> overflowed() const;
  /// The next B of `slice` starts from an inf in its input gradient (and flags the
  /// slice): the fault tests' injected overflow, as cpu::GptStage::inject_overflow.
  void inject_overflow(int slice);
  /// Forward of tokens [t0, t1) of micro-batch `mb`. `x`: input activation (fp32
  /// b·(t1−t0) × hidden; ignored on stage 0). `tokens`/`targets`: device int32 b × seq
  /// (stage 0 / last stage). Writes the output activation to `out` (not on the last
  /// stage, which adds loss_scale · Σ cross-entropy to the device double *loss; its
  /// gradient is of loss_scale times the slice's fp16 loss scale).
  void forward(int mb, int slice, int t0, int t1, const float* x, float* out, const int* tokens,
               const int* targets, float loss_scale, double* loss);
  /// B: dL/d(output) `dy` (ignored on the last stage) → dL/d(input) into `dx` (not on stage 0).
  void backward_input(int mb, int slice, const float* dy, float* dx);
  /// W of a slice whose B ran. `final_tail`, if set, is called on the host each time
  /// the kernels of one more part (the head, a block, the embedding) have been issued,
  /// with how many trailing elements of grads() those kernels finish (the head's and
  /// the last block's come first; the last call reports parameter_count()).
  void backward_weight(int mb, int slice, const std::function<void(std::int64_t)>& final_tail = {});
  /// One Adam step (t = 1, 2, …).
  void adam(const cpu::AdamConfig& adam, int t);
  /// The same step over parameters [first, last) only (a sharded optimizer's part); the
  /// bf16 copy of the rest is refreshed by refresh_bf16_weights once they are gathered.
  void adam(const cpu::AdamConfig& adam, int t, std::int64_t first, std::int64_t last);
  /// 1-bit Adam's step t after its warm-up (cpu::GptStage::adam_frozen_variance).
  void adam_frozen_variance(const cpu::AdamConfig& adam, int t, int frozen_at);
  /// Recasts the bf16 weights from the fp32 master (after an all-gather wrote it).
  void refresh_bf16_weights();

  float* grads() const;
  /// The fp32 master weights on the device, flat like grads() — without offload (with it,
  /// only the resident ones, compacted; download_flat has them all).
  float* master_params() const;
  /// Adam's first (which = 1) or second (2) moment on the device, as master_params().
  float* moments(int which) const;
  /// The whole flat weights (which = 0) or Adam moment (1, 2), downloaded (fp32 → double),
  /// offloaded blocks from their host copy.
  std::vector<double> download_flat(int which) const;
  /// Sets them (double → fp32); with which = 0 the bf16 copy follows.
  void upload_flat(int which, const std::vector<double>& values);

  /// Parameter offload (see the constructor). Local decoder blocks of this stage.
  int blocks() const;
  /// On the copy stream, and returns once done: a device copy of block `block`'s weights
  /// (with `state`: its fp32 weights and Adam moments, for OPT) from host memory.
  void load_block(int block, bool state, cudaStream_t copy);
  /// The next LOADed weight copy of `block` becomes the one its kernels read (an op is
  /// about to use it); release_block frees it in order behind those kernels.
  void take_block(int block);
  void release_block(int block);
  /// Releases every block an op still holds (one that ended by an error half-way).
  void release_held();
  /// Called before and after forward and input-gradient backward use a block's weights,
  /// with its local index; empty functions: none.
  void set_block_hooks(std::function<void(int)> begin, std::function<void(int)> end);
  /// Adam step t over block `block`'s state copy (load_block(block, true)), on the compute
  /// stream (`skip`: a skipped fp16 step — the copy goes back unchanged); adam_resident:
  /// over the embedding and head (every parameter without offload).
  void adam_block(const cpu::AdamConfig& adam, int t, int block, bool skip = false);
  void adam_resident(const cpu::AdamConfig& adam, int t);
  /// On the copy stream, after adam_block's kernels: writes the block's stepped weights
  /// and moments back to host memory and frees its copy.
  void offload_block(int block, cudaStream_t copy);
  std::int64_t parameter_count() const;
  /// Downloaded copies (fp32 → double), named like cpu::GptStage.
  cpu::ParamMap named_params() const;
  cpu::ParamMap named_grads() const;
  /// Adam's first (which = 1) or second (2) moment, downloaded, by parameter name.
  cpu::ParamMap named_moments(int which) const;
  /// Takes this stage's parameters and Adam moments by name from maps holding (at least)
  /// them — the state of another partition of the same model (cpu::GptStage::load_state's
  /// contract); the bf16 copy of the weights follows. Throws naming a missing or mis-sized
  /// tensor.
  void load_state(const cpu::ParamMap& params, const cpu::ParamMap& m1, const cpu::ParamMap& m2);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Device bytes one stage's weights, gradients, Adam moments and bf16 copy need
/// (18 bytes per parameter: four fp32 copies and one bf16), from the CPU model's parameter count.
std::int64_t stage_state_bytes(std::int64_t parameters);

}  // namespace tdpipe::exec::cuda
