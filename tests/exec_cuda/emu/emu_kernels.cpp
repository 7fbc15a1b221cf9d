// emu_kernels.cpp — each kernel of exec/cuda/kernels.cuh emulated on the host by its
// contract (plain loops), launched on its stream like a kernel (emu::launch); the
// SIMT tests run kernels.cu itself instead (simt/).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.cuh"

using tdpipe::exec::cuda::kernels::bf16;

namespace tdpipe::exec::cuda::kernels {
using i64 = std::int64_t;
using tdpipe::exec::cuda::kernels::half;
static float f(bf16 x) { return __bfloat162float(x); }
static float f(half x) { return __half2float(x); }
static float f(float x) { return x; }
template <class T>
T to(float x);
template <>
bf16 to<bf16>(float x) { return __float2bfloat16(x); }
template <>
half to<half>(float x) { return __float2half(x); }

template <class T16>
void layernorm_forward(const float* x, const float* g, const float* be, T16* y, float* mean, float* rstd, int rows,
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
      for (int c = 0; c < cols; ++c) y[i64(r) * cols + c] = to<T16>((xr[c] - mu) * rs * g[c] + be[c]);
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
                               float* db, int rows, int cols, float scale, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (int c = 0; c < cols; ++c) {
      float sg = 0, sb = 0;
      for (int r = 0; r < rows; ++r) {
        i64 i = i64(r) * cols + c;
        sg += dy[i] * (x[i] - mean[r]) * rstd[r];
        sb += dy[i];
      }
      dg[c] += scale * sg;
      db[c] += scale * sb;
    }
  });
}
template <class T16>
void bias_add(T16* y, const float* bb, int rows, int cols, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < i64(rows) * cols; ++i) y[i] = to<T16>(f(y[i]) + bb[i % cols]);
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
template <class T16>
void gelu_forward(const T16* u, T16* g, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) g[i] = to<T16>(gl(f(u[i])));
  });
}
template <class T16>
void gelu_backward(const T16* dg, const T16* u, T16* du, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) du[i] = to<T16>(f(dg[i]) * glg(f(u[i])));
  });
}
template <class T16>
void split_qkv(const T16* qkv, T16* q, T16* kc, T16* vc, int bb, int tq, int tt, int t0, int heads, int dh,
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
// Fused attention's contracts (kernels.cuh), with the explicit score matrix of each
// (sequence, head) in host memory; fp32 arithmetic, 16-bit roundings only at the outputs.
template <class T16>
void flash_attention_forward(const T16* q, const T16* kc, const T16* vc, T16* o, float* lse, int bh, int tq, int tt,
                             int t0, int dh, float scale, cudaStream_t stream) {
  check_flash_attention(dh, tq, t0, tt);
  emu::launch(stream, [=] {
    std::vector<float> s(static_cast<std::size_t>(t0 + tq));
    for (i64 hd = 0; hd < bh; ++hd)
      for (int r = 0; r < tq; ++r) {
        const T16* qr = q + (hd * tq + r) * dh;
        const int vis = visible_keys(t0, r, t0 + tq);
        float m = -INFINITY, z = 0;
        for (int k = 0; k < vis; ++k) {
          const T16* kr = kc + (hd * tt + k) * dh;
          float dot = 0;
          for (int d = 0; d < dh; ++d) dot += f(qr[d]) * f(kr[d]);
          s[k] = scale * dot;
          m = std::max(m, s[k]);
        }
        for (int k = 0; k < vis; ++k) z += std::exp(s[k] - m);
        for (int d = 0; d < dh; ++d) {
          float acc = 0;
          for (int k = 0; k < vis; ++k) acc += std::exp(s[k] - m) * f(vc[(hd * tt + k) * dh + d]);
          o[(hd * tq + r) * dh + d] = to<T16>(acc / z);
        }
        lse[hd * tq + r] = m + std::log(z);
      }
  });
}
template <class T16>
void flash_attention_backward(const T16* q, const T16* kc, const T16* vc, const T16* o, const T16* dout,
                              const float* lse, float* delta, T16* dq, float* dk, float* dv, int bh, int tq, int tt,
                              int t0, int dh, float scale, float unscale, cudaStream_t stream) {
  check_flash_attention(dh, tq, t0, tt);
  emu::launch(stream, [=] {
    const int t1 = t0 + tq;
    std::vector<float> p(static_cast<std::size_t>(tq) * t1), ds(p.size());
    for (i64 hd = 0; hd < bh; ++hd) {
      const T16 *qh = q + hd * tq * dh, *kh = kc + hd * tt * dh, *vh = vc + hd * tt * dh, *doh = dout + hd * tq * dh;
      for (int r = 0; r < tq; ++r) {
        float dd = 0;
        for (int d = 0; d < dh; ++d) dd += f(doh[i64(r) * dh + d]) * f(o[(hd * tq + r) * dh + d]);
        delta[hd * tq + r] = dd;
        for (int k = 0; k < t1; ++k) {
          float s = 0, dp = 0;
          for (int d = 0; d < dh; ++d) {
            s += f(qh[i64(r) * dh + d]) * f(kh[i64(k) * dh + d]);
            dp += f(doh[i64(r) * dh + d]) * f(vh[i64(k) * dh + d]);
          }
          const bool seen = k < visible_keys(t0, r, t1);
          const std::size_t e = std::size_t(r) * t1 + k;
          p[e] = seen ? std::exp(scale * s - lse[hd * tq + r]) : 0.f;
          ds[e] = seen ? scale * p[e] * (dp - dd) : 0.f;
        }
      }
      for (int r = 0; r < tq; ++r)
        for (int d = 0; d < dh; ++d) {
          float acc = 0;
          for (int k = 0; k < t1; ++k) acc += ds[std::size_t(r) * t1 + k] * f(kh[i64(k) * dh + d]);
          dq[(hd * tq + r) * dh + d] = to<T16>(acc);
        }
      for (int k = 0; k < t1; ++k)
        for (int d = 0; d < dh; ++d) {
          float gk = 0, gv = 0;
          for (int r = 0; r < tq; ++r) {
            gk += ds[std::size_t(r) * t1 + k] * f(qh[i64(r) * dh + d]);
            gv += p[std::size_t(r) * t1 + k] * f(doh[i64(r) * dh + d]);
          }
          dk[(hd * tt + k) * dh + d] += unscale * gk;
          dv[(hd * tt + k) * dh + d] += unscale * gv;
        }
    }
  });
}
template <class T16>
void merge_heads(const T16* o, T16* out, int bb, int tq, int heads, int dh, cudaStream_t stream) {
  emu::launch(stream, [=] {
    int h = heads * dh;
    for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
      int c = int(i % h);
      i64 row = i / h;
      out[i] = o[head_major_index(int(row / tq), int(row % tq), c, heads, dh, tq, 0)];
    }
  });
}
template <class T16>
void split_heads(const T16* in, T16* o, int bb, int tq, int heads, int dh, cudaStream_t stream) {
  emu::launch(stream, [=] {
    int h = heads * dh;
    for (i64 i = 0; i < i64(bb) * tq * h; ++i) {
      int c = int(i % h);
      i64 row = i / h;
      o[head_major_index(int(row / tq), int(row % tq), c, heads, dh, tq, 0)] = in[i];
    }
  });
}
template <class T16>
void gather_dqkv(const T16* dq, const float* dk, const float* dv, T16* dqkv, int bb, int tq, int tt, int t0,
                 int heads, int dh, float kv_scale, cudaStream_t stream) {
  emu::launch(stream, [=] {
    int h = heads * dh;
    i64 n = i64(bb) * tq * h;
    for (i64 i = 0; i < n; ++i) {
      int c = int(i % h);
      i64 row = i / h;
      int seq = int(row / tq), r = int(row % tq);
      i64 kv = head_major_index(seq, r, c, heads, dh, tt, t0);
      dqkv[i] = dq[head_major_index(seq, r, c, heads, dh, tq, 0)];
      dqkv[n + i] = to<T16>(kv_scale * dk[kv]);
      dqkv[2 * n + i] = to<T16>(kv_scale * dv[kv]);
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
template <class T16>
void cross_entropy(const float* logits, const int* targets, T16* dl, double* loss, int bb, int tq, int tt, int t0,
                   int V, float scale, float grad_scale, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 row = 0; row < i64(bb) * tq; ++row) {
      int seq = int(row / tq), r = int(row % tq);
      int y = targets[i64(seq) * tt + t0 + r];
      const float* lr = logits + row * V;
      float m = -INFINITY, z = 0;
      for (int k = 0; k < V; ++k) m = std::max(m, lr[k]);
      for (int k = 0; k < V; ++k) z += std::exp(lr[k] - m);
      for (int k = 0; k < V; ++k) dl[row * V + k] = to<T16>(grad_scale * (std::exp(lr[k] - m) / z - (k == y ? 1.f : 0.f)));
      *loss += double(scale) * ((double(m) + std::log(double(z))) - lr[y]);
    }
  });
}
template <class T16>
void column_sum(const T16* dy, float* db, int rows, int cols, float scale, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (int c = 0; c < cols; ++c) {
      float s = 0;
      for (int r = 0; r < rows; ++r) s += f(dy[i64(r) * cols + c]);
      db[c] += scale * s;
    }
  });
}
void column_sum(const float* dy, float* db, int rows, int cols, float scale, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (int c = 0; c < cols; ++c) {
      float s = 0;
      for (int r = 0; r < rows; ++r) s += dy[i64(r) * cols + c];
      db[c] += scale * s;
    }
  });
}
template <class T16>
void to_16(const float* x, T16* y, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) y[i] = to<T16>(x[i]);
  });
}
template <class T16>
void to_f32(const T16* x, float* y, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) y[i] = f(x[i]);
  });
}
template <class T16>
void adam(float* p, const float* g, float* m, float* v, T16* pb, i64 n, float lr, float b1, float b2, float eps,
          float c1, float c2, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      if (pb) pb[i] = to<T16>(p[i]);
    }
  });
}
template <class T16>
void adam_frozen_variance(float* p, const float* m, const float* v, T16* pb, i64 n, float lr, float eps, float c1,
                          float c2, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) {
      p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      pb[i] = to<T16>(p[i]);
    }
  });
}
void scale(float* x, float s, i64 n, cudaStream_t stream) {
  emu::launch(stream, [=] {
    for (i64 i = 0; i < n; ++i) x[i] *= s;
  });
}
template <class T>
void flag_nonfinite(const T* x, int runs, i64 len, i64 stride, int* flag, const int* unless, cudaStream_t stream) {
  emu::launch(stream, [=] {
    if (unless != nullptr && *unless != 0) return;
    for (int r = 0; r < runs; ++r)
      for (i64 i = 0; i < len; ++i)
        if (!std::isfinite(f(x[r * stride + i]))) *flag = 1;
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
TDPIPE_KERNELS_INSTANTIATE_16(bf16)
TDPIPE_KERNELS_INSTANTIATE_16(half)
template void flag_nonfinite<float>(const float*, int, i64, i64, int*, const int*, cudaStream_t);
}  // namespace tdpipe::exec::cuda::kernels
