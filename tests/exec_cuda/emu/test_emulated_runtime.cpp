// test_emulated_runtime.cpp — the emulated GPU refuses what a GPU refuses and shows
// what a GPU would get wrong, so a test passing on it means something: launches and
// event records across devices, memory used on a stream its allocation is not ordered
// before, NCCL all-reduces whose ranks disagree.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "kernels.cuh"
#include "scoped_env.hpp"

namespace {
// Two emulated GPUs for one test; device 0 current again after it.
struct TwoGpus {
  tdpipe::test::ScopedEnv env{{{"TDPIPE_EMU_GPUS", "2"}}};
  ~TwoGpus() { cudaSetDevice(0); }
};
}  // namespace

TEST_CASE("emulated GPU: a kernel or an event record across devices fails as on a GPU", "[emulated][runtime]") {
  TwoGpus two;
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t s1 = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  float* x = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&x), 4 * sizeof(float), s1) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaGetLastError();
  tdpipe::exec::cuda::kernels::add(x, x, x, 4, s1);  // device 0 current, stream of device 1
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  cudaEvent_t e0 = nullptr;
  REQUIRE(cudaEventCreate(&e0) == cudaSuccess);  // an event of device 0
  CHECK(cudaEventRecord(e0, s1) == cudaErrorInvalidResourceHandle);
  cudaGetLastError();  // a failed call is also the last error, as on a GPU
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  tdpipe::exec::cuda::kernels::add(x, x, x, 4, s1);  // the right device: runs
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaFreeAsync(x, s1);
  cudaStreamSynchronize(s1);
  cudaStreamDestroy(s1);
  cudaSetDevice(0);
  cudaEventDestroy(e0);
}

TEST_CASE("emulated GPU: memory written on a stream its allocation is not ordered before comes out NaN",
          "[emulated][runtime]") {
  cudaStream_t a = nullptr, b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t gate = nullptr;
  REQUIRE(cudaEventCreate(&gate) == cudaSuccess);
  // Stream a is held (the emulation's own hook) until b's write is done, so the
  // allocation point on a is reached after it.
  std::vector<float> host(4, 0.f);
  std::atomic<bool> release{false};
  emu::submit(a, [&release] { release.wait(false); });
  float* x = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&x), 4 * sizeof(float), a) == cudaSuccess);
  const float ones[4] = {1, 1, 1, 1};
  cudaMemcpyAsync(x, ones, sizeof ones, cudaMemcpyHostToDevice, b);  // not ordered after the allocation
  cudaStreamSynchronize(b);
  release = true;
  release.notify_all();
  cudaStreamSynchronize(a);
  cudaMemcpyAsync(host.data(), x, sizeof ones, cudaMemcpyDeviceToHost, b);
  CHECK(std::isnan(host[0]));  // the allocation's fill, reached after the write, wiped it
  // Ordered correctly (b waits for a's allocation point), the write stays.
  float* y = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&y), 4 * sizeof(float), a) == cudaSuccess);
  cudaEventRecord(gate, a);
  cudaStreamWaitEvent(b, gate, 0);
  cudaMemcpyAsync(y, ones, sizeof ones, cudaMemcpyHostToDevice, b);
  cudaMemcpyAsync(host.data(), y, sizeof ones, cudaMemcpyDeviceToHost, b);
  CHECK(host[0] == 1.f);
  for (float* p : {x, y}) cudaFreeAsync(p, a);
  cudaStreamSynchronize(a);
  cudaEventDestroy(gate);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("emulated NCCL: ranks that disagree on an all-reduce's size get an asynchronous error, no hang",
          "[emulated][nccl]") {
  TwoGpus two;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclResult_t seen[2] = {ncclSuccess, ncclSuccess};
  auto rank = [&](int r) {
    cudaSetDevice(r);
    ncclComm_t comm = nullptr;
    REQUIRE(ncclCommInitRank(&comm, 2, id, r) == ncclSuccess);
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float* buf = nullptr;
    cudaMallocAsync(reinterpret_cast<void**>(&buf), 16 * sizeof(float), s);
    ncclAllReduce(buf, buf, r == 0 ? 16 : 8, ncclFloat32, ncclSum, comm, s);
    cudaStreamSynchronize(s);  // returns: the mismatch aborts the collective
    ncclCommGetAsyncError(comm, &seen[r]);
    cudaFreeAsync(buf, s);
    cudaStreamDestroy(s);
    ncclCommAbort(comm);
  };
  std::thread t1(rank, 1);
  rank(0);
  t1.join();
  CHECK((seen[0] != ncclSuccess && seen[1] != ncclSuccess));
}
