// device_memory.hpp — internal to exec/cuda: stream-ordered device allocations
// (cudaMallocAsync from the device's default pool, kept cached) and Buffers that
// own device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include <cuda_runtime.h>

#include "tdpipe/exec/buffer.hpp"

namespace tdpipe::exec::cuda {

/// Device memory owned by one object, allocated and freed in order on `stream`.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(std::size_t bytes, cudaStream_t stream, bool zero = false);
  ~DeviceMemory() { reset(); }
  DeviceMemory(DeviceMemory&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_), stream_(o.stream_) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = o.bytes_;
      stream_ = o.stream_;
    }
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void reset();
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

/// A Buffer of `elements` fp32 on the current device, freed in order on `stream`
/// when its last copy goes away.
Buffer device_buffer(std::int64_t elements, cudaStream_t stream);
/// A zeroed Buffer of `bytes` bytes (DType::U8) on the current device, likewise.
Buffer device_bytes(std::int64_t bytes, cudaStream_t stream);

/// Keeps freed memory in the device's default pool instead of returning it to the
/// driver at every synchronisation (that would make each op pay cudaMalloc again).
void keep_pool_memory(int device);

}  // namespace tdpipe::exec::cuda
