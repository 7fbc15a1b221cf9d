// gemm.cpp — row-major bf16 GEMMs with fp32 accumulation over cuBLAS.
#include "gemm.hpp"

#include "check.hpp"

namespace tdpipe::exec::cuda {

void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const MatRef& a, const MatRef& b, float beta, const MatOut& c, int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  // Column-major view: Cᵀ (n×m) = op(B)ᵀ (n×k) · op(A)ᵀ (k×m).
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    TDPIPE_CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, b.data, b.type, b.ld, a.data,
                                     a.type, a.ld, &beta, c.data, c.type, c.ld, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
    return;
  }
  TDPIPE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, op_b, op_a, n, m, k, &alpha, b.data, b.type, b.ld, b.batch_stride, a.data, a.type, a.ld,
      a.batch_stride, &beta, c.data, c.type, c.ld, c.batch_stride, batch, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace tdpipe::exec::cuda
