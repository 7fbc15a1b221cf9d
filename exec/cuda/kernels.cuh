// kernels.cuh — internal to exec/cuda: the GPT model's own kernels (everything
// that is not a GEMM). Layout: row-major; activations between blocks (the residual
// stream) are fp32 [N, h] with N = b·T rows (row i·T + r: token t0 + r of sequence
// i); GEMM inputs are bf16; per-head attention tensors are [b·H, T, dh]. Every
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

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tdpipe::exec::cuda::kernels {

using bf16 = __nv_bfloat16;

/// y = LN(x)·γ + β (bf16), saving the row mean and 1/σ (biased variance, as the CPU model).
void layernorm_forward(const float* x, const float* gamma, const float* beta, bf16* y, float* mean,
                       float* rstd, int rows, int cols, float eps, cudaStream_t stream);
/// dx += LN's input gradient given dy = dL/d(LN output) (fp32).
void layernorm_backward_input(const float* dy, const float* x, const float* mean, const float* rstd,
                              const float* gamma, float* dx, int rows, int cols, cudaStream_t stream);
/// dγ += Σ dy·x̂, dβ += Σ dy over rows.
void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd,
                               float* dgamma, float* dbeta, int rows, int cols, cudaStream_t stream);

/// y[r, c] += b[c] (bf16 y).
void bias_add(bf16* y, const float* b, int rows, int cols, cudaStream_t stream);
/// y[r, c] += b[c] (fp32 y).
void bias_add(float* y, const float* b, int rows, int cols, cudaStream_t stream);
/// out = res + y + b (fp32; out may alias y or res).
void bias_residual_add(float* out, const float* y, const float* b, const float* res, int rows, int cols,
                       cudaStream_t stream);
/// y = a + b elementwise (fp32; y may alias a).
void add(float* y, const float* a, const float* b, std::int64_t n, cudaStream_t stream);
/// g = GeLU(u) (tanh form).
void gelu_forward(const bf16* u, bf16* g, std::int64_t n, cudaStream_t stream);
/// du = dg · GeLU'(u).
void gelu_backward(const bf16* dg, const bf16* u, bf16* du, std::int64_t n, cudaStream_t stream);

/// Splits qkv [3, b·Tq, h] (q, k, v projections) into q [b·H, Tq, dh] and writes k, v at rows t0… of the
/// per-sequence caches [b·H, T, dh].
void split_qkv(const bf16* qkv, bf16* q, bf16* kcache, bf16* vcache, int b, int tq, int t_total, int t0,
               int heads, int head_dim, cudaStream_t stream);
/// p = causal softmax of scores [b·H, Tq, Tk] (row r sees keys ≤ t0 + r), masked entries 0.
void causal_softmax(const float* scores, bf16* p, int bh, int tq, int tk, int t0, cudaStream_t stream);
/// ds = scale · p ⊙ (dp − Σ_k p·dp) per row.
void softmax_backward(const bf16* p, const float* dp, bf16* ds, int bh, int tq, int tk, float scale,
                      cudaStream_t stream);
/// [b·H, Tq, dh] → [b·Tq, h].
void merge_heads(const bf16* o, bf16* out, int b, int tq, int heads, int head_dim, cudaStream_t stream);
/// [b·Tq, h] → [b·H, Tq, dh].
void split_heads(const bf16* in, bf16* o, int b, int tq, int heads, int head_dim, cudaStream_t stream);
/// dqkv [3, b·Tq, h] from dq [b·H, Tq, dh] and rows t0… of the fp32 key/value gradient
/// accumulators [b·H, T, dh].
void gather_dqkv(const bf16* dq, const float* dk_acc, const float* dv_acc, bf16* dqkv, int b, int tq,
                 int t_total, int t0, int heads, int head_dim, cudaStream_t stream);

/// x[i·Tq + r] = tok[tokens[i·T + t0 + r]] + pos[t0 + r].
void embed_forward(const int* tokens, const float* tok, const float* pos, float* x, int b, int tq,
                   int t_total, int t0, int hidden, cudaStream_t stream);
/// dtok[token] += dx, dpos[t0 + r] += dx (atomics: a token may repeat).
void embed_backward(const int* tokens, const float* dx, float* dtok, float* dpos, int b, int tq,
                    int t_total, int t0, int hidden, cudaStream_t stream);
/// Per row: loss_sum += scale · (logsumexp − logit[target]); dlogits = scale · (softmax − onehot).
/// Targets are read like tokens (row i·Tq + r ← targets[i·T + t0 + r]).
void cross_entropy(const float* logits, const int* targets, bf16* dlogits, double* loss_sum, int b,
                   int tq, int t_total, int t0, int vocab, float scale, cudaStream_t stream);

/// db[c] += Σ_r dy[r, c].
void column_sum(const bf16* dy, float* db, int rows, int cols, cudaStream_t stream);
void column_sum(const float* dy, float* db, int rows, int cols, cudaStream_t stream);
void to_bf16(const float* x, bf16* y, std::int64_t n, cudaStream_t stream);
void to_f32(const bf16* x, float* y, std::int64_t n, cudaStream_t stream);

/// Adam with bias correction on fp32 master weights; refreshes the bf16 copy (p_bf16 null:
/// there is none, as for a parameter block streamed in for its step).
void adam(float* p, const float* g, float* m, float* v, bf16* p_bf16, std::int64_t n, float lr,
          float beta1, float beta2, float eps, float bias1, float bias2, cudaStream_t stream);

/// 1-bit Adam's step after its warm-up: Adam's update from the reduced momentum m and the
/// frozen variance v (both read only); refreshes the bf16 copy.
void adam_frozen_variance(float* p, const float* m, const float* v, bf16* p_bf16, std::int64_t n, float lr,
                          float eps, float bias1, float bias2, cudaStream_t stream);

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

#endif  // TDPIPE_KERNEL_INDEX_ONLY
