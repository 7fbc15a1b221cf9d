#pragma once
#include "cuda_runtime.h"
typedef struct cublasContext* cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 };
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
/// The handle's workspace (what graph capture needs: cuBLAS then allocates none itself);
/// checked for a device pointer of at least `bytes`, unused by the emulated GEMMs.
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, std::size_t bytes);
const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
// Column-major cuBLAS semantics, emulated on the host on the handle's stream (emu_runtime.cpp).
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType at, int lda,
                                          long long sa, const void* B, cudaDataType bt, int ldb, long long sb,
                                          const void* beta, void* C, cudaDataType ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t, cublasGemmAlgo_t);
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* A, cudaDataType at, int lda, const void* B,
                                   cudaDataType bt, int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                                   cublasComputeType_t c, cublasGemmAlgo_t g) {
  return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                                    c, g);
}
