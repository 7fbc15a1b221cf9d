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
  /// Frees in order on `stream` instead of the allocating one: after the work queued
  /// there, which must be the last to use the memory.
  void reset_on(cudaStream_t stream) {
    stream_ = stream;
    reset();
  }
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

/// `n` floats of pinned host memory (cudaMallocHost), zeroed: what copies on a stream
/// read and write asynchronously, at the link's full bandwidth.
class PinnedFloats {
 public:
  PinnedFloats() = default;
  explicit PinnedFloats(std::size_t n);
  ~PinnedFloats();
  PinnedFloats(PinnedFloats&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedFloats& operator=(PinnedFloats&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  PinnedFloats(const PinnedFloats&) = delete;
  PinnedFloats& operator=(const PinnedFloats&) = delete;
  float* data() const { return ptr_; }
  std::size_t size() const { return n_; }
  float* begin() const { return ptr_; }
  float* end() const { return ptr_ + n_; }

 private:
  float* ptr_ = nullptr;
  std::size_t n_ = 0;
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
