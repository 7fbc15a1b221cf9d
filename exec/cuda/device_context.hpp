// device_context.hpp — internal to exec/cuda: what one rank owns on its GPU — the
// device, one non-blocking stream per ir::Stream (compute, p2p, dp, copy), a cuBLAS
// handle on the compute stream with its own workspace — and helpers every host thread
// calls first.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "tdpipe/exec/run_control.hpp"
#include "tdpipe/ir/op.hpp"

namespace tdpipe::exec::cuda {

class DeviceContext {
 public:
  explicit DeviceContext(int device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return device_; }
  /// Makes this rank's device current on the calling thread (the interpreter's
  /// stream threads are new threads: each must select the device before any call).
  void bind() const;
  cudaStream_t stream(ir::Stream s) const;
  cudaStream_t compute() const { return compute_; }
  cudaStream_t p2p() const { return p2p_; }
  cudaStream_t dp() const { return dp_; }
  /// Parameter offload's LOAD / OFFLOAD (host ↔ device).
  cudaStream_t copy() const { return copy_; }
  cublasHandle_t cublas() const { return cublas_; }

 private:
  void release() noexcept;
  int device_;
  cudaStream_t compute_ = nullptr, p2p_ = nullptr, dp_ = nullptr, copy_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  /// cuBLAS's workspace (cublasSetWorkspace), 32 MiB as NVIDIA recommends for Hopper: set
  /// once, so no GEMM allocates one — inside a CUDA graph's capture (op_graphs.hpp) it
  /// could not — and the GEMMs choose alike with and without graphs.
  void* workspace_ = nullptr;
};

/// Waits for `stream` without blocking in the driver, so a failure elsewhere
/// (control.failed()) ends the wait with Aborted instead of a hang.
void wait_stream(cudaStream_t stream, RunControl* control);
/// Same for an event.
void wait_event(cudaEvent_t event, RunControl* control);

}  // namespace tdpipe::exec::cuda
