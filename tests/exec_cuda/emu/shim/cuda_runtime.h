// Host shim of the few CUDA runtime names exec/cuda/gpt_cuda.cpp and kernels.cu use
// (tests/exec_cuda/emu: host emulation only).
#pragma once
#include <cstddef>
#include <cstring>
#include <cstdlib>
typedef struct CUstream_st* cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidConfiguration = 9, cudaErrorNotReady = 600 };
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
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
// Set by an emulated kernel launch the GPU would refuse (simt/simt.hpp); read and cleared here.
inline cudaError_t emu_last_error = 0;
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu_last_error;
  emu_last_error = 0;
  return e;
}
