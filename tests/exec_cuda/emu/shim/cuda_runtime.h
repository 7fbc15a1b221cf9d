// Host shim of the few CUDA runtime names exec/cuda/gpt_cuda.cpp uses (tests/exec_cuda/emu: host emulation only).
#pragma once
#include <cstddef>
#include <cstring>
#include <cstdlib>
typedef struct CUstream_st* cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNotReady = 600 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
typedef enum { CUDA_R_16BF = 14, CUDA_R_32F = 0 } cudaDataType;
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  if (n) std::memmove(d, s, n);
  return 0;
}
inline cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) {
  if (n) std::memset(d, v, n);
  return 0;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return 0; }
inline cudaError_t cudaGetLastError() { return 0; }
