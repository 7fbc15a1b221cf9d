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

/// An event owned by one object (moves leave none behind); `make` creates one without
/// timing (an order, not a clock).
struct OwnedEvent {
  cudaEvent_t e = nullptr;
  OwnedEvent() = default;
  static OwnedEvent make();
  OwnedEvent(OwnedEvent&& o) noexcept : e(std::exchange(o.e, nullptr)) {}
  OwnedEvent& operator=(OwnedEvent&& o) noexcept {
    std::swap(e, o.e);
    return *this;
  }
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  ~OwnedEvent() {
    if (e) cudaEventDestroy(e);
  }
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

/// A Buffer of `elements` fp32 (or `dtype`: BF16) on the current device, freed in order on
/// `stream` when its last copy goes away.
Buffer device_buffer(std::int64_t elements, cudaStream_t stream, DType dtype = DType::F32);
/// A zeroed Buffer of `bytes` bytes (DType::U8) on the current device, likewise.
Buffer device_bytes(std::int64_t bytes, cudaStream_t stream);

/// Stream order across streams for a Buffer of device_buffer (its fence). mark_ready:
/// the work issued on `stream` so far writes it (its producer returned with the work in
/// flight: an event is recorded there); throws tdpipe::Error for another kind of Buffer.
void mark_ready(const Buffer& b, cudaStream_t stream);
/// `stream` is about to use the Buffer: it waits there for mark_ready's event, and the
/// memory is freed in order on `stream` (after the work queued there when its last copy
/// goes), so `stream` must be its last user; every earlier use on another stream must be
/// ordered before it (a mark_ready, or a completion the host saw). A view (no fence):
/// nothing to do.
void use_on(const Buffer& b, cudaStream_t stream);

/// Keeps freed memory in the device's default pool instead of returning it to the
/// driver at every synchronisation (that would make each op pay cudaMalloc again).
void keep_pool_memory(int device);

}  // namespace tdpipe::exec::cuda
