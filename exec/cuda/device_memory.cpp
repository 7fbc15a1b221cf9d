// device_memory.cpp — stream-ordered device allocations and device Buffers.
#include "device_memory.hpp"

#include <cstdint>
#include <cstdio>
#include <limits>

#include "check.hpp"

namespace tdpipe::exec::cuda {

DeviceMemory::DeviceMemory(std::size_t bytes, cudaStream_t stream, bool zero)
    : bytes_(bytes), stream_(stream) {
  if (bytes == 0) return;
  TDPIPE_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
  if (zero) TDPIPE_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes, stream));
}

void DeviceMemory::reset() {
  if (ptr_ == nullptr) return;
  // A destructor must not throw: report and go on (the context is broken anyway).
  cudaError_t status = cudaFreeAsync(ptr_, stream_);
  if (status != cudaSuccess)
    std::fprintf(stderr, "tdpipe: cudaFreeAsync failed: %s\n", cudaGetErrorString(status));
  ptr_ = nullptr;
}

Buffer device_buffer(std::int64_t elements, cudaStream_t stream) {
  void* p = nullptr;
  const std::size_t bytes = static_cast<std::size_t>(elements > 0 ? elements : 1) * sizeof(float);
  TDPIPE_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  Buffer b;
  b.data = std::shared_ptr<void>(p, [stream](void* q) {
    cudaError_t status = cudaFreeAsync(q, stream);
    if (status != cudaSuccess)
      std::fprintf(stderr, "tdpipe: cudaFreeAsync failed: %s\n", cudaGetErrorString(status));
  });
  b.elements = elements;
  b.dtype = DType::F32;
  return b;
}

void keep_pool_memory(int device) {
  cudaMemPool_t pool = nullptr;
  TDPIPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  TDPIPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

}  // namespace tdpipe::exec::cuda
