// device_memory.cpp — stream-ordered device allocations and device Buffers.
#include "device_memory.hpp"

#include <algorithm>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>

#include "check.hpp"
#include "op_graphs.hpp"

namespace tdpipe::exec::cuda {

namespace {
// cudaMallocAsync with the size in the message when the device is full: activations
// are allocated op by op, so this is where a too-large plan runs out.
void* allocate(std::size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  if (graph_allocate(bytes, stream, &p)) return p;  // an op's graph's memory node
  const cudaError_t status = cudaMallocAsync(&p, bytes, stream);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so the message below is the one seen
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    char what[256];
    std::snprintf(what, sizeof what,
                  "GPU out of memory allocating %.1f MiB (the driver reports %.2f GiB free of %.2f GiB; "
                  "memory cached in the pool of every rank on this GPU counts as used): lower micro_batch, "
                  "seq or layers, or use a schedule that keeps fewer micro-batches in flight",
                  static_cast<double>(bytes) / (1 << 20), static_cast<double>(free_b) / (1 << 30),
                  static_cast<double>(total_b) / (1 << 30));
    throw Error(what);
  }
  TDPIPE_CUDA_CHECK(status);
  return p;
}
}  // namespace

DeviceMemory::DeviceMemory(std::size_t bytes, cudaStream_t stream, bool zero)
    : bytes_(bytes), stream_(stream) {
  if (bytes == 0) return;
  ptr_ = allocate(bytes, stream);
  if (zero && issuing()) TDPIPE_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes, stream));
}

void DeviceMemory::reset() {
  if (ptr_ == nullptr) return;
  free_device(ptr_, stream_);
  ptr_ = nullptr;
}

namespace {
// A device Buffer's deleter, which also carries its fence (std::get_deleter finds it):
// the event its producer recorded, and the stream its last user ran on, where the
// memory is freed in order.
struct DeviceFree {
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  void operator()(void* q) const {
    free_device(q, stream);
    if (ready) cudaEventDestroy(ready);  // (released by the driver once it completed)
  }
};
DeviceFree* fence_of(const Buffer& b) { return std::get_deleter<DeviceFree>(b.data); }
}  // namespace

Buffer device_buffer(std::int64_t elements, cudaStream_t stream, DType dtype) {
  const auto bytes = static_cast<std::size_t>(std::max<std::int64_t>(elements, 1) * dtype_bytes(dtype));
  void* p = allocate(bytes, stream);
  Buffer b;
  b.data = std::shared_ptr<void>(p, DeviceFree{stream});
  b.elements = elements;
  b.dtype = dtype;
  return b;
}

void mark_ready(const Buffer& b, cudaStream_t stream) {
  DeviceFree* f = fence_of(b);
  if (f == nullptr) throw Error("mark_ready: not a buffer of device_buffer");
  if (f->ready == nullptr) TDPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&f->ready, cudaEventDisableTiming));
  TDPIPE_CUDA_CHECK(cudaEventRecord(f->ready, stream));
}

void use_on(const Buffer& b, cudaStream_t stream) {
  DeviceFree* f = fence_of(b);
  if (f == nullptr) return;  // a view: its owner orders its uses
  if (f->ready) TDPIPE_CUDA_CHECK(cudaStreamWaitEvent(stream, f->ready, 0));
  f->stream = stream;
}

Buffer device_bytes(std::int64_t bytes, cudaStream_t stream) {
  Buffer b = device_buffer(bytes, stream, DType::U8);
  TDPIPE_CUDA_CHECK(cudaMemsetAsync(b.data.get(), 0, static_cast<std::size_t>(bytes > 0 ? bytes : 1), stream));
  return b;
}

OwnedEvent OwnedEvent::make() {
  OwnedEvent ev;
  TDPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&ev.e, cudaEventDisableTiming));
  return ev;
}

PinnedFloats::PinnedFloats(std::size_t n) : n_(n) {
  if (n == 0) return;
  void* p = nullptr;
  TDPIPE_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(float)));
  ptr_ = static_cast<float*>(p);
  std::fill(ptr_, ptr_ + n, 0.f);
}

PinnedFloats::~PinnedFloats() {
  if (ptr_ == nullptr) return;
  const cudaError_t status = cudaFreeHost(ptr_);
  if (status != cudaSuccess) std::fprintf(stderr, "tdpipe: cudaFreeHost failed: %s\n", cudaGetErrorString(status));
}

void keep_pool_memory(int device) {
  cudaMemPool_t pool = nullptr;
  TDPIPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  TDPIPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  // Loopback ranks share this pool, each on its own streams. By default
  // cudaMallocAsync may hand one stream a block another stream freed but has not yet
  // reached, making the new stream wait for the other's queued work: a hidden
  // dependency between two ranks' compute streams that the plan does not have, and
  // that would show up in the measured timeline. Reuse across streams only once the
  // free has completed (opportunistic reuse, still on); same-stream reuse is unaffected.
  int no = 0;
  TDPIPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no));
}

}  // namespace tdpipe::exec::cuda
