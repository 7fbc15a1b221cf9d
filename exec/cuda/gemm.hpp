// gemm.hpp — internal to exec/cuda: row-major GEMMs on cuBLAS with bf16 inputs and
// fp32 accumulation (CUBLAS_COMPUTE_32F). cuBLAS is column-major; a row-major
// C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so these wrappers swap
// the operands instead of transposing anything.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace tdpipe::exec::cuda {

/// A row-major matrix operand: pointer, element type, row stride (elements) and,
/// for batched calls, the stride between batch members (elements; 0 = shared).
struct MatRef {
  const void* data = nullptr;
  cudaDataType type = CUDA_R_16BF;
  int ld = 0;
  std::int64_t batch_stride = 0;
};
struct MatOut {
  void* data = nullptr;
  cudaDataType type = CUDA_R_32F;
  int ld = 0;
  std::int64_t batch_stride = 0;
};

/// C[M×N] = alpha · op(A)[M×K] · op(B)[K×N] + beta · C, row-major; `batch` members.
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const MatRef& a, const MatRef& b, float beta, const MatOut& c, int batch = 1);

}  // namespace tdpipe::exec::cuda
