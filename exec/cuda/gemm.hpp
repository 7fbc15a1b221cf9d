// gemm.hpp — internal to exec/cuda: row-major GEMMs on cuBLAS with bf16 inputs and
// fp32 accumulation (CUBLAS_COMPUTE_32F). cuBLAS is column-major; a row-major
// C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so these wrappers swap
// the operands instead of transposing anything.
//
// The mapping onto cuBLAS's arguments and the layout checks are plain C++ (first
// part, no CUDA header) so tests/exec_cuda/test_kernel_index.cpp can run them on a
// machine without a GPU against a host emulation of cuBLAS's column-major contract;
// define TDPIPE_GEMM_MAPPING_ONLY before including to get only that part.
#pragma once

#include <cstdint>
#include <string>

namespace tdpipe::exec::cuda {

/// A row-major operand as the mapping sees it: data, row stride (elements) and the
/// stride between batch members (elements; 0 = one matrix shared by every member).
struct RowMajorOperand {
  const void* data = nullptr;
  int ld = 0;
  std::int64_t batch_stride = 0;
};

/// The arguments of one cublasGemm(StridedBatched)Ex call, in cuBLAS's order:
/// C' (m×n, column-major) = op(first)·op(second), with first = our B and second = our A.
struct CublasGemmArgs {
  bool trans_first = false, trans_second = false;
  int m = 0, n = 0, k = 0;
  RowMajorOperand first, second;
};

/// Row-major C[m×n] = op(A)[m×k]·op(B)[k×n] as the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ.
CublasGemmArgs to_cublas(bool trans_a, bool trans_b, int m, int n, int k, const RowMajorOperand& a,
                         const RowMajorOperand& b);

/// "" when the row strides hold the rows (ld ≥ row length of each stored matrix) and
/// batched outputs do not overlap; otherwise what is wrong, naming the operand.
std::string gemm_layout_error(bool trans_a, bool trans_b, int m, int n, int k, const RowMajorOperand& a,
                              const RowMajorOperand& b, int ldc, std::int64_t c_batch_stride, int batch);

}  // namespace tdpipe::exec::cuda

#ifndef TDPIPE_GEMM_MAPPING_ONLY

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
/// alpha and beta are fp32 (the scale type of CUBLAS_COMPUTE_32F). Throws
/// tdpipe::Error on a layout that cannot hold the shapes, before cuBLAS sees it.
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const MatRef& a, const MatRef& b, float beta, const MatOut& c, int batch = 1);

}  // namespace tdpipe::exec::cuda

#endif  // TDPIPE_GEMM_MAPPING_ONLY
