// test_kernel_index.cpp — the CUDA backend's index logic, run on CPU: the row-major →
// cuBLAS (column-major) GEMM mapping of exec/cuda/gemm.cpp against a host emulation
// of cuBLAS's documented contract, its layout checks, and the head-major / KV-cache
// indexing and causal mask of exec/cuda/kernels.cuh, composed the way gpt_cuda.cpp
// composes them for a sliced (TD-Pipe) attention forward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#define TDPIPE_GEMM_MAPPING_ONLY
#define TDPIPE_KERNEL_INDEX_ONLY
#include "../../exec/cuda/gemm.hpp"
#include "../../exec/cuda/kernels.cuh"

using namespace tdpipe::exec::cuda;
using Catch::Matchers::Contains;

namespace {

using Vec = std::vector<float>;

// cublasGemmStridedBatchedEx as its documentation defines it: column-major,
// C(i, j) at C[i + j·ldc]; op(A) is m×k, A stored m×k (N) or k×m (T) with lda ≥ its
// row count; likewise B (k×n) and C (m×n). The leading-dimension rules are checked,
// as cuBLAS rejects a call that breaks them.
void cublas_emulate(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                    std::int64_t sa, const float* b, int ldb, std::int64_t sb, float beta, float* c, int ldc,
                    std::int64_t sc, int batch) {
  REQUIRE(lda >= std::max(1, ta ? k : m));
  REQUIRE(ldb >= std::max(1, tb ? n : k));
  REQUIRE(ldc >= std::max(1, m));
  for (int p = 0; p < batch; ++p) {
    const float* A = a + p * sa;
    const float* B = b + p * sb;
    float* C = c + p * sc;
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double s = 0;
        for (int l = 0; l < k; ++l) {
          const float x = ta ? A[l + std::int64_t(i) * lda] : A[i + std::int64_t(l) * lda];
          const float y = tb ? B[j + std::int64_t(l) * ldb] : B[l + std::int64_t(j) * ldb];
          s += double(x) * y;
        }
        float& out = C[i + std::int64_t(j) * ldc];
        out = static_cast<float>(alpha * s + (beta == 0.f ? 0.0 : double(beta) * out));
      }
  }
}

// What exec/cuda/gemm.cpp hands to cuBLAS, run on the emulation (fp32 data).
void mapped_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, std::int64_t sa,
                 const float* b, int ldb, std::int64_t sb, float beta, float* c, int ldc, std::int64_t sc,
                 int batch) {
  const RowMajorOperand ra{a, lda, sa}, rb{b, ldb, sb};
  REQUIRE(gemm_layout_error(ta, tb, m, n, k, ra, rb, ldc, sc, batch).empty());
  const CublasGemmArgs g = to_cublas(ta, tb, m, n, k, ra, rb);
  cublas_emulate(g.trans_first, g.trans_second, g.m, g.n, g.k, alpha, static_cast<const float*>(g.first.data),
                 g.first.ld, g.first.batch_stride, static_cast<const float*>(g.second.data), g.second.ld,
                 g.second.batch_stride, beta, c, ldc, sc, batch);
}

// Row-major reference: C[i][j] = alpha·Σ op(A)[i][l]·op(B)[l][j] + beta·C[i][j].
void row_major_reference(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int l = 0; l < k; ++l) {
        const float x = ta ? a[std::int64_t(l) * lda + i] : a[std::int64_t(i) * lda + l];
        const float y = tb ? b[std::int64_t(j) * ldb + l] : b[std::int64_t(l) * ldb + j];
        s += double(x) * y;
      }
      float& out = c[std::int64_t(i) * ldc + j];
      out = static_cast<float>(alpha * s + (beta == 0.f ? 0.0 : double(beta) * out));
    }
}

Vec ramp(std::size_t n, float step, float offset = 0.f) {
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = offset + step * static_cast<float>((i * 7919) % 23) - 0.3f;
  return v;
}

}  // namespace

TEST_CASE("gemm maps every row-major transpose combination onto column-major cuBLAS", "[cuda][gemm]") {
  const int m = 3, n = 5, k = 7, pad = 2;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 1.f}) {
        INFO("trans_a " << ta << " trans_b " << tb << " beta " << beta);
        // Stored shapes with padded row strides, so a swapped ld would read wrong data.
        const int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
        const Vec a = ramp(std::size_t(ta ? k : m) * lda, 0.11f);
        const Vec b = ramp(std::size_t(tb ? n : k) * ldb, 0.07f, 0.05f);
        Vec want = ramp(std::size_t(m) * ldc, 0.5f), got = want;
        row_major_reference(ta, tb, m, n, k, 1.5f, a.data(), lda, b.data(), ldb, beta, want.data(), ldc);
        mapped_gemm(ta, tb, m, n, k, 1.5f, a.data(), lda, 0, b.data(), ldb, 0, beta, got.data(), ldc, 0, 1);
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n + pad; ++j) {
            INFO("C[" << i << "][" << j << "]");
            // Padding columns (j ≥ n) must be left alone.
            CHECK(got[std::size_t(i) * ldc + j] == Approx(want[std::size_t(i) * ldc + j]).margin(1e-6));
          }
      }
}

TEST_CASE("batched gemm: per-member strides, a shared operand (stride 0) and beta = 1 accumulation",
          "[cuda][gemm]") {
  // The q/k/v projection of gpt_cuda.cpp: one input h shared by 3 members, 3 weights
  // back to back, 3 outputs back to back.
  const int N = 4, H = 6, batch = 3;
  const Vec h = ramp(std::size_t(N) * H, 0.13f);
  const Vec w = ramp(std::size_t(batch) * H * H, 0.03f, 0.01f);
  const std::int64_t nH = std::int64_t(N) * H;
  Vec got(std::size_t(batch) * nH, 9.f);
  mapped_gemm(false, false, N, H, H, 1.f, h.data(), H, 0, w.data(), H, std::int64_t(H) * H, 0.f, got.data(), H, nH,
              batch);
  for (int p = 0; p < batch; ++p) {
    Vec want(static_cast<std::size_t>(nH));
    row_major_reference(false, false, N, H, H, 1.f, h.data(), H, w.data() + p * H * H, H, 0.f, want.data(), H);
    for (std::int64_t i = 0; i < nH; ++i) CHECK(got[std::size_t(p * nH + i)] == Approx(want[std::size_t(i)]).margin(1e-6));
  }
  // The weight gradients of the same three: dW_p += hᵀ·dqkv_p (A transposed and shared).
  Vec gw = ramp(std::size_t(batch) * H * H, 0.2f), gw_want = gw;
  mapped_gemm(true, false, H, H, N, 1.f, h.data(), H, 0, got.data(), H, nH, 1.f, gw.data(), H, std::int64_t(H) * H,
              batch);
  for (int p = 0; p < batch; ++p)
    row_major_reference(true, false, H, H, N, 1.f, h.data(), H, got.data() + p * nH, H, 1.f,
                        gw_want.data() + p * H * H, H);
  for (std::size_t i = 0; i < gw.size(); ++i) CHECK(gw[i] == Approx(gw_want[i]).margin(1e-5));
}

TEST_CASE("gemm layout errors name the operand and the shape", "[cuda][gemm]") {
  const float x = 0;
  const RowMajorOperand ok_a{&x, 7, 0}, ok_b{&x, 5, 0};
  CHECK(gemm_layout_error(false, false, 3, 5, 7, ok_a, ok_b, 5, 0, 1).empty());
  // A untransposed is m×k: its rows hold k = 7.
  CHECK_THAT(gemm_layout_error(false, false, 3, 5, 7, {&x, 6, 0}, ok_b, 5, 0, 1),
             Contains("ldA = 6 < 7") && Contains("C[3×5] = A·B, k = 7"));
  // A transposed is stored k×m: rows of m = 3, so ld 3 is enough.
  CHECK(gemm_layout_error(true, false, 3, 5, 7, {&x, 3, 0}, ok_b, 5, 0, 1).empty());
  // B transposed is stored n×k: rows of k = 7.
  CHECK_THAT(gemm_layout_error(false, true, 3, 5, 7, ok_a, {&x, 5, 0}, 5, 0, 1), Contains("ldB = 5 < 7"));
  CHECK_THAT(gemm_layout_error(false, false, 3, 5, 7, ok_a, ok_b, 4, 0, 1), Contains("ldC = 4 < 5"));
  // Batched outputs may not overlap; a shared input is fine.
  CHECK(gemm_layout_error(false, false, 3, 5, 7, ok_a, ok_b, 5, 15, 2).empty());
  CHECK_THAT(gemm_layout_error(false, false, 3, 5, 7, ok_a, ok_b, 5, 14, 2), Contains("batch stride 14 overlaps"));
}

TEST_CASE("causal mask with the slice prefix: visible keys are 0 … t0 + r", "[cuda][kernels]") {
  const int seq = 11;
  for (int t0 = 0; t0 < seq; ++t0)
    for (int t1 = t0 + 1; t1 <= seq; ++t1)
      for (int r = 0; r < t1 - t0; ++r) {
        // The CPU model's rule (cpu_gpt.cpp): key c is kept iff c ≤ t0 + r, over c < t1.
        int kept = 0;
        for (int c = 0; c < t1; ++c) kept += c <= t0 + r;
        CHECK(kernels::visible_keys(t0, r, t1) == kept);
      }
}

TEST_CASE("head-major layout is a permutation, and the KV cache holds slice rows at t0 …", "[cuda][kernels]") {
  const int b = 2, heads = 3, dh = 4, h = heads * dh, tq = 5;
  std::set<std::int64_t> seen;
  for (int s = 0; s < b; ++s)
    for (int r = 0; r < tq; ++r)
      for (int c = 0; c < h; ++c) seen.insert(kernels::head_major_index(s, r, c, heads, dh, tq, 0));
  REQUIRE(seen.size() == std::size_t(b) * tq * h);
  CHECK(*seen.begin() == 0);
  CHECK(*seen.rbegin() == std::int64_t(b) * tq * h - 1);
  // Cache [b·H, seq, dh]: token t0 + r of sequence s, head hd, lane d.
  CHECK(kernels::head_major_index(1, 2, 2 * dh + 3, heads, dh, 16, 7) == ((1 * heads + 2) * 16 + 9) * dh + 3);
}

TEST_CASE("sliced attention, composed like gpt_cuda.cpp, equals full causal attention forward and back",
          "[cuda][kernels]") {
  // One layer's attention core, slice by slice as gpt_cuda.cpp runs it. Forward:
  // q, k, v rows of the slice → head-major q and the caches [b·H, S, dh] → scores =
  // q·kᵀ over keys 0 … t1 − 1 → masked softmax → o = p·v → merged rows. Backward,
  // slices in reverse: dp = dO·vᵀ, dv_cache += pᵀ·dO, ds, dq = ds·k, dk_cache +=
  // dsᵀ·q, then rows t0 … of the caches are this slice's dk, dv. Reference: each
  // sequence's full causal attention and its gradients at once, in double.
  const int b = 2, heads = 2, dh = 3, h = heads * dh, S = 9, bh = b * heads;
  const std::vector<int> offsets = {0, 4, 7, 9};  // three uneven slices
  const int slices = static_cast<int>(offsets.size()) - 1;
  const float scale = 1.f / std::sqrt(float(dh));
  // Full-sequence tensors, row-major [b·S, h]; slice rows are cut out of them.
  const Vec q_all = ramp(std::size_t(b) * S * h, 0.09f), k_all = ramp(std::size_t(b) * S * h, 0.05f, 0.02f);
  const Vec v_all = ramp(std::size_t(b) * S * h, 0.04f, -0.03f), do_all = ramp(std::size_t(b) * S * h, 0.06f, 0.1f);
  auto hmi = [&](int s, int r, int c, int rows, int row0) {
    return std::size_t(kernels::head_major_index(s, r, c, heads, dh, rows, row0));
  };
  auto row_of = [&](int s, int tok, int c) { return (std::size_t(s) * S + tok) * h + c; };

  Vec kc(std::size_t(bh) * S * dh, NAN), vc = kc;  // rows no slice wrote stay NaN: reading one shows
  Vec dkc(kc.size(), 0.f), dvc(kc.size(), 0.f);   // zeroed like kv_of's gradient caches
  std::vector<Vec> q_of(static_cast<std::size_t>(slices)), p_of(static_cast<std::size_t>(slices));
  Vec got(std::size_t(b) * S * h, NAN), got_dq = got, got_dk = got, got_dv = got;
  for (int sl = 0; sl < slices; ++sl) {
    const int t0 = offsets[std::size_t(sl)], t1 = offsets[std::size_t(sl) + 1], T = t1 - t0;
    Vec& q = q_of[std::size_t(sl)];
    q.assign(std::size_t(bh) * T * dh, 0.f);
    for (int s = 0; s < b; ++s)  // split_qkv
      for (int r = 0; r < T; ++r)
        for (int c = 0; c < h; ++c) {
          q[hmi(s, r, c, T, 0)] = q_all[row_of(s, t0 + r, c)];
          kc[hmi(s, r, c, S, t0)] = k_all[row_of(s, t0 + r, c)];
          vc[hmi(s, r, c, S, t0)] = v_all[row_of(s, t0 + r, c)];
        }
    Vec scores(std::size_t(bh) * T * t1);
    mapped_gemm(false, true, T, t1, dh, scale, q.data(), dh, std::int64_t(T) * dh, kc.data(), dh,
                std::int64_t(S) * dh, 0.f, scores.data(), t1, std::int64_t(T) * t1, bh);
    Vec& p = p_of[std::size_t(sl)];
    p.assign(scores.size(), 0.f);
    for (int row = 0; row < bh * T; ++row) {  // causal_softmax
      const int vis = kernels::visible_keys(t0, row % T, t1);
      const float* sr = &scores[std::size_t(row) * t1];
      const float mx = *std::max_element(sr, sr + vis);
      double z = 0;
      for (int c = 0; c < vis; ++c) z += std::exp(double(sr[c]) - mx);
      for (int c = 0; c < t1; ++c)
        p[std::size_t(row) * t1 + c] = c < vis ? float(std::exp(double(sr[c]) - mx) / z) : 0.f;
    }
    Vec o(std::size_t(bh) * T * dh);
    mapped_gemm(false, false, T, dh, t1, 1.f, p.data(), t1, std::int64_t(T) * t1, vc.data(), dh,
                std::int64_t(S) * dh, 0.f, o.data(), dh, std::int64_t(T) * dh, bh);
    for (int s = 0; s < b; ++s)  // merge_heads
      for (int r = 0; r < T; ++r)
        for (int c = 0; c < h; ++c) got[row_of(s, t0 + r, c)] = o[hmi(s, r, c, T, 0)];
  }
  for (int sl = slices - 1; sl >= 0; --sl) {
    const int t0 = offsets[std::size_t(sl)], t1 = offsets[std::size_t(sl) + 1], T = t1 - t0;
    const std::int64_t sq = std::int64_t(T) * t1, skv = std::int64_t(S) * dh, sd = std::int64_t(T) * dh;
    const Vec& q = q_of[std::size_t(sl)];
    const Vec& p = p_of[std::size_t(sl)];
    Vec dO(std::size_t(bh) * T * dh);
    for (int s = 0; s < b; ++s)  // split_heads
      for (int r = 0; r < T; ++r)
        for (int c = 0; c < h; ++c) dO[hmi(s, r, c, T, 0)] = do_all[row_of(s, t0 + r, c)];
    Vec dp(std::size_t(bh) * sq);
    mapped_gemm(false, true, T, t1, dh, 1.f, dO.data(), dh, sd, vc.data(), dh, skv, 0.f, dp.data(), t1, sq, bh);
    mapped_gemm(true, false, t1, dh, T, 1.f, p.data(), t1, sq, dO.data(), dh, sd, 1.f, dvc.data(), dh, skv, bh);
    Vec ds(dp.size());
    for (int row = 0; row < bh * T; ++row) {  // softmax_backward
      double dot = 0;
      for (int c = 0; c < t1; ++c) dot += double(p[std::size_t(row) * t1 + c]) * dp[std::size_t(row) * t1 + c];
      for (int c = 0; c < t1; ++c) {
        const std::size_t i = std::size_t(row) * t1 + c;
        ds[i] = float(scale * p[i] * (dp[i] - dot));
      }
    }
    Vec dq(std::size_t(bh) * sd);
    mapped_gemm(false, false, T, dh, t1, 1.f, ds.data(), t1, sq, kc.data(), dh, skv, 0.f, dq.data(), dh, sd, bh);
    mapped_gemm(true, false, t1, dh, T, 1.f, ds.data(), t1, sq, q.data(), dh, sd, 1.f, dkc.data(), dh, skv, bh);
    for (int s = 0; s < b; ++s)  // gather_dqkv
      for (int r = 0; r < T; ++r)
        for (int c = 0; c < h; ++c) {
          got_dq[row_of(s, t0 + r, c)] = dq[hmi(s, r, c, T, 0)];
          got_dk[row_of(s, t0 + r, c)] = dkc[hmi(s, r, c, S, t0)];
          got_dv[row_of(s, t0 + r, c)] = dvc[hmi(s, r, c, S, t0)];
        }
  }

  for (int s = 0; s < b; ++s)
    for (int hd = 0; hd < heads; ++hd) {
      auto at = [&](const Vec& x, int tok, int d) { return double(x[row_of(s, tok, hd * dh + d)]); };
      // P[t][u] (u ≤ t) and its gradient path, in double.
      std::vector<std::vector<double>> P(std::size_t(S), std::vector<double>(std::size_t(S), 0.0)), dS = P;
      for (int t = 0; t < S; ++t) {
        double mx = -INFINITY, z = 0;
        for (int u = 0; u <= t; ++u) {
          double dot = 0;
          for (int d = 0; d < dh; ++d) dot += at(q_all, t, d) * at(k_all, u, d);
          P[std::size_t(t)][std::size_t(u)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        for (int u = 0; u <= t; ++u) z += (P[std::size_t(t)][std::size_t(u)] = std::exp(P[std::size_t(t)][std::size_t(u)] - mx));
        for (int u = 0; u <= t; ++u) P[std::size_t(t)][std::size_t(u)] /= z;
        std::vector<double> dP(std::size_t(t) + 1);
        double D = 0;
        for (int u = 0; u <= t; ++u) {
          for (int d = 0; d < dh; ++d) dP[std::size_t(u)] += at(do_all, t, d) * at(v_all, u, d);
          D += P[std::size_t(t)][std::size_t(u)] * dP[std::size_t(u)];
        }
        for (int u = 0; u <= t; ++u)
          dS[std::size_t(t)][std::size_t(u)] = scale * P[std::size_t(t)][std::size_t(u)] * (dP[std::size_t(u)] - D);
      }
      for (int t = 0; t < S; ++t)
        for (int d = 0; d < dh; ++d) {
          double o = 0, dq = 0, dk = 0, dv = 0;
          for (int u = 0; u < S; ++u) {
            o += P[std::size_t(t)][std::size_t(u)] * at(v_all, u, d);
            dq += dS[std::size_t(t)][std::size_t(u)] * at(k_all, u, d);
            dk += dS[std::size_t(u)][std::size_t(t)] * at(q_all, u, d);  // key t, over queries u ≥ t
            dv += P[std::size_t(u)][std::size_t(t)] * at(do_all, u, d);
          }
          INFO("sequence " << s << " head " << hd << " token " << t << " lane " << d);
          CHECK(at(got, t, d) == Approx(o).margin(1e-5));
          CHECK(at(got_dq, t, d) == Approx(dq).margin(1e-5));
          CHECK(at(got_dk, t, d) == Approx(dk).margin(1e-5));
          CHECK(at(got_dv, t, d) == Approx(dv).margin(1e-5));
        }
    }
}
