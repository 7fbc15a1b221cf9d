// emu_kernels.cpp — host emulation of the CUDA pieces exec/cuda/gpt_cuda.cpp calls:
// DeviceMemory, cuBLAS's column-major GEMM contract, and each kernel per its contract
// in kernels.cuh — so test_gpt_cuda_emu can run the GPU model's host code on a CPU.
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "device_memory.hpp"
#include "kernels.cuh"

namespace tdpipe::exec::cuda {
namespace detail {
void throw_cuda(cudaError_t s, const char* call, const char* file, int line) {
  throw Error(std::string("cuda ") + std::to_string(s) + " " + call + " " + file + ":" + std::to_string(line));
}
void throw_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(std::string("cublas ") + std::to_string(s) + " " + call + " " + file + ":" + std::to_string(line));
}
void throw_nccl(ncclResult_t s, const char* call, const char* file, int line) {
  throw Error(std::string("nccl ") + std::to_string(s) + " " + call + " " + file + ":" + std::to_string(line));
}
}  // namespace detail

// NaN-filled allocations: a read of anything not written shows up in the results.
static void* emu_alloc(std::size_t bytes) {
  void* p = std::malloc((bytes + 3) / 4 * 4);
  std::memset(p, 0xff, (bytes + 3) / 4 * 4);  // NaN as fp32 and as bf16
  return p;
}
DeviceMemory::DeviceMemory(std::size_t bytes, cudaStream_t stream, bool zero) : bytes_(bytes), stream_(stream) {
  if (bytes == 0) return;
  ptr_ = emu_alloc(bytes);
  if (zero) std::memset(ptr_, 0, bytes);
}
void DeviceMemory::reset() {
  if (ptr_ == nullptr) return;
  // Poisoned and leaked, not freed: a read after the free (a stash dropped too early)
  // then yields NaN in the results instead of stale, plausible values.
  std::memset(ptr_, 0xff, bytes_);
  ptr_ = nullptr;
}
Buffer device_buffer(std::int64_t elements, cudaStream_t) {
  Buffer b;
  b.data = std::shared_ptr<void>(emu_alloc(std::size_t(elements > 0 ? elements : 1) * 4), [](void*) {});  // leaked: see reset()
  b.elements = elements;
  b.dtype = DType::F32;
  return b;
}
}  // namespace tdpipe::exec::cuda

using tdpipe::exec::cuda::kernels::bf16;
static float ld_el(const void* p, cudaDataType t, long long i) {
  return t == CUDA_R_16BF ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType at, int lda,
                                          long long sa, const void* B, cudaDataType bt, int ldb, long long sb,
                                          const void* beta, void* C, cudaDataType ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t, cublasGemmAlgo_t) {
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // cuBLAS's argument rules (column-major).
  if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) ||
      ldc < std::max(1, m)) {
    std::fprintf(stderr, "cuBLAS would reject: m %d n %d k %d lda %d ldb %d ldc %d\n", m, n, k, lda, ldb, ldc);
    return 7;
  }
  for (int bi = 0; bi < batch; ++bi)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0;
        for (int p = 0; p < k; ++p) {
          const long long ia = bi * sa + (ta == CUBLAS_OP_N ? i + (long long)p * lda : p + (long long)i * lda);
          const long long ib = bi * sb + (tb == CUBLAS_OP_N ? p + (long long)j * ldb : j + (long long)p * ldb);
          acc += ld_el(A, at, ia) * ld_el(B, bt, ib);
        }
        const long long ic = bi * sc + i + (long long)j * ldc;
        float v = al * acc;
        if (be != 0.f) v += be * ld_el(C, ct, ic);
        if (ct == CUDA_R_16BF)
          static_cast<bf16*>(C)[ic] = __float2bfloat16(v);
        else
          static_cast<float*>(C)[ic] = v;
      }
  return 0;
}

namespace tdpipe::exec::cuda::kernels {
using i64 = std::int64_t;
static float f(bf16 x) { return __bfloat162float(x); }
static bf16 b(float x) { return __float2bfloat16(x); }

void layernorm_forward(const float* x, const float* g, const float* be, bf16* y, float* mean, float* rstd, int rows,
                       int cols, float eps, cudaStream_t) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + i64(r) * cols;
    float mu = 0;
    for (int c = 0; c < cols; ++c) mu += xr[c];
    mu /= cols;
    float v = 0;
    for (int c = 0; c < cols; ++c) v += (xr[c] - mu) * (xr[c] - mu);
    float rs = 1.f / std::sqrt(v / cols + eps);
    for (int c = 0; c < cols; ++c) y[i64(r) * cols + c] = b((xr[c] - mu) * rs * g[c] + be[c]);
    mean[r] = mu;
    rstd[r] = rs;
  }
}
void layernorm_backward_input(const float* dy, const float* x, const float* mean, const float* rstd, const float* g,
                              float* dx, int rows, int cols, cudaStream_t) {
  for (int r = 0; r < rows; ++r) {
    i64 o = i64(r) * cols;
    float s1 = 0, s2 = 0;
    for (int c = 0; c < cols; ++c) {
      float dxh = dy[o + c] * g[c], xh = (x[o + c] - mean[r]) * rstd[r];
      s1 += dxh;
      s2 += dxh * xh;
    }
    s1 /= cols;
    s2 /= cols;
    for (int c = 0; c < cols; ++c) {
      float dxh = dy[o + c] * g[c], xh = (x[o + c] - mean[r]) * rstd[r];
      dx[o + c] += rstd[r] * (dxh - s1 - xh * s2);
    }
  }
}
void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd, float* dg,
                               float* db, int rows, int cols, cudaStream_t) {
  for (int c = 0; c < cols; ++c) {
    float sg = 0, sb = 0;
    for (int r = 0; r < rows; ++r) {
      i64 i = i64(r) * cols + c;
      sg += dy[i] * (x[i] - mean[r]) * rstd[r];
      sb += dy[i];
    }
    dg[c] += sg;
    db[c] += sb;
  }
}
void bias_add(bf16* y, const float* bb, int rows, int cols, cudaStream_t) {
  for (i64 i = 0; i < i64(rows) * cols; ++i) y[i] = b(f(y[i]) + bb[i % cols]);
}
void bias_add(float* y, const float* bb, int rows, int cols, cudaStream_t) {
  for (i64 i = 0; i < i64(rows) * cols; ++i) y[i] += bb[i % cols];
}
void bias_residual_add(float* out, const float* y, const float* bb, const float* res, int rows, int cols,
                       cudaStream_t) {
  for (i64 i = 0; i < i64(rows) * cols; ++i) out[i] = res[i] + y[i] + bb[i % cols];
}
void add(float* y, const float* a, const float* bb, i64 n, cudaStream_t) {
  for (i64 i = 0; i < n; ++i) y[i] = a[i] + bb[i];
}
static float gl(float u) { return 0.5f * u * (1.f + std::tanh(0.7978845608028654f * (u + 0.044715f * u * u * u))); }
static float glg(float u) {
  const float k = 0.7978845608028654f;
  float t = std::tanh(k * (u + 0.044715f * u * u * u));
  return 0.5f * (1.f + t) + 0.5f * u * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * u * u);
}
void gelu_forward(const bf16* u, bf16* g, i64 n, cudaStream_t) {
  for (i64 i = 0; i < n; ++i) g[i] = b(gl(f(u[i])));
}
void gelu_backward(const bf16* dg, const bf16* u, bf16* du, i64 n, cudaStream_t) {
  for (i64 i = 0; i < n; ++i) du[i] = b(f(dg[i]) * glg(f(u[i])));
}
void split_qkv(const bf16* qkv, bf16* q, bf16* kc, bf16* vc, int bb, int tq, int tt, int t0, int heads, int dh,
               cudaStream_t) {
  int h = heads * dh;
  i64 n = i64(bb) * tq * h;
  for (i64 i = 0; i < n; ++i) {
    int c = int(i % h);
    i64 row = i / h;
    int seq = int(row / tq), r = int(row % tq);
    q[head_major_index(seq, r, c, heads, dh, tq, 0)] = qkv[i];
    kc[head_major_index(seq, r, c, heads, dh, tt, t0)] = qkv[n + i];
    vc[head_major_index(seq, r, c, heads, dh, tt, t0)] = qkv[2 * n + i];
  }
}
void causal_softmax(const float* s, bf16* p, int bh, int tq, int tk, int t0, cudaStream_t) {
  for (i64 row = 0; row < i64(bh) * tq; ++row) {
    int r = int(row % tq), vis = visible_keys(t0, r, tk);
    const float* sr = s + row * tk;
    float m = -INFINITY, z = 0;
    for (int k = 0; k < vis; ++k) m = std::max(m, sr[k]);
    for (int k = 0; k < vis; ++k) z += std::exp(sr[k] - m);
    for (int k = 0; k < tk; ++k) p[row * tk + k] = b(k < vis ? std::exp(sr[k] - m) / z : 0.f);
  }
}
void softmax_backward(const bf16* p, const float* dp, bf16* ds, int bh, int tq, int tk, float scale, cudaStream_t) {
  for (i64 row = 0; row < i64(bh) * tq; ++row) {
    float s = 0;
    for (int k = 0; k < tk; ++k) s += f(p[row * tk + k]) * dp[row * tk + k];
    for (int k = 0; k < tk; ++k) ds[row * tk + k] = b(scale * f(p[row * tk + k]) * (dp[row * tk + k] - s));
  }
}
void merge_heads(const bf16* o, bf16* out, int bb, int tq, int heads, int dh, cudaStream_t) {
  int h = heads * dh;
  for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
    int c = int(i % h);
    i64 row = i / h;
    out[i] = o[head_major_index(int(row / tq), int(row % tq), c, heads, dh, tq, 0)];
  }
}
void split_heads(const bf16* in, bf16* o, int bb, int tq, int heads, int dh, cudaStream_t) {
  int h = heads * dh;
  for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
    int c = int(i % h);
    i64 row = i / h;
    o[head_major_index(int(row / tq), int(row % tq), c, heads, dh, tq, 0)] = in[i];
  }
}
void gather_dqkv(const bf16* dq, const float* dk, const float* dv, bf16* dqkv, int bb, int tq, int tt, int t0,
                 int heads, int dh, cudaStream_t) {
  int h = heads * dh;
  i64 n = i64(bb) * tq * h;
  for (i64 i = 0; i < n; ++i) {
    int c = int(i % h);
    i64 row = i / h;
    int seq = int(row / tq), r = int(row % tq);
    i64 kv = head_major_index(seq, r, c, heads, dh, tt, t0);
    dqkv[i] = dq[head_major_index(seq, r, c, heads, dh, tq, 0)];
    dqkv[n + i] = b(dk[kv]);
    dqkv[2 * n + i] = b(dv[kv]);
  }
}
void embed_forward(const int* tokens, const float* tok, const float* pos, float* x, int bb, int tq, int tt, int t0,
                   int h, cudaStream_t) {
  for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
    int c = int(i % h);
    i64 row = i / h;
    int seq = int(row / tq), r = int(row % tq);
    int t = tokens[i64(seq) * tt + t0 + r];
    x[i] = tok[i64(t) * h + c] + pos[i64(t0 + r) * h + c];
  }
}
void embed_backward(const int* tokens, const float* dx, float* dtok, float* dpos, int bb, int tq, int tt, int t0,
                    int h, cudaStream_t) {
  for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
    int c = int(i % h);
    i64 row = i / h;
    int seq = int(row / tq), r = int(row % tq);
    int t = tokens[i64(seq) * tt + t0 + r];
    dtok[i64(t) * h + c] += dx[i];
    dpos[i64(t0 + r) * h + c] += dx[i];
  }
}
void cross_entropy(const float* logits, const int* targets, bf16* dl, double* loss, int bb, int tq, int tt, int t0,
                   int V, float scale, cudaStream_t) {
  for (i64 row = 0; row < i64(bb) * tq; ++row) {
    int seq = int(row / tq), r = int(row % tq);
    int y = targets[i64(seq) * tt + t0 + r];
    const float* lr = logits + row * V;
    float m = -INFINITY, z = 0;
    for (int k = 0; k < V; ++k) m = std::max(m, lr[k]);
    for (int k = 0; k < V; ++k) z += std::exp(lr[k] - m);
    for (int k = 0; k < V; ++k) dl[row * V + k] = b(scale * (std::exp(lr[k] - m) / z - (k == y ? 1.f : 0.f)));
    *loss += double(scale) * ((double(m) + std::log(double(z))) - lr[y]);
  }
}
void column_sum(const bf16* dy, float* db, int rows, int cols, cudaStream_t) {
  for (int c = 0; c < cols; ++c) {
    float s = 0;
    for (int r = 0; r < rows; ++r) s += f(dy[i64(r) * cols + c]);
    db[c] += s;
  }
}
void column_sum(const float* dy, float* db, int rows, int cols, cudaStream_t) {
  for (int c = 0; c < cols; ++c) {
    float s = 0;
    for (int r = 0; r < rows; ++r) s += dy[i64(r) * cols + c];
    db[c] += s;
  }
}
void to_bf16(const float* x, bf16* y, i64 n, cudaStream_t) {
  for (i64 i = 0; i < n; ++i) y[i] = b(x[i]);
}
void to_f32(const bf16* x, float* y, i64 n, cudaStream_t) {
  for (i64 i = 0; i < n; ++i) y[i] = f(x[i]);
}
void adam(float* p, const float* g, float* m, float* v, bf16* pb, i64 n, float lr, float b1, float b2, float eps,
          float c1, float c2, cudaStream_t) {
  for (i64 i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    pb[i] = b(p[i]);
  }
}
}  // namespace tdpipe::exec::cuda::kernels
