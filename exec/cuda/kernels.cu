// kernels.cu — the GPT model's own kernels: LayerNorm, fused causal attention with a
// slice prefix (FlashAttention: tiled, online softmax, the backward recomputing the
// probabilities), GeLU, residual/bias adds, head (un)packing, embedding, cross-entropy,
// column sums, Adam and fp16's overflow check. Correct first: one warp or block per
// row with fp32 arithmetic; 16-bit (T16: bf16 or fp16) only where the value feeds a GEMM.
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

// The 16-bit types' conversions (T16 = bf16 or half), and fp32's own for col_sum.
__device__ __forceinline__ float f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float f32(half x) { return __half2float(x); }
__device__ __forceinline__ float f32(float x) { return x; }
template <class T>
__device__ __forceinline__ T to16(float x);
template <>
__device__ __forceinline__ bf16 to16<bf16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ half to16<half>(float x) { return __float2half(x); }

unsigned blocks_for(std::int64_t n, int threads) {
  std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 64 ? b : 65535 * 64);
}

// ---- LayerNorm: one warp per row -------------------------------------------------

template <class T16>
__global__ void ln_fwd(const float* x, const float* g, const float* bta, T16* y, float* mean,
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
  T16* yr = y + static_cast<std::int64_t>(row) * cols;
  for (int c = lane; c < cols; c += kWarp) yr[c] = to16<T16>((xr[c] - mu) * rs * g[c] + bta[c]);
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
                         float* dg, float* db, int rows, int cols, float scale) {
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
    atomicAdd(dg + c, scale * sg);
    atomicAdd(db + c, scale * sb);
  }
}

template <class T>
__global__ void col_sum(const T* dy, float* db, int rows, int cols, float scale) {
  int c = blockIdx.x * kWarp + threadIdx.x;
  float s = 0;
  if (c < cols)
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y)
      s += f32(dy[static_cast<std::int64_t>(r) * cols + c]);
  __shared__ float t[8][kWarp];
  t[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 1; k < blockDim.y; ++k) s += t[k][threadIdx.x];
    atomicAdd(db + c, scale * s);
  }
}

dim3 col_grid(int rows, int cols) {
  int gy = (rows + 8 * 64 - 1) / (8 * 64);  // ~64 rows per thread
  return dim3((cols + kWarp - 1) / kWarp, gy < 1 ? 1 : (gy > 1024 ? 1024 : gy));
}

// ---- elementwise -------------------------------------------------------------------

template <class T16>
__global__ void bias_add_k(T16* y, const float* b, std::int64_t n, int cols) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = to16<T16>(f32(y[i]) + b[i % cols]);
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

__global__ void scale_k(float* x, float f, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] *= f;
}
// Any element of the runs not finite → *flag = 1 (a plain store: every writer writes 1).
template <class T>
__global__ void nonfinite_k(const T* x, int runs, std::int64_t len, std::int64_t stride, int* flag,
                            const int* unless) {
  if (unless != nullptr && *unless != 0) return;
  const std::int64_t n = std::int64_t(runs) * len;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float v = f32(x[(i / len) * stride + i % len]);
    if (!(fabsf(v) <= 3.402823466e38f)) *flag = 1;  // inf and NaN (NaN compares false)
  }
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
template <class T16>
__global__ void gelu_f(const T16* u, T16* g, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    g[i] = to16<T16>(gelu_tanh(f32(u[i])));
}
template <class T16>
__global__ void gelu_b(const T16* dg, const T16* u, T16* du, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    du[i] = to16<T16>(f32(dg[i]) * gelu_tanh_grad(f32(u[i])));
}
template <class T16>
__global__ void to16_k(const float* x, T16* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = to16<T16>(x[i]);
}
template <class T16>
__global__ void to_f32_k(const T16* x, float* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = f32(x[i]);
}

// ---- attention layout ----------------------------------------------------------------

// One thread per (row n, column c) of a [b·Tq, h] tensor; head = c / dh.
template <class T16>
__global__ void split_qkv_k(const T16* qkv, T16* q, T16* kc, T16* vc, int b, int tq, int tt, int t0,
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
template <class T16>
__global__ void merge_heads_k(const T16* o, T16* out, int b, int tq, int heads, int dh) {
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
template <class T16>
__global__ void split_heads_k(const T16* in, T16* o, int b, int tq, int heads, int dh) {
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
template <class T16>
__global__ void gather_dqkv_k(const T16* dq, const float* dk, const float* dv, T16* dqkv, int b, int tq,
                              int tt, int t0, int heads, int dh, float kv_scale) {
  int h = heads * dh;
  std::int64_t n = std::int64_t(b) * tq * h;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    int c = static_cast<int>(i % h);
    std::int64_t row = i / h;
    int seq = static_cast<int>(row / tq), r = static_cast<int>(row % tq);
    const std::int64_t kv = head_major_index(seq, r, c, heads, dh, tt, t0);
    dqkv[i] = dq[head_major_index(seq, r, c, heads, dh, tq, 0)];
    dqkv[n + i] = to16<T16>(kv_scale * dk[kv]);
    dqkv[2 * n + i] = to16<T16>(kv_scale * dv[kv]);
  }
}

// ---- fused causal attention (FlashAttention) -------------------------------------------
//
// The scores never reach global memory. A block owns a tile of 16 query rows (forward,
// dQ) or 16 keys (dK, dV) of one (sequence, head) and streams the other side through
// shared memory a tile at a time; the forward keeps a running max and sum per row (online
// softmax) and saves the row's log-sum-exp, from which the backward recomputes P. Tiles
// are staged in their 16-bit type; every product and sum is fp32. 128 threads: 8 share a
// row (query or key) of the block's tile, each owning the head columns d ≡ its lane
// (mod 8) of the row's fp32 accumulators. kDh: the head-dimension bound the tiles are
// sized for (64, 128 or 256: the smallest ≥ dh). Deterministic: no atomics, every
// output written by one thread. Plain fp32 FMAs, no tensor cores; speed not yet measured
// on a GPU.

constexpr int kAttnThreads = 128;
constexpr int kRowThreads = 8;                         // threads per row of the block's tile
constexpr int kAttnRows = kAttnThreads / kRowThreads;  // 16: rows of the block's own tile
constexpr int kFwdKeys = 32;                           // forward: keys per streamed tile
constexpr int kBwdTile = 16;                           // backward: rows per streamed tile
constexpr int kPad = 2;  // 16-bit elements after each staged row: rows start a bank apart

// Static shared memory of each kernel (2-byte T16) at the largest head dim: within the
// 48 KiB a block may declare statically.
constexpr int staged_row_bytes(int dh) { return 2 * (dh + kPad); }
static_assert((kAttnRows + 2 * kFwdKeys) * staged_row_bytes(kMaxHeadDim) + 4 * kAttnRows * (kFwdKeys + 1) <=
              48 * 1024);
static_assert(4 * kBwdTile * staged_row_bytes(kMaxHeadDim) + 4 * (2 * kAttnRows + 2 * kAttnRows * (kBwdTile + 1)) <=
              48 * 1024);
static_assert(4 * kBwdTile * staged_row_bytes(kMaxHeadDim) + 4 * kAttnRows * (kBwdTile + 1) <= 48 * 1024);
static_assert(kFwdKeys % kRowThreads == 0 && kBwdTile % kRowThreads == 0 && kMaxHeadDim % kRowThreads == 0);

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// Max and sum over the kRowThreads lanes sharing a row (aligned lane groups of a warp;
// every lane of the warp takes part).
__device__ __forceinline__ float row_max(float v) {
  for (int o = kRowThreads / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
  for (int o = kRowThreads / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows row0 … row0 + rows − 1 of the [*, dh] matrix at src into `tile`; rows ≥ valid
// (past the slice or the keys written so far) as zeros, so nothing unwritten is read.
template <class T16, int kDh>
__device__ void stage_rows(T16 (*tile)[kDh + kPad], const T16* src, int row0, int rows, int valid, int dh) {
  for (int e = threadIdx.x; e < rows * dh; e += blockDim.x) {
    const int r = e / dh, d = e % dh;
    tile[r][d] = row0 + r < valid ? src[std::int64_t(row0 + r) * dh + d] : to16<T16>(0.f);
  }
}

// Row a of `x` against row b of `y` and row a of `dx` against row b of `dy`, over the
// head: a score (q·k) and its dP (dO·v), which both backward kernels recompute.
template <class T16, int kDh>
__device__ __forceinline__ void dot_pair(const T16 (*x)[kDh + kPad], const T16 (*y)[kDh + kPad],
                                         const T16 (*dx)[kDh + kPad], const T16 (*dy)[kDh + kPad], int a, int b,
                                         int dh, float& s, float& dp) {
  s = 0.f;
  dp = 0.f;
  for (int d = 0; d < dh; ++d) {
    s += f32(x[a][d]) * f32(y[b][d]);
    dp += f32(dx[a][d]) * f32(dy[b][d]);
  }
}

// acc[c] += Σ_j w[j] · tile[j][column c] over the first `rows` rows of `tile`, for this
// thread's columns g + kRowThreads·c of the head: P·V in the forward, dS·K for dQ.
template <class T16, int kDh>
__device__ __forceinline__ void add_weighted_rows(float* acc, const float* w, const T16 (*tile)[kDh + kPad],
                                                  int rows, int g, int dh) {
  for (int j = 0; j < rows; ++j) {
    const float wj = w[j];
    for (int c = 0; c < kDh / kRowThreads; ++c)
      if (g + kRowThreads * c < dh) acc[c] += wj * f32(tile[j][g + kRowThreads * c]);
  }
}

// One block per (query tile, sequence·head); row r of the slice sees keys < visible_keys.
template <class T16, int kDh>
__global__ void flash_fwd_k(const T16* q, const T16* kc, const T16* vc, T16* o, float* lse, int tq, int tt,
                            int t0, int dh, float scale, int q_tiles) {
  constexpr int kCols = kDh / kRowThreads, kKeys = kFwdKeys / kRowThreads;
  __shared__ T16 qs[kAttnRows][kDh + kPad];
  __shared__ T16 ks[kFwdKeys][kDh + kPad];
  __shared__ T16 vs[kFwdKeys][kDh + kPad];
  __shared__ float ps[kAttnRows][kFwdKeys + 1];
  const std::int64_t head = blockIdx.x / q_tiles;
  const int q0 = (q_tiles - 1 - static_cast<int>(blockIdx.x % q_tiles)) * kAttnRows;  // longest rows first
  const int t1 = t0 + tq, i = threadIdx.x / kRowThreads, g = threadIdx.x % kRowThreads, r = q0 + i;
  const int keys = visible_keys(t0, imin(q0 + kAttnRows, tq) - 1, t1);  // of the tile's last row
  // Rows past the slice (q = 0) see every key: finite, and never written.
  const int visible = visible_keys(t0, r, t1);
  const T16* kh = kc + head * tt * dh;
  const T16* vh = vc + head * tt * dh;
  stage_rows<T16, kDh>(qs, q + head * tq * dh, q0, kAttnRows, tq, dh);
  float m = -INFINITY, l = 0.f, acc[kCols];
  for (int c = 0; c < kCols; ++c) acc[c] = 0.f;
  for (int k0 = 0; k0 < keys; k0 += kFwdKeys) {
    __syncthreads();  // the last tile's readers are done (and qs is staged)
    stage_rows<T16, kDh>(ks, kh, k0, kFwdKeys, t1, dh);
    stage_rows<T16, kDh>(vs, vh, k0, kFwdKeys, t1, dh);
    __syncthreads();
    // Scores of row i against keys g, g + 8, …: 4 dot products over the head.
    float s[kKeys];
    for (int k = 0; k < kKeys; ++k) s[k] = 0.f;
    for (int d = 0; d < dh; ++d) {
      const float x = f32(qs[i][d]);
      for (int k = 0; k < kKeys; ++k) s[k] += x * f32(ks[g + kRowThreads * k][d]);
    }
    float tile_max = -INFINITY;
    for (int k = 0; k < kKeys; ++k) {
      s[k] = k0 + g + kRowThreads * k < visible ? s[k] * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[k]);
    }
    // Finite from the first tile on: key 0 is visible to every row.
    const float m_new = fmaxf(m, row_max(tile_max));
    // expf, not __expf: the fast intrinsic's error grows with |x| (up to ~1e-5 relative
    // at x = −80), and these probabilities are compared with the CPU's fp64 ones.
    const float correction = expf(m - m_new);
    float sum = 0.f;
    for (int k = 0; k < kKeys; ++k) {
      const float p = expf(s[k] - m_new);
      ps[i][g + kRowThreads * k] = p;
      sum += p;
    }
    l = l * correction + row_sum(sum);
    m = m_new;
    for (int c = 0; c < kCols; ++c) acc[c] *= correction;
    // A row's p are written and read by its 8 threads, one warp's, but a shuffle promises
    // no memory order (a __syncwarp would do). The SIMT emulation cannot show this barrier
    // missing: its shuffles are rendezvous that order everything before them.
    __syncthreads();
    add_weighted_rows<T16, kDh>(acc, ps[i], vs, kFwdKeys, g, dh);
  }
  if (r >= tq) return;
  const std::int64_t row = head * tq + r;
  for (int c = 0; c < kCols; ++c)
    if (g + kRowThreads * c < dh) o[row * dh + g + kRowThreads * c] = to16<T16>(acc[c] / l);
  if (g == 0) lse[row] = m + logf(l);
}

// delta[row] = Σ_d dO·o over the rows of [b·H·Tq, dh]: one warp per row.
template <class T16>
__global__ void flash_delta_k(const T16* o, const T16* dout, float* delta, std::int64_t rows, int dh) {
  const std::int64_t row = blockIdx.x * std::int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  float s = 0.f;
  for (int d = lane; d < dh; d += kWarp) s += f32(o[row * dh + d]) * f32(dout[row * dh + d]);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// dK, dV: one block per (tile of 16 keys, sequence·head), over the query tiles that see
// them; thread (j, g) computes key j's P and dS entries for query rows g and g + 8 of
// each tile, then adds its columns of Pᵀ·dO and dSᵀ·q.
template <class T16, int kDh>
__global__ void flash_bwd_kv_k(const T16* q, const T16* kc, const T16* vc, const T16* dout, const float* lse,
                               const float* delta, float* dk, float* dv, int tq, int tt, int t0, int dh,
                               float scale, float unscale, int k_tiles) {
  constexpr int kCols = kDh / kRowThreads, kRows = kBwdTile / kRowThreads;
  __shared__ T16 ks[kAttnRows][kDh + kPad];
  __shared__ T16 vs[kAttnRows][kDh + kPad];
  __shared__ T16 qs[kBwdTile][kDh + kPad];
  __shared__ T16 dos[kBwdTile][kDh + kPad];
  __shared__ float lse_s[kBwdTile], delta_s[kBwdTile];
  __shared__ float ps[kAttnRows][kBwdTile + 1], dss[kAttnRows][kBwdTile + 1];  // [key][query row]
  const std::int64_t head = blockIdx.x / k_tiles;
  const int k0 = static_cast<int>(blockIdx.x % k_tiles) * kAttnRows;
  const int t1 = t0 + tq, j = threadIdx.x / kRowThreads, g = threadIdx.x % kRowThreads, key = k0 + j;
  const std::int64_t kv = head * tt * dh, qd = head * tq * dh;
  stage_rows<T16, kDh>(ks, kc + kv, k0, kAttnRows, t1, dh);
  stage_rows<T16, kDh>(vs, vc + kv, k0, kAttnRows, t1, dh);
  float dk_acc[kCols], dv_acc[kCols];
  for (int c = 0; c < kCols; ++c) dk_acc[c] = dv_acc[c] = 0.f;
  // Query row r sees key k0 from r = k0 − t0 on: earlier tiles see none of these keys.
  for (int r0 = imax(0, k0 - t0) / kBwdTile * kBwdTile; r0 < tq; r0 += kBwdTile) {
    __syncthreads();  // the last tile's readers are done (and ks, vs are staged)
    stage_rows<T16, kDh>(qs, q + qd, r0, kBwdTile, tq, dh);
    stage_rows<T16, kDh>(dos, dout + qd, r0, kBwdTile, tq, dh);
    if (threadIdx.x < kBwdTile) {
      const int r = r0 + threadIdx.x;
      lse_s[threadIdx.x] = r < tq ? lse[head * tq + r] : 0.f;
      delta_s[threadIdx.x] = r < tq ? delta[head * tq + r] : 0.f;
    }
    __syncthreads();
    for (int n = 0; n < kRows; ++n) {
      const int i = g + kRowThreads * n, r = r0 + i;
      float s, dp;
      dot_pair<T16, kDh>(qs, ks, dos, vs, i, j, dh, s, dp);
      const bool seen = r < tq && key < visible_keys(t0, r, t1);
      const float p = seen ? expf(s * scale - lse_s[i]) : 0.f;
      ps[j][i] = p;
      dss[j][i] = seen ? scale * p * (dp - delta_s[i]) : 0.f;
    }
    __syncthreads();
    for (int i = 0; i < kBwdTile; ++i) {
      const float p = ps[j][i], ds = dss[j][i];
      for (int c = 0; c < kCols; ++c) {
        const int d = g + kRowThreads * c;
        if (d < dh) {
          dv_acc[c] += p * f32(dos[i][d]);
          dk_acc[c] += ds * f32(qs[i][d]);
        }
      }
    }
  }
  if (key >= t1) return;
  for (int c = 0; c < kCols; ++c) {
    const int d = g + kRowThreads * c;
    if (d >= dh) continue;
    dk[kv + std::int64_t(key) * dh + d] += unscale * dk_acc[c];
    dv[kv + std::int64_t(key) * dh + d] += unscale * dv_acc[c];
  }
}

// dQ: one block per (query tile, sequence·head), over the key tiles its rows see; thread
// (i, g) computes row i's dS entries for keys g and g + 8 of each tile, then adds its
// columns of dS·K.
template <class T16, int kDh>
__global__ void flash_bwd_q_k(const T16* q, const T16* kc, const T16* vc, const T16* dout, const float* lse,
                              const float* delta, T16* dq, int tq, int tt, int t0, int dh, float scale,
                              int q_tiles) {
  constexpr int kCols = kDh / kRowThreads, kKeys = kBwdTile / kRowThreads;
  __shared__ T16 qs[kAttnRows][kDh + kPad];
  __shared__ T16 dos[kAttnRows][kDh + kPad];
  __shared__ T16 ks[kBwdTile][kDh + kPad];
  __shared__ T16 vs[kBwdTile][kDh + kPad];
  __shared__ float dss[kAttnRows][kBwdTile + 1];
  const std::int64_t head = blockIdx.x / q_tiles;
  const int q0 = (q_tiles - 1 - static_cast<int>(blockIdx.x % q_tiles)) * kAttnRows;  // longest rows first
  const int t1 = t0 + tq, i = threadIdx.x / kRowThreads, g = threadIdx.x % kRowThreads, r = q0 + i;
  const int keys = visible_keys(t0, imin(q0 + kAttnRows, tq) - 1, t1);
  const int visible = r < tq ? visible_keys(t0, r, t1) : 0;
  const std::int64_t kv = head * tt * dh, qd = head * tq * dh;
  const float row_lse = r < tq ? lse[head * tq + r] : 0.f, row_delta = r < tq ? delta[head * tq + r] : 0.f;
  stage_rows<T16, kDh>(qs, q + qd, q0, kAttnRows, tq, dh);
  stage_rows<T16, kDh>(dos, dout + qd, q0, kAttnRows, tq, dh);
  float acc[kCols];
  for (int c = 0; c < kCols; ++c) acc[c] = 0.f;
  for (int k0 = 0; k0 < keys; k0 += kBwdTile) {
    __syncthreads();  // the last tile's readers are done (and qs, dos are staged)
    stage_rows<T16, kDh>(ks, kc + kv, k0, kBwdTile, t1, dh);
    stage_rows<T16, kDh>(vs, vc + kv, k0, kBwdTile, t1, dh);
    __syncthreads();
    for (int n = 0; n < kKeys; ++n) {
      const int j = g + kRowThreads * n;
      float s, dp;
      dot_pair<T16, kDh>(qs, ks, dos, vs, i, j, dh, s, dp);
      dss[i][j] = k0 + j < visible ? scale * expf(s * scale - row_lse) * (dp - row_delta) : 0.f;
    }
    __syncthreads();
    add_weighted_rows<T16, kDh>(acc, dss[i], ks, kBwdTile, g, dh);
  }
  if (r >= tq) return;
  for (int c = 0; c < kCols; ++c)
    if (g + kRowThreads * c < dh) dq[(head * tq + r) * dh + g + kRowThreads * c] = to16<T16>(acc[c]);
}

// The grid of one block per (tile, sequence·head): 1-D, whose limit (2³¹ − 1) is the loosest.
unsigned attention_grid(int bh, int tiles) {
  const std::int64_t blocks = std::int64_t(bh) * tiles;
  if (blocks > 2147483647)
    throw Error("CUDA attention: " + std::to_string(blocks) + " thread blocks (" + std::to_string(bh) +
                " sequence-heads × " + std::to_string(tiles) + " tiles of 16 rows), over the GPU's 2³¹ − 1");
  return static_cast<unsigned>(blocks);
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
template <class T16>
__global__ void cross_entropy_k(const float* logits, const int* targets, T16* dlogits, double* loss_sum,
                                int tq, int tt, int t0, int vocab, float scale, float grad_scale) {
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
    dlogits[row * vocab + k] = to16<T16>(grad_scale * (expf(lr[k] - m) * inv - (k == target ? 1.f : 0.f)));
  if (threadIdx.x == 0) {
    const double loss =
        valid ? (static_cast<double>(m) + log(static_cast<double>(z))) - lr[target] : nan("");
    atomicAdd(loss_sum, static_cast<double>(scale) * loss);
  }
}

template <class T16>
__global__ void adam_k(float* p, const float* g, float* m, float* v, T16* pb, std::int64_t n, float lr,
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
    if (pb) pb[i] = to16<T16>(pi);
  }
}

template <class T16>
__global__ void adam_frozen_k(float* p, const float* m, const float* v, T16* pb, std::int64_t n, float lr,
                              float eps, float bias1, float bias2) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i] - lr * (m[i] / bias1) / (sqrtf(v[i] / bias2) + eps);
    p[i] = pi;
    pb[i] = to16<T16>(pi);
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

template <class T16>
void layernorm_forward(const float* x, const float* gamma, const float* beta, T16* y, float* mean,
                       float* rstd, int rows, int cols, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  int rows_per_block = kThreads / kWarp;
  ln_fwd<T16><<<(rows + rows_per_block - 1) / rows_per_block, kThreads, 0, stream>>>(x, gamma, beta, y, mean,
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
                               float* dgamma, float* dbeta, int rows, int cols, float scale, cudaStream_t stream) {
  if (rows == 0) return;
  ln_bwd_w<<<col_grid(rows, cols), dim3(kWarp, 8), 0, stream>>>(dy, x, mean, rstd, dgamma, dbeta, rows, cols, scale);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void bias_add(T16* y, const float* b, int rows, int cols, cudaStream_t stream) {
  std::int64_t n = std::int64_t(rows) * cols;
  if (n == 0) return;
  bias_add_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, b, n, cols);
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
template <class T16>
void gelu_forward(const T16* u, T16* g, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_f<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(u, g, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void gelu_backward(const T16* dg, const T16* u, T16* du, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_b<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dg, u, du, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void split_qkv(const T16* qkv, T16* q, T16* kcache, T16* vcache, int b, int tq, int t_total, int t0,
               int heads, int head_dim, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * heads * head_dim;
  if (n == 0) return;
  split_qkv_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(qkv, q, kcache, vcache, b, tq, t_total, t0,
                                                                heads, head_dim);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void flash_attention_forward(const T16* q, const T16* kcache, const T16* vcache, T16* o, float* lse, int bh,
                             int tq, int t_total, int t0, int head_dim, float scale, cudaStream_t stream) {
  check_flash_attention(head_dim, tq, t0, t_total);
  if (bh == 0 || tq == 0) return;
  const int tiles = (tq + kAttnRows - 1) / kAttnRows;
  // (Named: transform.cmake rewrites the launches of plain and single-argument template names.)
  auto* kernel = head_dim <= 64 ? flash_fwd_k<T16, 64> : head_dim <= 128 ? flash_fwd_k<T16, 128>
                                                                         : flash_fwd_k<T16, kMaxHeadDim>;
  kernel<<<attention_grid(bh, tiles), kAttnThreads, 0, stream>>>(q, kcache, vcache, o, lse, tq, t_total, t0,
                                                                  head_dim, scale, tiles);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void flash_attention_backward(const T16* q, const T16* kcache, const T16* vcache, const T16* o, const T16* dout,
                              const float* lse, float* delta, T16* dq, float* dk_acc, float* dv_acc, int bh, int tq,
                              int t_total, int t0, int head_dim, float scale, float unscale, cudaStream_t stream) {
  check_flash_attention(head_dim, tq, t0, t_total);
  if (bh == 0 || tq == 0) return;
  const std::int64_t rows = std::int64_t(bh) * tq, rows_per_block = kThreads / kWarp;
  const auto row_blocks = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  const int key_tiles = (t0 + tq + kAttnRows - 1) / kAttnRows, query_tiles = (tq + kAttnRows - 1) / kAttnRows;
  const unsigned key_blocks = attention_grid(bh, key_tiles), query_blocks = attention_grid(bh, query_tiles);
  flash_delta_k<T16><<<row_blocks, kThreads, 0, stream>>>(o, dout, delta, rows, head_dim);
  TDPIPE_CUDA_CHECK_LAUNCH();
  auto* kv = head_dim <= 64 ? flash_bwd_kv_k<T16, 64> : head_dim <= 128 ? flash_bwd_kv_k<T16, 128>
                                                                         : flash_bwd_kv_k<T16, kMaxHeadDim>;
  kv<<<key_blocks, kAttnThreads, 0, stream>>>(q, kcache, vcache, dout, lse, delta, dk_acc, dv_acc, tq, t_total, t0,
                                              head_dim, scale, unscale, key_tiles);
  TDPIPE_CUDA_CHECK_LAUNCH();
  auto* dq_kernel = head_dim <= 64 ? flash_bwd_q_k<T16, 64> : head_dim <= 128 ? flash_bwd_q_k<T16, 128>
                                                                               : flash_bwd_q_k<T16, kMaxHeadDim>;
  dq_kernel<<<query_blocks, kAttnThreads, 0, stream>>>(q, kcache, vcache, dout, lse, delta, dq, tq, t_total, t0,
                                                       head_dim, scale, query_tiles);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void merge_heads(const T16* o, T16* out, int b, int tq, int heads, int head_dim, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * heads * head_dim;
  if (n == 0) return;
  merge_heads_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(o, out, b, tq, heads, head_dim);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void split_heads(const T16* in, T16* o, int b, int tq, int heads, int head_dim, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * heads * head_dim;
  if (n == 0) return;
  split_heads_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(in, o, b, tq, heads, head_dim);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void gather_dqkv(const T16* dq, const float* dk_acc, const float* dv_acc, T16* dqkv, int b, int tq,
                 int t_total, int t0, int heads, int head_dim, float kv_scale, cudaStream_t stream) {
  std::int64_t n = std::int64_t(b) * tq * heads * head_dim;
  if (n == 0) return;
  gather_dqkv_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dq, dk_acc, dv_acc, dqkv, b, tq, t_total,
                                                                  t0, heads, head_dim, kv_scale);
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
template <class T16>
void cross_entropy(const float* logits, const int* targets, T16* dlogits, double* loss_sum, int b,
                   int tq, int t_total, int t0, int vocab, float loss_scale, float grad_scale, cudaStream_t stream) {
  if (b * tq == 0) return;
  cross_entropy_k<T16><<<b * tq, 256, 0, stream>>>(logits, targets, dlogits, loss_sum, tq, t_total, t0, vocab,
                                                   loss_scale, grad_scale);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void column_sum(const T16* dy, float* db, int rows, int cols, float scale, cudaStream_t stream) {
  if (rows == 0) return;
  col_sum<T16><<<col_grid(rows, cols), dim3(kWarp, 8), 0, stream>>>(dy, db, rows, cols, scale);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
void column_sum(const float* dy, float* db, int rows, int cols, float scale, cudaStream_t stream) {
  if (rows == 0) return;
  col_sum<float><<<col_grid(rows, cols), dim3(kWarp, 8), 0, stream>>>(dy, db, rows, cols, scale);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void to_16(const float* x, T16* y, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  to16_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void to_f32(const T16* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_f32_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}
template <class T16>
void adam(float* p, const float* g, float* m, float* v, T16* p_T16, std::int64_t n, float lr, float beta1,
          float beta2, float eps, float bias1, float bias2, cudaStream_t stream) {
  if (n == 0) return;
  adam_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(p, g, m, v, p_T16, n, lr, beta1, beta2, eps,
                                                           bias1, bias2);
  TDPIPE_CUDA_CHECK_LAUNCH();
}

template <class T16>
void adam_frozen_variance(float* p, const float* m, const float* v, T16* p_T16, std::int64_t n, float lr, float eps,
                          float bias1, float bias2, cudaStream_t stream) {
  if (n == 0) return;
  adam_frozen_k<T16><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(p, m, v, p_T16, n, lr, eps, bias1, bias2);
  TDPIPE_CUDA_CHECK_LAUNCH();
}

void scale(float* x, float s, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_k<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, s, n);
  TDPIPE_CUDA_CHECK_LAUNCH();
}

template <class T>
void flag_nonfinite(const T* x, int runs, std::int64_t len, std::int64_t stride, int* flag, const int* unless,
                    cudaStream_t stream) {
  if (runs <= 0 || len <= 0) return;
  nonfinite_k<T><<<blocks_for(std::int64_t(runs) * len, kThreads), kThreads, 0, stream>>>(x, runs, len, stride, flag,
                                                                                         unless);
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

TDPIPE_KERNELS_INSTANTIATE_16(bf16)
TDPIPE_KERNELS_INSTANTIATE_16(half)
template void flag_nonfinite<float>(const float*, int, std::int64_t, std::int64_t, int*, const int*, cudaStream_t);

}  // namespace tdpipe::exec::cuda::kernels
