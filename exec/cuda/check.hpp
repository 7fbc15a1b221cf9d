// check.hpp — internal to exec/cuda: the one way every CUDA, cuBLAS and NCCL
// status is checked. Each failure becomes a tdpipe::Error naming the call, the
// file:line and the library's own description, so a failing run says what broke.
// Not installed, not included outside exec/ (STYLE: error macros stay in exec/).
#pragma once

#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda::detail {

[[noreturn]] void throw_cuda(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl(ncclResult_t status, const char* call, const char* file, int line);

}  // namespace tdpipe::exec::cuda::detail

#define TDPIPE_CUDA_CHECK(call)                                                     \
  do {                                                                              \
    cudaError_t tdpipe_status_ = (call);                                            \
    if (tdpipe_status_ != cudaSuccess)                                              \
      ::tdpipe::exec::cuda::detail::throw_cuda(tdpipe_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define TDPIPE_CUBLAS_CHECK(call)                                                   \
  do {                                                                              \
    cublasStatus_t tdpipe_status_ = (call);                                         \
    if (tdpipe_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::tdpipe::exec::cuda::detail::throw_cublas(tdpipe_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define TDPIPE_NCCL_CHECK(call)                                                     \
  do {                                                                              \
    ncclResult_t tdpipe_status_ = (call);                                           \
    if (tdpipe_status_ != ncclSuccess && tdpipe_status_ != ncclInProgress)          \
      ::tdpipe::exec::cuda::detail::throw_nccl(tdpipe_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks the last kernel launch (launch-configuration errors surface here;
/// execution errors surface at the next synchronising call).
#define TDPIPE_CUDA_CHECK_LAUNCH() TDPIPE_CUDA_CHECK(cudaGetLastError())
