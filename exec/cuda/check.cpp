// check.cpp — turns CUDA / cuBLAS / NCCL status codes into tdpipe::Error.
#include "check.hpp"

#include <string>

namespace tdpipe::exec::cuda::detail {

namespace {
std::string where(const char* call, const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line) + ": " + call;
}
}  // namespace

void throw_cuda(cudaError_t status, const char* call, const char* file, int line) {
  std::string hint;
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver)
    hint = " (no usable CUDA GPU on this machine: run with --backend cpu, or on a GPU host)";
  else if (status == cudaErrorMemoryAllocation)
    hint = " (out of GPU memory: lower micro_batch, seq or layers in the scenario)";
  throw Error("CUDA error " + std::string(cudaGetErrorName(status)) + " — " +
              cudaGetErrorString(status) + " — in " + where(call, file, line) + hint);
}

void throw_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error("cuBLAS error " + std::string(cublasGetStatusName(status)) + " — " +
              cublasGetStatusString(status) + " — in " + where(call, file, line));
}

void throw_nccl(ncclResult_t status, const char* call, const char* file, int line) {
  // ncclGetLastError: NCCL's own sentence about the failure (peer, size, …), when it left one.
  const char* last = ncclGetLastError(nullptr);
  const std::string detail = last != nullptr && *last != '\0' ? std::string(" (NCCL: ") + last + ")" : "";
  throw Error("NCCL error " + std::to_string(static_cast<int>(status)) + " — " +
              ncclGetErrorString(status) + " — in " + where(call, file, line) + detail +
              " (set NCCL_DEBUG=INFO for NCCL's own log)");
}

}  // namespace tdpipe::exec::cuda::detail
