// Host shim of the CUDA runtime API that exec/cuda uses (tests/exec_cuda/emu: an
// emulated GPU, no CUDA toolkit). emu_runtime.cpp implements it: every stream is a
// worker thread running its work in order, events are markers on it, device memory is
// host memory (NaN when allocated, poisoned when freed), the null stream runs work at
// once on the caller's thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUmemPoolHandle_st* cudaMemPool_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
typedef int cudaError_t;
enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInsufficientDriver = 35,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
typedef enum { CUDA_R_16F = 2, CUDA_R_16BF = 14, CUDA_R_32F = 0 } cudaDataType;
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
enum { cudaEventRecordDefault = 0, cudaEventRecordExternal = 1 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                             cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1,
                               cudaStreamCaptureStatusInvalidated = 2 };
enum cudaMemPoolAttr { cudaMemPoolReuseFollowEventDependencies = 1, cudaMemPoolReuseAllowOpportunistic = 2,
                       cudaMemPoolReuseAllowInternalDependencies = 3, cudaMemPoolAttrReleaseThreshold = 4 };

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct cudaDeviceProp {
  char name[256];
  std::size_t totalGlobalMem;
  int major, minor, multiProcessorCount;
};

// Set by an emulated kernel launch the GPU would refuse (simt/simt.hpp); read and cleared
// by cudaGetLastError.
inline thread_local cudaError_t emu_last_error = 0;
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu_last_error;
  emu_last_error = 0;
  return e;
}

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaRuntimeGetVersion(int* version);
const char* cudaGetErrorString(cudaError_t status);
const char* cudaGetErrorName(cudaError_t status);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream = nullptr, unsigned flags = 0);

// Stream capture and graphs (emu_runtime.cpp, "graphs"): what a captured stream is given
// becomes the graph's nodes, in order — kernels, copies, memsets, cuBLAS calls,
// stream-ordered allocations (memory nodes: one address for the graph's life, NaN again
// at each launch) and frees, external event records. Host waits on the capturing stream
// and pageable copies (which a GPU refuses), frees of memory no graph allocated, plain
// event records and waits there (not emulated) return cudaErrorStreamCaptureUnsupported
// and invalidate the capture.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

cudaError_t cudaMalloc(void** ptr, std::size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocAsync(void** ptr, std::size_t bytes, cudaStream_t stream);
cudaError_t cudaMallocHost(void** ptr, std::size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);

namespace emu {
/// Runs `work` on `stream` after everything enqueued there before (now, on this
/// thread, for the null stream). What the kernels and cuBLAS emulations call.
void submit(cudaStream_t stream, void (*run)(void*), void* arg, void (*drop)(void*));
template <class F>
void submit(cudaStream_t stream, F work) {
  auto* f = new F(std::move(work));
  submit(stream, [](void* p) { (*static_cast<F*>(p))(); }, f, [](void* p) { delete static_cast<F*>(p); });
}
/// Host calls on `stream` (cudaStreamSynchronize, cudaStreamQuery, cudaEventSynchronize and
/// cudaEventQuery of an event last recorded there) that found its work unfinished: how
/// often the host waited for it. A poll counts each time it finds the work running.
std::uint64_t blocked_host_waits(cudaStream_t stream);
/// Work the host put on `stream` itself (kernels, copies, memsets, cuBLAS calls,
/// allocations' and frees' fills; not event records and waits), and graphs launched
/// there: a replayed CUDA graph adds one launch and no work item.
std::uint64_t work_items(cudaStream_t stream);
std::uint64_t graph_launches(cudaStream_t stream);
/// False (and the launch error cudaGetLastError reports set) when a kernel launched
/// into `stream` would fail on a GPU: a stream of another device than the current one.
bool kernel_launch_ok(cudaStream_t stream);
/// A kernel launch: checked as a GPU checks it, then submitted.
template <class F>
void launch(cudaStream_t stream, F work) {
  if (kernel_launch_ok(stream)) submit(stream, std::move(work));
}
}  // namespace emu
