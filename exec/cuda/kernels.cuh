// kernels.cuh — internal to exec/cuda: the GPT model's own kernels (everything
// that is not a GEMM). Layout: row-major; activations between blocks (the residual
// stream) are fp32 [N, h] with N = b·T rows (row i·T + r: token t0 + r of sequence
// i); GEMM inputs are 16-bit (bf16 or fp16: T16); per-head attention tensors are [b·H, T, dh]. Every
// launcher enqueues on `stream` and checks the launch.
#pragma once

#include <cstdint>

// Index logic shared by the kernels and the host (tests/exec_cuda/test_kernel_index.cpp
// runs it on CPU): __host__ __device__ under nvcc, plain inline functions elsewhere.
// Define TDPIPE_KERNEL_INDEX_ONLY before including to get only that part (no CUDA header).
#if defined(__CUDACC__)
#define TDPIPE_HD __host__ __device__
#else
#define TDPIPE_HD
#endif

namespace tdpipe::exec::cuda::kernels {

/// Keys a query at row r of a slice starting at token t0 may see, of the tk = t1
/// keys in the scores row: 0 … t0 + r (causal mask with the TD-Pipe slice prefix).
TDPIPE_HD inline int visible_keys(int t0, int r, int tk) { return t0 + r + 1 < tk ? t0 + r + 1 : tk; }

/// Element (sequence seq, token row0 + r, column c of the hidden dimension) of a
/// head-major tensor [b·heads, rows, dh]: head c / dh, lane c % dh. rows = Tq and
/// row0 = 0 for per-slice q / o tensors; rows = seq and row0 = t0 for the caches.
TDPIPE_HD inline std::int64_t head_major_index(int seq, int r, int c, int heads, int dh, int rows, int row0) {
  return ((std::int64_t(seq) * heads + c / dh) * rows + row0 + r) * dh + c % dh;
}

}  // namespace tdpipe::exec::cuda::kernels

#ifndef TDPIPE_KERNEL_INDEX_ONLY

#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda::kernels {

using bf16 = __nv_bfloat16;
using half = __half;

// T16: the 16-bit type of GEMM inputs and stored activations — bf16 (model.dtype bf16)
// or half (fp16 training with loss scaling); every launcher taking one exists for both.

/// y = LN(x)·γ + β (T16), saving the row mean and 1/σ (biased variance, as the CPU model).
template <class T16>
void layernorm_forward(const float* x, const float* gamma, const float* beta, T16* y, float* mean, float* rstd,
                       int rows, int cols, float eps, cudaStream_t stream);
/// dx += LN's input gradient given dy = dL/d(LN output) (fp32).
void layernorm_backward_input(const float* dy, const float* x, const float* mean, const float* rstd,
                              const float* gamma, float* dx, int rows, int cols, cudaStream_t stream);
/// dγ += scale · Σ dy·x̂, dβ += scale · Σ dy over rows (scale: 1 / a loss scale, or 1).
void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd,
                               float* dgamma, float* dbeta, int rows, int cols, float scale, cudaStream_t stream);

/// y[r, c] += b[c] (T16 y).
template <class T16>
void bias_add(T16* y, const float* b, int rows, int cols, cudaStream_t stream);
/// y[r, c] += b[c] (fp32 y).
void bias_add(float* y, const float* b, int rows, int cols, cudaStream_t stream);
/// out = res + y + b (fp32; out may alias y or res).
void bias_residual_add(float* out, const float* y, const float* b, const float* res, int rows, int cols,
                       cudaStream_t stream);
/// y = a + b elementwise (fp32; y may alias a).
void add(float* y, const float* a, const float* b, std::int64_t n, cudaStream_t stream);
/// x *= s elementwise (fp32).
void scale(float* x, float s, std::int64_t n, cudaStream_t stream);
/// g = GeLU(u) (tanh form).
template <class T16>
void gelu_forward(const T16* u, T16* g, std::int64_t n, cudaStream_t stream);
/// du = dg · GeLU'(u).
template <class T16>
void gelu_backward(const T16* dg, const T16* u, T16* du, std::int64_t n, cudaStream_t stream);

/// Splits qkv [3, b·Tq, h] (q, k, v projections) into q [b·H, Tq, dh] and writes k, v at rows t0… of the
/// per-sequence caches [b·H, T, dh].
template <class T16>
void split_qkv(const T16* qkv, T16* q, T16* kcache, T16* vcache, int b, int tq, int t_total, int t0, int heads,
               int head_dim, cudaStream_t stream);
/// The largest head dimension the fused attention kernels take (their tiles hold a whole
/// row of q, k, v in shared memory).
constexpr int kMaxHeadDim = 256;

/// tdpipe::Error unless the fused attention kernels take this shape: 1 ≤ head_dim ≤
/// kMaxHeadDim, and the slice's rows [t0, t0 + tq) inside the caches' t_total rows.
inline void check_flash_attention(int head_dim, int tq, int t0, int t_total) {
  if (head_dim > kMaxHeadDim)
    throw Error("CUDA attention: head dim " + std::to_string(head_dim) + " (model.hidden / model.heads) exceeds " +
                "the fused attention kernels' maximum of " + std::to_string(kMaxHeadDim) +
                " (exec/cuda/kernels.cu): use more heads");
  if (head_dim < 1) throw Error("CUDA attention: head dim " + std::to_string(head_dim) + "; expected ≥ 1");
  if (t0 < 0 || tq < 0 || t0 + tq > t_total)
    throw Error("CUDA attention: query rows [" + std::to_string(t0) + ", " + std::to_string(t0 + tq) +
                ") outside the " + std::to_string(t_total) + " rows of the key/value caches");
}

/// Fused causal attention (FlashAttention; the scores never reach global memory): for
/// the slice's queries q [b·H, Tq, dh] (query row r is token t0 + r) against rows 0 …
/// t0 + Tq − 1 of the key/value caches [b·H, t_total, dh], row r seeing keys ≤ t0 + r,
/// o = softmax(scale · q·Kᵀ)·V [b·H, Tq, dh] and lse [b·H, Tq] (fp32), the log-sum-exp of
/// each row's scaled scores, which the backward recomputes the probabilities from.
template <class T16>
void flash_attention_forward(const T16* q, const T16* kcache, const T16* vcache, T16* o, float* lse, int bh,
                             int tq, int t_total, int t0, int head_dim, float scale, cudaStream_t stream);
/// Its backward given dO [b·H, Tq, dh], with P = exp(scale · q·Kᵀ − lse) recomputed, dP =
/// dO·Vᵀ, D = rowsum(dO ⊙ o) (written to `delta`, fp32 scratch [b·H, Tq]) and dS = scale ·
/// P ⊙ (dP − D): dq = dS·K (T16, written), and rows < t0 + Tq of the fp32 accumulators
/// [b·H, t_total, dh] added to: dk_acc += unscale · dSᵀ·q, dv_acc += unscale · Pᵀ·dO.
template <class T16>
void flash_attention_backward(const T16* q, const T16* kcache, const T16* vcache, const T16* o, const T16* dout,
                              const float* lse, float* delta, T16* dq, float* dk_acc, float* dv_acc, int bh, int tq,
                              int t_total, int t0, int head_dim, float scale, float unscale, cudaStream_t stream);
/// [b·H, Tq, dh] → [b·Tq, h].
template <class T16>
void merge_heads(const T16* o, T16* out, int b, int tq, int heads, int head_dim, cudaStream_t stream);
/// [b·Tq, h] → [b·H, Tq, dh].
template <class T16>
void split_heads(const T16* in, T16* o, int b, int tq, int heads, int head_dim, cudaStream_t stream);
/// dqkv [3, b·Tq, h] from dq [b·H, Tq, dh] and kv_scale × rows t0… of the fp32 key/value
/// gradient accumulators [b·H, T, dh] (kv_scale: the slice's loss scale, or 1).
template <class T16>
void gather_dqkv(const T16* dq, const float* dk_acc, const float* dv_acc, T16* dqkv, int b, int tq, int t_total,
                 int t0, int heads, int head_dim, float kv_scale, cudaStream_t stream);

/// x[i·Tq + r] = tok[tokens[i·T + t0 + r]] + pos[t0 + r].
void embed_forward(const int* tokens, const float* tok, const float* pos, float* x, int b, int tq,
                   int t_total, int t0, int hidden, cudaStream_t stream);
/// dtok[token] += dx, dpos[t0 + r] += dx (atomics: a token may repeat).
void embed_backward(const int* tokens, const float* dx, float* dtok, float* dpos, int b, int tq,
                    int t_total, int t0, int hidden, cudaStream_t stream);
/// Per row: loss_sum += loss_scale · (logsumexp − logit[target]); dlogits = grad_scale ·
/// (softmax − onehot) (grad_scale: loss_scale times the slice's fp16 loss scale).
/// Targets are read like tokens (row i·Tq + r ← targets[i·T + t0 + r]).
template <class T16>
void cross_entropy(const float* logits, const int* targets, T16* dlogits, double* loss_sum, int b, int tq,
                   int t_total, int t0, int vocab, float loss_scale, float grad_scale, cudaStream_t stream);

/// db[c] += scale · Σ_r dy[r, c].
template <class T16>
void column_sum(const T16* dy, float* db, int rows, int cols, float scale, cudaStream_t stream);
void column_sum(const float* dy, float* db, int rows, int cols, float scale, cudaStream_t stream);
template <class T16>
void to_16(const float* x, T16* y, std::int64_t n, cudaStream_t stream);
template <class T16>
void to_f32(const T16* x, float* y, std::int64_t n, cudaStream_t stream);

/// fp16 loss scaling's overflow check: *flag = 1 when any of `runs` runs of `len`
/// elements, `stride` apart from x, is inf or NaN — unless `unless` (device, may be null)
/// is set already: a tensor a tainted slice stored carries another's inf, not its own.
template <class T>
void flag_nonfinite(const T* x, int runs, std::int64_t len, std::int64_t stride, int* flag, const int* unless,
                    cudaStream_t stream);

/// Adam with bias correction on fp32 master weights; refreshes the T16 copy (p16 null:
/// there is none, as for a parameter block streamed in for its step).
template <class T16>
void adam(float* p, const float* g, float* m, float* v, T16* p16, std::int64_t n, float lr, float beta1,
          float beta2, float eps, float bias1, float bias2, cudaStream_t stream);

/// 1-bit Adam's step after its warm-up: Adam's update from the reduced momentum m and the
/// frozen variance v (both read only); refreshes the T16 copy.
template <class T16>
void adam_frozen_variance(float* p, const float* m, const float* v, T16* p16, std::int64_t n, float lr, float eps,
                          float bias1, float bias2, cudaStream_t stream);

/// 1-bit Adam, in tdpipe/exec/onebit.hpp's block format (fp32 scale, then sign bits LSB
/// first). m ← β1·m + (1 − β1)·gscale·g.
void onebit_momentum(float* m, const float* g, std::int64_t n, float beta1, float gscale, cudaStream_t stream);
/// c = x + error over len elements → `block`: scale ‖c‖₂/√len, the sign bits; error ←
/// c − scale·sign(c). `sum`: one double of device scratch.
void onebit_compress(const float* x, float* error, std::int64_t len, unsigned char* block, double* sum,
                     cudaStream_t stream);
/// out (+)= weight·scale·sign over the block's len elements (assigns unless accumulate;
/// with `keep`, 0 where keep is 0: the momentum mask).
void onebit_expand(const unsigned char* block, std::int64_t len, float weight, float* out, bool accumulate,
                   const float* keep, cudaStream_t stream);

}  // namespace tdpipe::exec::cuda::kernels

// Explicit instantiations of the T16 launchers for one type (kernels.cu and the
// host emulation, tests/exec_cuda/emu/emu_kernels.cpp, expand it for bf16 and half).
#define TDPIPE_KERNELS_INSTANTIATE_16(T16)                                                                        \
  template void layernorm_forward<T16>(const float*, const float*, const float*, T16*, float*, float*, int, int,  \
                                       float, cudaStream_t);                                                      \
  template void bias_add<T16>(T16*, const float*, int, int, cudaStream_t);                                        \
  template void gelu_forward<T16>(const T16*, T16*, std::int64_t, cudaStream_t);                                  \
  template void gelu_backward<T16>(const T16*, const T16*, T16*, std::int64_t, cudaStream_t);                     \
  template void split_qkv<T16>(const T16*, T16*, T16*, T16*, int, int, int, int, int, int, cudaStream_t);         \
  template void flash_attention_forward<T16>(const T16*, const T16*, const T16*, T16*, float*, int, int, int, int, \
                                             int, float, cudaStream_t);                                           \
  template void flash_attention_backward<T16>(const T16*, const T16*, const T16*, const T16*, const T16*,          \
                                              const float*, float*, T16*, float*, float*, int, int, int, int, int, \
                                              float, float, cudaStream_t);                                        \
  template void merge_heads<T16>(const T16*, T16*, int, int, int, int, cudaStream_t);                             \
  template void split_heads<T16>(const T16*, T16*, int, int, int, int, cudaStream_t);                             \
  template void gather_dqkv<T16>(const T16*, const float*, const float*, T16*, int, int, int, int, int, int,      \
                                 float, cudaStream_t);                                                            \
  template void cross_entropy<T16>(const float*, const int*, T16*, double*, int, int, int, int, int, float,       \
                                   float, cudaStream_t);                                                          \
  template void column_sum<T16>(const T16*, float*, int, int, float, cudaStream_t);                               \
  template void to_16<T16>(const float*, T16*, std::int64_t, cudaStream_t);                                       \
  template void to_f32<T16>(const T16*, float*, std::int64_t, cudaStream_t);                                      \
  template void flag_nonfinite<T16>(const T16*, int, std::int64_t, std::int64_t, int*, const int*, cudaStream_t); \
  template void adam<T16>(float*, const float*, float*, float*, T16*, std::int64_t, float, float, float, float,   \
                          float, float, cudaStream_t);                                                            \
  template void adam_frozen_variance<T16>(float*, const float*, const float*, T16*, std::int64_t, float, float,   \
                                          float, float, cudaStream_t);

#endif  // TDPIPE_KERNEL_INDEX_ONLY
