// kernels.cu — the GPT model's own kernels: LayerNorm, causal softmax with a slice
// prefix, GeLU, residual/bias adds, head (un)packing, embedding, cross-entropy,
// column sums and Adam. Correct first: one warp or block per row with fp32
// arithmetic; bf16 only where the value feeds a GEMM.
#include "kernels.cuh"

#include <cmath>

#include "check.hpp"

namespace tdpipe::exec::cuda::kernels {

namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (≤ 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < (blockDim.x + kWarp - 1) / kWarp ? part[lane] : 0.f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  float r = total;
  __syncthreads();
  return r;
}
__device__ float block_max(float v) {
  __shared__ float part[32];
  __shared__ float total;
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_max(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < (blockDim.x + kWarp - 1) / kWarp ? part[lane] : -INFINITY;
    s = warp_max(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  float r = total;
  __syncthreads();
  return r;
}

unsigned blocks_for(std::int64_t n, int threads) {
  std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 64 ? b : 65535 * 64);
}

// ---- LayerNorm: one warp per row -------------------------------------------------

__global__ void ln_fwd(const float* x, const float* g, const float* bta, bf16* y, float* mean,
                       float* rstd, int rows, int cols, float eps) {
  int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* xr = x + static_cast<std::int64_t>(row) * cols;
  float s = 0;
  for (int c = lane; c < cols; c += kWarp) s += xr[c];
  float mu = warp_sum(s) / cols;
  float v = 0;
  for (int c = lane; c < cols; c += kWarp) { float d = xr[c] - mu; v += d * d; }
  float rs = rsqrtf(warp_sum(v) / cols + eps);
  bf16* yr = y + static_cast<std::int64_t>(row) * cols;
  for (int c = lane; c < cols; c += kWarp) yr[c] = __float2bfloat16((xr[c] - mu) * rs * g[c] + bta[c]);
  if (lane == 0) { mean[row] = mu; rstd[row] = rs; }
}

__global__ void ln_bwd_in(const float* dy, const float* x, const float* mean, const float* rstd,
                          const float* g, float* dx, int rows, int cols) {
  int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  std::int64_t off = static_cast<std::int64_t>(row) * cols;
  float mu = mean[row], rs = rstd[row];
  float s1 = 0, s2 = 0;
  for (int c = lane; c < cols; c += kWarp) {
    float dxh = dy[off + c] * g[c];
    float xh = (x[off + c] - mu) * rs;
    s1 += dxh;
    s2 += dxh * xh;
  }
  s1 = warp_sum(s1) / cols;
  s2 = warp_sum(s2) / cols;
  for (int c = lane; c < cols; c += kWarp) {
    float dxh = dy[off + c] * g[c];
    float xh = (x[off + c] - mu) * rs;
    dx[off + c] += rs * (dxh - s1 - xh * s2);
  }
}

// Column reductions: a 32-column tile per block, rows strided over blockDim.y, atomics at the end.
__global__ void ln_bwd_w(const float* dy, const float* x, const float* mean, const float* rstd,
                         float* dg, float* db, int rows, int cols) {
  int c = blockIdx.x * kWarp + threadIdx.x;
  float sg = 0, sb = 0;
  if (c < cols) {
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
      std::int64_t i = static_cast<std::int64_t>(r) * cols + c;
      float d = dy[i];
      sg += d * (x[i] - mean[r]) * rstd[r];
      sb += d;
    }
  }
  __shared__ float tg[8][kWarp], tb[8][kWarp];
  tg[threadIdx.y][threadIdx.x] = sg;
  tb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 1; k < blockDim.y; ++k) { sg += tg[k][threadIdx.x]; sb += tb[k][threadIdx.x]; }
    atomicAdd(dg + c, sg);
    atomicAdd(db + c, sb);
  }
}

template <class T>
__global__ void col_sum(const T* dy, float* db, int rows, int cols) {
  int c = blockIdx.x * kWarp + threadIdx.x;
  float s = 0;
  if (c < cols)
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y)
      s += static_cast<float>(dy[static_cast<std::int64_t>(r) * cols + c]);
  __shared__ float t[8][kWarp];
  t[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 1; k < blockDim.y; ++k) s += t[k][threadIdx.x];
    atomicAdd(db + c, s);
  }
}

dim3 col_grid(int rows, int cols) {
  int gy = (rows + 8 * 64 - 1) / (8 * 64);  // ~64 rows per thread
  return dim3((cols + kWarp - 1) / kWarp, gy < 1 ? 1 : (gy > 1024 ? 1024 : gy));
}

// ---- elementwise -------------------------------------------------------------------

__global__ void bias_add_k(bf16* y, const float* b, std::int64_t n, int cols) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + b[i % cols]);
}
__global__ void bias_add_f32_k(float* y, const float* b, std::int64_t n, int cols) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] += b[i % cols];
}
__global__ void bias_res_k(float* out, const float* y, const float* b, const float* res, std::int64_t n,
                           int cols) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = res[i] + y[i] + b[i % cols];
}
__global__ void add_k(float* y, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

__device__ __forceinline__ float gelu_tanh(float u) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * u * (1.f + tanhf(k * (u + 0.044715f * u * u * u)));
}
__device__ __forceinline__ float gelu_tanh_grad(float u) {
  const float k = 0.7978845608028654f;
  // tanh has saturated to ±1 long before |u| = 20 (in fp32 and in the CPU's fp64), so
  // the exact value is 1 or 0; the formula below would give 0·inf = NaN once u² overflows.
  if (fabsf(u) > 20.f) return u > 0.f ? 1.f : 0.f;
  float inner = k * (u + 0.044715f * u * u * u);
  float t = tanhf(inner);
  return 0.5f * (1.f + t) + 0.5f * u * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * u * u);
}
__global__ void gelu_f(const bf16* u, bf16* g, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    g[i] = __float2bfloat16(gelu_tanh(__bfloat162float(u[i])));
}
__global__ void gelu_b(const bf16* dg, const bf16* u, bf16* du, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    du[i] = __float2bfloat16(__bfloat162float(dg[i]) * gelu_tanh_grad(__bfloat162float(u[i])));
}
__global__ void to_bf16_k(const float* x, bf16* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(x[i]);
}
__global__ void to_f32_k(const bf16* x, float* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

// ---- attention layout ----------------------------------------------------------------

// One thread per (row n, column c) of a [b·Tq, h] tensor; head = c / dh.
__global__ void split_qkv_k(const bf16* qkv, bf16* q, bf16* kc, bf16* vc, int b, int tq, int tt, int t0,
                            int heads, int dh) {
  int h = heads * dh;
  std::int64_t n = std::int64_t(b) * tq * h;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int c = static_cast<int>(i % h);
    std::int64_t row = i / h;
    int seq = static_cast<int>(row / tq), r = static_cast<int>(row % tq);
    // qkv is [3, b·Tq, h]: the q, k and v projections one after another.
    q[head_major_index(seq, r, c, heads, dh, tq, 0)] = qkv[i];
    const std::int64_t kv = head_major_index(seq, r, c, heads, dh, tt, t0);
    kc[kv] = qkv[n + i];
    vc[kv] = qkv[2 * n + i];
  }
}
__global__ void merge_heads_k(const bf16* o, bf16* out, int b, int tq, int heads, int dh) {
  int h = heads * dh;
  std::int64_t n = std::int64_t(b) * tq * h;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int c = static_cast<int>(i % h);
    std::int64_t row = i / h;
    int seq = static_cast<int>(row / tq), r = static_cast<int>(row % tq);
    out[i] = o[head_major_index(seq, r, c, heads, dh, tq, 0)];
  }
}
__global__ void split_heads_k(const bf16* in, bf16* o, int b, int tq, int heads, int dh) {
  int h = heads * dh;
  std::int64_t n = std::int64_t(b) * tq * h;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int c = static_cast<int>(i % h);
    std::int64_t row = i / h;
    int seq = static_cast<int>(row / tq), r = static_cast<int>(row % tq);
    o[head_major_index(seq, r, c, heads, dh, tq, 0)] = in[i];
  }
}
__global__ void gather_dqkv_k(const bf16* dq, const float* dk, const float* dv, bf16* dqkv, int b, int tq,
                              int tt, int t0, int heads, int dh) {
  int h = heads * dh;
  std::int64_t n = std::int64_t(b) * tq * h;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int c = static_cast<int>(i % h);
    std::int64_t row = i / h;
    int seq = static_cast<int>(row / tq), r = static_cast<int>(row % tq);
    const std::int64_t kv = head_major_index(seq, r, c, heads, dh, tt, t0);
    dqkv[i] = dq[head_major_index(seq, r, c, heads, dh, tq, 0)];
    dqkv[n + i] = __float2bfloat16(dk[kv]);
    dqkv[2 * n + i] = __float2bfloat16(dv[kv]);
  }
}

// One block per score row; keys k ≤ t0 + r are visible.
__global__ void causal_softmax_k(const float* s, bf16* p, int tq, int tk, int t0) {
  std::int64_t row = blockIdx.x;
  int r = static_cast<int>(row % tq);
  const int visible = visible_keys(t0, r, tk);
  const float* sr = s + row * tk;
  bf16* pr = p + row * tk;
  float m = -INFINITY;
  for (int k = threadIdx.x; k < visible; k += blockDim.x) m = fmaxf(m, sr[k]);
  m = block_max(m);
  float z = 0;
  // expf, not __expf: the fast intrinsic's error grows with |x| (up to ~1e-5 relative
  // at x = −80), and these probabilities are compared with the CPU's fp64 ones.
  for (int k = threadIdx.x; k < visible; k += blockDim.x) z += expf(sr[k] - m);
  z = block_sum(z);
  float inv = 1.f / z;
  for (int k = threadIdx.x; k < tk; k += blockDim.x)
    pr[k] = __float2bfloat16(k < visible ? expf(sr[k] - m) * inv : 0.f);
}
__global__ void softmax_bwd_k(const bf16* p, const float* dp, bf16* ds, int tk, float scale) {
  std::int64_t row = blockIdx.x;
  const bf16* pr = p + row * tk;
  const float* dr = dp + row * tk;
  float s = 0;
  for (int k = threadIdx.x; k < tk; k += blockDim.x) s += __bfloat162float(pr[k]) * dr[k];
  s = block_sum(s);
  for (int k = threadIdx.x; k < tk; k += blockDim.x)
    ds[row * tk + k] = __float2bfloat16(scale * __bfloat162float(pr[k]) * (dr[k] - s));
}

// ---- embedding and loss ----------------------------------------------------------------

__global__ void embed_f(const int* tokens, const float* tok, const float* pos, float* x, int b, int tq,
                        int tt, int t0, int h) {
  std::int64_t n = std::int64_t(b) * tq * h;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int c = static_cast<int>(i % h);
    std::int64_t row = i / h;
    int seq = static_cast<int>(row / tq), r = static_cast<int>(row % tq);
    int t = tokens[std::int64_t(seq) * tt + t0 + r];
    x[i] = tok[std::int64_t(t) * h + c] + pos[std::int64_t(t0 + r) * h + c];
  }
}
__global__ void embed_b(const int* tokens, const float* dx, float* dtok, float* dpos, int b, int tq, int tt,
                        int t0, int h) {
  std::int64_t n = std::int64_t(b) * tq * h;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int c = static_cast<int>(i % h);
    std::int64_t row = i / h;
    int seq = static_cast<int>(row / tq), r = static_cast<int>(row % tq);
    int t = tokens[std::int64_t(seq) * tt + t0 + r];
    atomicAdd(dtok + std::int64_t(t) * h + c, dx[i]);
    atomicAdd(dpos + std::int64_t(t0 + r) * h + c, dx[i]);
  }
}
__global__ void cross_entropy_k(const float* logits, const int* targets, bf16* dlogits, double* loss_sum,
                                int tq, int tt, int t0, int vocab, float scale) {
  std::int64_t row = blockIdx.x;
  int seq = static_cast<int>(row / tq), r = static_cast<int>(row % tq);
  const int target = targets[std::int64_t(seq) * tt + t0 + r];
  // An id outside the vocabulary must not read past the row: it poisons the loss
  // with NaN instead, which the host sees at the end of the step.
  const bool valid = target >= 0 && target < vocab;
  const float* lr = logits + row * vocab;
  float m = -INFINITY;
  for (int k = threadIdx.x; k < vocab; k += blockDim.x) m = fmaxf(m, lr[k]);
  m = block_max(m);
  float z = 0;
  for (int k = threadIdx.x; k < vocab; k += blockDim.x) z += expf(lr[k] - m);
  z = block_sum(z);
  float inv = 1.f / z;
  for (int k = threadIdx.x; k < vocab; k += blockDim.x)
    dlogits[row * vocab + k] = __float2bfloat16(scale * (expf(lr[k] - m) * inv - (k == target ? 1.f : 0.f)));
  if (threadIdx.x == 0) {
    const double loss =
        valid ? (static_cast<double>(m) + log(static_cast<double>(z))) - lr[target] : nan("");
    atomicAdd(loss_sum, static_cast<double>(scale) * loss);
  }
}

__global__ void adam_k(float* p, const float* g, float* m, float* v, bf16* pb, std::int64_t n, float lr,
                       float b1, float b2, float eps, float bias1, float bias2) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float gi = g[i];
    float mi = b1 * m[i] + (1.f - b1) * gi;
    float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] - lr * (mi / bias1) / (sqrtf(vi / bias2) + eps);
    p[i] = pi;
    if (pb) pb[i] = __float2bfloat16(pi);
  }
}

__global__ void adam_frozen_k(float* p, const float* m, const float* v, bf16* pb, std::int64_t n, float lr,
                              float eps, float bias1, float bias2) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i] - lr * (m[i] / bias1) / (sqrtf(v[i] / bias2) + eps);
    p[i] = pi;
    pb[i] = __float2bfloat16(pi);
  }
}

// ---- 1-bit Adam (tdpipe/exec/onebit.hpp's block format) --------------------------

__global__ void onebit_momentum_k(float* m, const float* g, std::int64_t n, float b1, float gscale) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    m[i] = b1 * m[i] + (1.f - b1) * gscale * g[i];
}

// *sum += Σ (x + e)² (fp32 per block, fp64 across blocks).
__global__ void onebit_sum_sq_k(const float* x, const float* e, std::int64_t n, double* sum) {
  float acc = 0.f;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float c = x[i] + e[i];
    acc += c * c;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(sum, double(acc));
}

__device__ float onebit_scale(const double* sum, std::int64_t len) {
  return len > 0 ? float(sqrt(*sum / double(len))) : 0.f;
}

// One thread per byte of sign bits: 8 elements' signs, and their error after sending.
__global__ void onebit_pack_k(const float* x, float* e, std::int64_t len, unsigned char* block, const double* sum) {
  const float s = onebit_scale(sum, len);
  const std::int64_t bytes = (len + 7) / 8;
  const std::int64_t first = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (first == 0) {  // the scale, byte by byte (a block need not be 4-byte aligned)
    const unsigned char* sb = reinterpret_cast<const unsigned char*>(&s);
    for (int j = 0; j < 4; ++j) block[j] = sb[j];
  }
  for (std::int64_t k = first; k < bytes; k += std::int64_t(gridDim.x) * blockDim.x) {
    unsigned bits = 0;
    for (int b = 0; b < 8; ++b) {
      const std::int64_t i = 8 * k + b;
      if (i >= len) break;
      const float c = x[i] + e[i];
      const bool positive = c >= 0.f;
      if (positive) bits |= 1u << b;
      e[i] = c - (positive ? s : -s);
    }
    block[4 + k] = static_cast<unsigned char>(bits);
  }
}

__global__ void onebit_expand_k(const unsigned char* block, std::int64_t len, float weight, float* out,
                                int accumulate, const float* keep) {
  float s;
  unsigned char* sb = reinterpret_cast<unsigned char*>(&s);
  for (int j = 0; j < 4; ++j) sb[j] = block[j];
  s *= weight;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < len;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float v = (block[4 + i / 8] >> (i % 8)) & 1u ? s : -s;
    out[i] = accumulate ? out[i] + v : keep != nullptr && keep[i] == 0.f ? 0.f : v;
  }
}

constexpr int kThreads = 256;

}  // namespace

void layernorm_forward(const float* x, const float* gamma, const float* beta, bf16* y, float* mean,
                       float* rstd, int rows, int cols, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  int rows_per_block = kThreads / kWarp;
  ln_fwd<<<(rows + rows_per_block - 1) / rows_per_block, kThreads, 0, stream>>>(x, gamma, beta, y, mean,
                                                                                 rstd, rows, cols, eps);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void layernorm_backward_input(const float* dy, const float* x, const float* mean, const float* rstd,
                              const float* gamma, float* dx, int rows, int cols, cudaStream_t stream) {
  if (rows == 0) return;
  int rows_per_block = kThreads / kWarp;
  ln_bwd_in<<<(rows + rows_per_block - 1) / rows_per_block, kThreads, 0, stream>>>(dy, x, mean, rstd, gamma,
                                                                                   dx, rows, cols);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd,
                               float* dgamma, float* dbeta, int rows, int cols, cudaStream_t stream) {
  if (rows == 0) return;
  ln_bwd_w<<<col_grid(rows, cols), dim3(kWarp, 8), 0, stream>>>(dy, x, mean, rstd, dgamma, dbeta, rows, cols);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void bias_add(bf16* y, const float* b, int rows, int cols, cudaStream_t stream) {
  std::int64_t n = std::int64_t(rows) * cols;
  if (n == 0) return;
  bias_add_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, b, n, cols);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void bias_add(float* y, const float* b, int rows, int cols, cudaStream_t stream) {
  std::int64_t n = std::int64_t(rows) * cols;
  if (n == 0) return;
  bias_add_f32_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, b, n, cols);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void bias_residual_add(float* out, const float* y, const float* b, const float* res, int rows, int cols,
                       cudaStream_t stream) {
  std::int64_t n = std::int64_t(rows) * cols;
  if (n == 0) return;
  bias_res_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(out, y, b, res, n, cols);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void add(float* y, const float* a, const float* b, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, a, b, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void gelu_forward(const bf16* u, bf16* g, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_f<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(u, g, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void gelu_backward(const bf16* dg, const bf16* u, bf16* du, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_b<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dg, u, du, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void split_qkv(const bf16* qkv, bf16* q, bf16* kcache, bf16* vcache, int b, int tq, int t_total, int t0,
               int heads, int head_dim, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * heads * head_dim;
  if (n == 0) return;
  split_qkv_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(qkv, q, kcache, vcache, b, tq, t_total, t0,
                                                                heads, head_dim);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void causal_softmax(const float* scores, bf16* p, int bh, int tq, int tk, int t0, cudaStream_t stream) {
  if (bh * tq == 0) return;
  causal_softmax_k<<<bh * tq, 128, 0, stream>>>(scores, p, tq, tk, t0);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void softmax_backward(const bf16* p, const float* dp, bf16* ds, int bh, int tq, int tk, float scale,
                      cudaStream_t stream) {
  if (bh * tq == 0) return;
  softmax_bwd_k<<<bh * tq, 128, 0, stream>>>(p, dp, ds, tk, scale);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void merge_heads(const bf16* o, bf16* out, int b, int tq, int heads, int head_dim, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * heads * head_dim;
  if (n == 0) return;
  merge_heads_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(o, out, b, tq, heads, head_dim);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void split_heads(const bf16* in, bf16* o, int b, int tq, int heads, int head_dim, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * heads * head_dim;
  if (n == 0) return;
  split_heads_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(in, o, b, tq, heads, head_dim);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void gather_dqkv(const bf16* dq, const float* dk_acc, const float* dv_acc, bf16* dqkv, int b, int tq,
                 int t_total, int t0, int heads, int head_dim, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * heads * head_dim;
  if (n == 0) return;
  gather_dqkv_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dq, dk_acc, dv_acc, dqkv, b, tq, t_total,
                                                                  t0, heads, head_dim);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void embed_forward(const int* tokens, const float* tok, const float* pos, float* x, int b, int tq,
                   int t_total, int t0, int hidden, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * hidden;
  if (n == 0) return;
  embed_f<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(tokens, tok, pos, x, b, tq, t_total, t0, hidden);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void embed_backward(const int* tokens, const float* dx, float* dtok, float* dpos, int b, int tq,
                    int t_total, int t0, int hidden, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * hidden;
  if (n == 0) return;
  embed_b<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(tokens, dx, dtok, dpos, b, tq, t_total, t0,
                                                            hidden);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void cross_entropy(const float* logits, const int* targets, bf16* dlogits, double* loss_sum, int b,
                   int tq, int t_total, int t0, int vocab, float scale, cudaStream_t stream) {
  if (b * tq == 0) return;
  cross_entropy_k<<<b * tq, 256, 0, stream>>>(logits, targets, dlogits, loss_sum, tq, t_total, t0, vocab,
                                              scale);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void column_sum(const bf16* dy, float* db, int rows, int cols, cudaStream_t stream) {
  if (rows == 0) return;
  col_sum<bf16><<<col_grid(rows, cols), dim3(kWarp, 8), 0, stream>>>(dy, db, rows, cols);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void column_sum(const float* dy, float* db, int rows, int cols, cudaStream_t stream) {
  if (rows == 0) return;
  col_sum<float><<<col_grid(rows, cols), dim3(kWarp, 8), 0, stream>>>(dy, db, rows, cols);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void to_bf16(const float* x, bf16* y, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void to_f32(const bf16* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_f32_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void adam(float* p, const float* g, float* m, float* v, bf16* p_bf16, std::int64_t n, float lr, float beta1,
          float beta2, float eps, float bias1, float bias2, cudaStream_t stream) {
  if (n == 0) return;
  adam_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(p, g, m, v, p_bf16, n, lr, beta1, beta2, eps,
                                                           bias1, bias2);
  TDPIPE_CUDA_CHECK_LAUNCH();
}

void adam_frozen_variance(float* p, const float* m, const float* v, bf16* p_bf16, std::int64_t n, float lr, float eps,
                          float bias1, float bias2, cudaStream_t stream) {
  if (n == 0) return;
  adam_frozen_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(p, m, v, p_bf16, n, lr, eps, bias1, bias2);
  TDPIPE_CUDA_CHECK_LAUNCH();
}

void onebit_momentum(float* m, const float* g, std::int64_t n, float beta1, float gscale, cudaStream_t stream) {
  if (n == 0) return;
  onebit_momentum_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(m, g, n, beta1, gscale);
  TDPIPE_CUDA_CHECK_LAUNCH();
}

void onebit_compress(const float* x, float* error, std::int64_t len, unsigned char* block, double* sum,
                     cudaStream_t stream) {
  TDPIPE_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(double), stream));
  if (len > 0) {
    onebit_sum_sq_k<<<blocks_for(len, kThreads), kThreads, 0, stream>>>(x, error, len, sum);
    TDPIPE_CUDA_CHECK_LAUNCH();
  }
  const unsigned grid = len > 0 ? blocks_for((len + 7) / 8, kThreads) : 1;  // (one thread writes the scale)
  onebit_pack_k<<<grid, kThreads, 0, stream>>>(x, error, len, block, sum);
  TDPIPE_CUDA_CHECK_LAUNCH();
}

void onebit_expand(const unsigned char* block, std::int64_t len, float weight, float* out, bool accumulate,
                   const float* keep, cudaStream_t stream) {
  if (len == 0) return;
  onebit_expand_k<<<blocks_for(len, kThreads), kThreads, 0, stream>>>(block, len, weight, out, accumulate ? 1 : 0,
                                                                      keep);
  TDPIPE_CUDA_CHECK_LAUNCH();
}

}  // namespace tdpipe::exec::cuda::kernels
