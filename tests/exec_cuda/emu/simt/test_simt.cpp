// test_simt.cpp — the SIMT emulation itself (simt.hpp): barriers and shuffles are
// real rendezvous, the thread order can expose a race, and misuse the GPU would hang
// on is reported instead of passing silently.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "simt.hpp"

namespace {

// The reduction kernels.cu uses: warp shuffles, then one warp over the partial sums.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < (blockDim.x + 31) / 32 ? part[lane] : 0.f;
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

__global__ void sums(const float* x, float* out, int n) {
  float v = 0;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) v += x[blockIdx.x * n + i];
  const float s = block_sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Thread 0 reads what thread 1 writes, with (`fenced`) or without a barrier between.
__global__ void handoff(int* out, bool fenced) {
  __shared__ int cell;
  if (threadIdx.x == 0) cell = 0;
  __syncthreads();
  if (threadIdx.x == 1) cell = 7;
  if (fenced) __syncthreads();
  if (threadIdx.x == 0) out[0] = cell;
}

// Lanes 16… leave before the full-mask shuffle.
__global__ void early_exit(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
}

// Half a warp waits in __syncthreads, the other half in a full-mask shuffle.
__global__ void split_warp(float* out) {
  if (threadIdx.x < 16) __syncthreads();
  else out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
}

__global__ void mark(int* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = 1; }

}  // namespace

TEST_CASE("SIMT: block reductions through shuffles and barriers are exact in both orders", "[simt]") {
  for (simt::Order order : {simt::Order::Forward, simt::Order::Reverse}) {
    simt::set_order(order);
    for (unsigned threads : {32u, 64u, 96u, 256u, 1024u}) {
      CAPTURE(threads);
      const int n = 1000, blocks = 3;
      std::vector<float> x(static_cast<std::size_t>(n) * blocks), out(blocks, -1.f);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7);  // exact in fp32
      simt::launch(sums, blocks, threads)(x.data(), out.data(), n);
      REQUIRE(cudaGetLastError() == cudaSuccess);
      for (int b = 0; b < blocks; ++b) {
        double want = 0;
        for (int i = 0; i < n; ++i) want += x[static_cast<std::size_t>(b * n + i)];
        CHECK(out[static_cast<std::size_t>(b)] == static_cast<float>(want));
      }
    }
  }
  simt::set_order(simt::Order::Forward);
}

TEST_CASE("SIMT: reversing the thread order exposes a missing barrier", "[simt]") {
  auto read = [](simt::Order order, bool fenced) {
    simt::set_order(order);
    int got = -1;
    simt::launch(handoff, 1, 64)(&got, fenced);
    simt::set_order(simt::Order::Forward);
    return got;
  };
  // Without the barrier thread 0's read depends on who runs first: the two orders disagree.
  CHECK(read(simt::Order::Forward, false) == 0);
  CHECK(read(simt::Order::Reverse, false) == 7);
  CHECK(read(simt::Order::Forward, true) == 7);
  CHECK(read(simt::Order::Reverse, true) == 7);
}

TEST_CASE("SIMT: misuse the GPU would hang on is an error", "[simt]") {
  std::vector<float> out(32, 0.f);
  REQUIRE_THROWS_WITH(simt::launch(early_exit, 1, 32)(out.data()), Catch::Contains("has exited"));
  REQUIRE_THROWS_WITH(simt::launch(split_warp, 1, 32)(out.data()), Catch::Contains("deadlock"));
  // The emulation recovers for the next launch.
  std::vector<int> marks(64, 0);
  simt::launch(mark, 2, 32)(marks.data());
  CHECK(std::count(marks.begin(), marks.end(), 1) == 64);
}

TEST_CASE("SIMT: a launch configuration the GPU refuses sets the last error and runs nothing", "[simt]") {
  std::vector<int> marks(4096, 0);
  const std::int64_t before = simt::launches();
  simt::launch(mark, 1, 2048)(marks.data());
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);  // read and cleared, as on the GPU
  simt::launch(mark, dim3(1, 70000), 32)(marks.data());
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(simt::launches() == before);
  CHECK(std::count(marks.begin(), marks.end(), 1) == 0);
}
