// emu_kernels.cpp — each kernel of exec/cuda/kernels.cuh emulated on the host by its
// contract (plain loops), launched on its stream like a kernel (emu::launch); the
// SIMT tests run kernels.cu itself instead (simt/).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.cuh"

using tdpipe::exec::cuda::kernels::bf16;

namespace tdpipe::exec::cuda::kernels {
using i64 = std::int64_t;
static float f(bf16 x) { return __bfloat162float(x); }
static bf16 b(float x) { return __float2bfloat16(x); }

void layernorm_forward(const float* x, const float* g, const float* be, bf16* y, float* mean, float* rstd, int rows,
                       int cols, float eps, cudaStream_t stream) {
  emu::launch(stream, [=] {
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
  });
}
void layernorm_backward_input(const float* dy, const float* x, const float* mean, const float* rstd, const float* g,
                              float* dx, int rows, int cols, cudaStream_t stream) {
  emu::launch(stream, [=] {
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
  });
}
void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd, float* dg,
                               float* db, int rows, int cols, cudaStream_t stream) {
  emu::launch(stream, [=] {
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
  });
}
void bias_add(bf16* y, const float* bb, int rows, int cols, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < i64(rows) * cols; ++i) y[i] = b(f(y[i]) + bb[i % cols]);
  });
}
void bias_add(float* y, const float* bb, int rows, int cols, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < i64(rows) * cols; ++i) y[i] += bb[i % cols];
  });
}
void bias_residual_add(float* out, const float* y, const float* bb, const float* res, int rows, int cols,
                       cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < i64(rows) * cols; ++i) out[i] = res[i] + y[i] + bb[i % cols];
  });
}
void add(float* y, const float* a, const float* bb, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) y[i] = a[i] + bb[i];
  });
}
static float gl(float u) { return 0.5f * u * (1.f + std::tanh(0.7978845608028654f * (u + 0.044715f * u * u * u))); }
static float glg(float u) {
  const float k = 0.7978845608028654f;
  float t = std::tanh(k * (u + 0.044715f * u * u * u));
  return 0.5f * (1.f + t) + 0.5f * u * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * u * u);
}
void gelu_forward(const bf16* u, bf16* g, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) g[i] = b(gl(f(u[i])));
  });
}
void gelu_backward(const bf16* dg, const bf16* u, bf16* du, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) du[i] = b(f(dg[i]) * glg(f(u[i])));
  });
}
void split_qkv(const bf16* qkv, bf16* q, bf16* kc, bf16* vc, int bb, int tq, int tt, int t0, int heads, int dh,
               cudaStream_t stream) {
  emu::launch(stream, [=] {
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
  });
}
void causal_softmax(const float* s, bf16* p, int bh, int tq, int tk, int t0, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 row = 0; row < i64(bh) * tq; ++row) {
      int r = int(row % tq), vis = visible_keys(t0, r, tk);
      const float* sr = s + row * tk;
      float m = -INFINITY, z = 0;
      for (int k = 0; k < vis; ++k) m = std::max(m, sr[k]);
      for (int k = 0; k < vis; ++k) z += std::exp(sr[k] - m);
      for (int k = 0; k < tk; ++k) p[row * tk + k] = b(k < vis ? std::exp(sr[k] - m) / z : 0.f);
    }
  });
}
void softmax_backward(const bf16* p, const float* dp, bf16* ds, int bh, int tq, int tk, float scale, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 row = 0; row < i64(bh) * tq; ++row) {
      float s = 0;
      for (int k = 0; k < tk; ++k) s += f(p[row * tk + k]) * dp[row * tk + k];
      for (int k = 0; k < tk; ++k) ds[row * tk + k] = b(scale * f(p[row * tk + k]) * (dp[row * tk + k] - s));
    }
  });
}
void merge_heads(const bf16* o, bf16* out, int bb, int tq, int heads, int dh, cudaStream_t stream) {
  emu::launch(stream, [=] {
    int h = heads * dh;
    for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
      int c = int(i % h);
      i64 row = i / h;
      out[i] = o[head_major_index(int(row / tq), int(row % tq), c, heads, dh, tq, 0)];
    }
  });
}
void split_heads(const bf16* in, bf16* o, int bb, int tq, int heads, int dh, cudaStream_t stream) {
  emu::launch(stream, [=] {
    int h = heads * dh;
    for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
      int c = int(i % h);
      i64 row = i / h;
      o[head_major_index(int(row / tq), int(row % tq), c, heads, dh, tq, 0)] = in[i];
    }
  });
}
void gather_dqkv(const bf16* dq, const float* dk, const float* dv, bf16* dqkv, int bb, int tq, int tt, int t0,
                 int heads, int dh, cudaStream_t stream) {
  emu::launch(stream, [=] {
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
  });
}
void embed_forward(const int* tokens, const float* tok, const float* pos, float* x, int bb, int tq, int tt, int t0,
                   int h, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
      int c = int(i % h);
      i64 row = i / h;
      int seq = int(row / tq), r = int(row % tq);
      int t = tokens[i64(seq) * tt + t0 + r];
      x[i] = tok[i64(t) * h + c] + pos[i64(t0 + r) * h + c];
    }
  });
}
void embed_backward(const int* tokens, const float* dx, float* dtok, float* dpos, int bb, int tq, int tt, int t0,
                    int h, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
      int c = int(i % h);
      i64 row = i / h;
      int seq = int(row / tq), r = int(row % tq);
      int t = tokens[i64(seq) * tt + t0 + r];
      dtok[i64(t) * h + c] += dx[i];
      dpos[i64(t0 + r) * h + c] += dx[i];
    }
  });
}
void cross_entropy(const float* logits, const int* targets, bf16* dl, double* loss, int bb, int tq, int tt, int t0,
                   int V, float scale, cudaStream_t stream) {
  emu::launch(stream, [=] {
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
  });
}
void column_sum(const bf16* dy, float* db, int rows, int cols, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (int c = 0; c < cols; ++c) {
      float s = 0;
      for (int r = 0; r < rows; ++r) s += f(dy[i64(r) * cols + c]);
      db[c] += s;
    }
  });
}
void column_sum(const float* dy, float* db, int rows, int cols, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (int c = 0; c < cols; ++c) {
      float s = 0;
      for (int r = 0; r < rows; ++r) s += dy[i64(r) * cols + c];
      db[c] += s;
    }
  });
}
void to_bf16(const float* x, bf16* y, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) y[i] = b(x[i]);
  });
}
void to_f32(const bf16* x, float* y, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) y[i] = f(x[i]);
  });
}
void adam(float* p, const float* g, float* m, float* v, bf16* pb, i64 n, float lr, float b1, float b2, float eps,
          float c1, float c2, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      if (pb) pb[i] = b(p[i]);
    }
  });
}
void adam_frozen_variance(float* p, const float* m, const float* v, bf16* pb, i64 n, float lr, float eps, float c1,
                          float c2, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) {
      p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      pb[i] = b(p[i]);
    }
  });
}
void onebit_momentum(float* m, const float* g, i64 n, float b1, float gs, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) m[i] = b1 * m[i] + (1 - b1) * gs * g[i];
  });
}
void onebit_compress(const float* x, float* e, i64 len, unsigned char* block, double* sum, cudaStream_t stream) {
  emu::launch(stream, [=] {
    double s2 = 0;
    for (i64 i = 0; i < len; ++i) s2 += double(x[i] + e[i]) * double(x[i] + e[i]);
    *sum = s2;
    const float s = len > 0 ? float(std::sqrt(s2 / double(len))) : 0.f;
    std::memcpy(block, &s, sizeof s);
    std::memset(block + 4, 0, static_cast<std::size_t>((len + 7) / 8));
    for (i64 i = 0; i < len; ++i) {
      const float c = x[i] + e[i];
      if (c >= 0.f) block[4 + i / 8] = static_cast<unsigned char>(block[4 + i / 8] | (1u << (i % 8)));
      e[i] = c - (c >= 0.f ? s : -s);
    }
  });
}
void onebit_expand(const unsigned char* block, i64 len, float w, float* out, bool acc, const float* keep,
                   cudaStream_t stream) {
  emu::launch(stream, [=] {
    float s;
    std::memcpy(&s, block, sizeof s);
    s *= w;
    for (i64 i = 0; i < len; ++i) {
      const float v = (block[4 + i / 8] >> (i % 8)) & 1u ? s : -s;
      out[i] = acc ? out[i] + v : keep != nullptr && keep[i] == 0.f ? 0.f : v;
    }
  });
}
}  // namespace tdpipe::exec::cuda::kernels
