// device_context.cpp — per-rank streams, cuBLAS handle, abortable waits.
#include "device_context.hpp"

#include <cstddef>
#include <cstdio>

#include "check.hpp"

namespace tdpipe::exec::cuda {

DeviceContext::DeviceContext(int device) : device_(device) {
  // Streams and the cuBLAS handle belong to the device current at creation.
  try {
    TDPIPE_CUDA_CHECK(cudaSetDevice(device));
    TDPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    TDPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&p2p_, cudaStreamNonBlocking));
    TDPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&dp_, cudaStreamNonBlocking));
    TDPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    TDPIPE_CUBLAS_CHECK(cublasCreate(&cublas_));
    TDPIPE_CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
    constexpr std::size_t kWorkspace = std::size_t(32) << 20;
    TDPIPE_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspace));
    TDPIPE_CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_, kWorkspace));  // after cublasSetStream, which resets it
  } catch (...) {
    release();  // the destructor does not run for a constructor that threw
    throw;
  }
}

DeviceContext::~DeviceContext() { release(); }

void DeviceContext::release() noexcept {
  cudaSetDevice(device_);
  for (cudaStream_t s : {compute_, p2p_, dp_, copy_})
    if (s) cudaStreamSynchronize(s);
  if (cublas_) cublasDestroy(cublas_);
  if (workspace_) cudaFree(workspace_);
  for (cudaStream_t s : {compute_, p2p_, dp_, copy_})
    if (s) cudaStreamDestroy(s);
  cublas_ = nullptr;
  workspace_ = nullptr;
  compute_ = p2p_ = dp_ = copy_ = nullptr;
}

void DeviceContext::bind() const { TDPIPE_CUDA_CHECK(cudaSetDevice(device_)); }

cudaStream_t DeviceContext::stream(ir::Stream s) const {
  switch (s) {
    case ir::Stream::Compute: return compute_;
    case ir::Stream::P2P: return p2p_;
    case ir::Stream::DP: return dp_;
    case ir::Stream::Copy: return copy_;
  }
  return compute_;
}

namespace {
template <class Query>
void poll(Query query, RunControl* control) {
  // Spin briefly (ops are often µs long), then back off to 50 µs sleeps.
  for (int i = 0;; ++i) {
    cudaError_t status = query();
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) TDPIPE_CUDA_CHECK(status);
    if (control != nullptr && control->failed()) throw Aborted{};
    if (i > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    else std::this_thread::yield();
  }
}
}  // namespace

void wait_stream(cudaStream_t stream, RunControl* control) {
  poll([&] { return cudaStreamQuery(stream); }, control);
}
void wait_event(cudaEvent_t event, RunControl* control) {
  poll([&] { return cudaEventQuery(event); }, control);
}

}  // namespace tdpipe::exec::cuda
