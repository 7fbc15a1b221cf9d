// gemm.cpp — row-major bf16 GEMMs with fp32 accumulation over cuBLAS.
#include "gemm.hpp"

#include <algorithm>

#include "check.hpp"

namespace tdpipe::exec::cuda {

CublasGemmArgs to_cublas(bool trans_a, bool trans_b, int m, int n, int k, const RowMajorOperand& a,
                         const RowMajorOperand& b) {
  // A row-major r×c matrix with row stride ld is, to cuBLAS, the column-major c×r
  // matrix (its transpose) with leading dimension ld. So Cᵀ (n×m) = op(B)ᵀ (n×k) ·
  // op(A)ᵀ (k×m): B goes first, untransposed by cuBLAS exactly when it is
  // untransposed in the row-major product, and likewise A.
  CublasGemmArgs r;
  r.trans_first = trans_b;
  r.trans_second = trans_a;
  r.m = n;
  r.n = m;
  r.k = k;
  r.first = b;
  r.second = a;
  return r;
}

std::string gemm_layout_error(bool trans_a, bool trans_b, int m, int n, int k, const RowMajorOperand& a,
                              const RowMajorOperand& b, int ldc, std::int64_t c_batch_stride, int batch) {
  auto shape = [&] {
    return " (row-major C[" + std::to_string(m) + "×" + std::to_string(n) + "] = " + (trans_a ? "Aᵀ" : "A") +
           "·" + (trans_b ? "Bᵀ" : "B") + ", k = " + std::to_string(k) + ", batch " + std::to_string(batch) + ")";
  };
  if (m < 0 || n < 0 || k < 0 || batch < 0) return "negative size" + shape();
  // Row length of each stored (row-major) matrix.
  const int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  auto too_short = [&](const char* which, int ld, int cols) {
    return std::string("ld") + which + " = " + std::to_string(ld) + " < " + std::to_string(cols) +
           " columns of the stored " + which + shape();
  };
  if (a.ld < std::max(1, a_cols)) return too_short("A", a.ld, a_cols);
  if (b.ld < std::max(1, b_cols)) return too_short("B", b.ld, b_cols);
  if (ldc < std::max(1, n)) return too_short("C", ldc, n);
  if (batch > 1) {
    // Inputs may be shared (stride 0); outputs must not overlap.
    if (c_batch_stride < std::int64_t(m - 1) * ldc + n)
      return "C's batch stride " + std::to_string(c_batch_stride) + " overlaps the previous member" + shape();
    if (a.batch_stride < 0 || b.batch_stride < 0) return "negative batch stride" + shape();
  }
  return {};
}

void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const MatRef& a, const MatRef& b, float beta, const MatOut& c, int batch) {
  const RowMajorOperand ra{a.data, a.ld, a.batch_stride}, rb{b.data, b.ld, b.batch_stride};
  const std::string bad = gemm_layout_error(trans_a, trans_b, m, n, k, ra, rb, c.ld, c.batch_stride, batch);
  if (!bad.empty()) throw Error("gemm: " + bad);
  if (m == 0 || n == 0 || batch == 0) return;
  const CublasGemmArgs g = to_cublas(trans_a, trans_b, m, n, k, ra, rb);
  const cublasOperation_t op_first = g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
  // The operand types travel with the operands: first is our B, second our A.
  if (batch == 1) {
    TDPIPE_CUBLAS_CHECK(cublasGemmEx(handle, op_first, op_second, g.m, g.n, g.k, &alpha, g.first.data, b.type,
                                     g.first.ld, g.second.data, a.type, g.second.ld, &beta, c.data, c.type, c.ld,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  TDPIPE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, op_first, op_second, g.m, g.n, g.k, &alpha, g.first.data, b.type, g.first.ld, g.first.batch_stride,
      g.second.data, a.type, g.second.ld, g.second.batch_stride, &beta, c.data, c.type, c.ld, c.batch_stride, batch,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace tdpipe::exec::cuda
