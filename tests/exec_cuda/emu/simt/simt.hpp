// simt.hpp — a host emulation of CUDA's thread model, enough to run exec/cuda/kernels.cu
// on a CPU: every thread of a block is a fiber (Boost.Context) on one OS thread, so
// __syncthreads and warp shuffles are real rendezvous, not sequential loops. Blocks run
// one after another; inside a block the fibers run in a chosen order (forward or
// reverse) until each reaches a barrier, which catches code that depends on an order
// the GPU does not promise. Misuse the GPU would hang on or leave undefined — a
// shuffle whose mask names a lane that exited or waits elsewhere, lanes disagreeing on
// the mask, a barrier nobody can pass — stops the launch with simt::Error. A launch
// configuration the GPU rejects sets the error cudaGetLastError returns, as on a GPU.
//
// kernels.cu is compiled for the host with this header force-included and its
// `k<<<grid, block, smem, stream>>>(args)` launches rewritten to
// `::simt::launch(k, grid, block, smem, stream)(args)` (transform.cmake).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include <cuda_runtime.h>  // the shim: dim3, uint3, cudaStream_t, the last-error slot

namespace simt {

/// Misuse of the thread model found while running a kernel.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The order a block's runnable fibers are resumed in, each round.
enum class Order { Forward, Reverse };
void set_order(Order order);
Order order();

/// Launches counted since start (the tests check the emulator really ran kernels).
std::int64_t launches();

// The running fiber's coordinates (valid only inside a kernel).
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

void syncthreads();
/// Waits until every lane in `mask` of this warp has called it (same call count);
/// `value` is published first, the partner's read after.
std::uint64_t warp_exchange(unsigned mask, std::uint64_t value, int src_lane);

/// The cudaError_t a GPU reports for launching grid × block (cudaSuccess when it runs).
int check_config(dim3 grid, dim3 block);
/// Runs grid × block fibers of `body`, block after block, on the calling thread.
void run(dim3 grid, dim3 block, const std::function<void()>& body);

template <class... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  cudaStream_t stream;
  template <class... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
    if (const int status = check_config(grid, block); status != cudaSuccess) {
      emu_last_error = status;  // as on a GPU: nothing runs, cudaGetLastError reports it
      return;
    }
    // In stream order, like the GPU (the null stream: now); the arguments are copied now.
    emu::launch(stream, [k = kernel, g = grid, b = block, params = std::tuple<P...>(static_cast<P>(args)...)] {
      run(g, b, [&] { std::apply(k, params); });
    });
  }
};
template <class... P>
Launcher<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t /*smem*/ = 0,
                      cudaStream_t stream = nullptr) {
  return Launcher<P...>{kernel, grid, block, stream};
}

template <class T>
T shfl_xor(unsigned mask, T value, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = warp_exchange(mask, bits, static_cast<int>(thread_idx().x % 32u) ^ lane_mask);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace simt

// ---- CUDA's device-side names, as kernels.cu uses them ------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// One block runs at a time per OS thread (one per emulated stream), so a function-local
// thread_local is that block's shared memory.
#define __shared__ static thread_local
#define threadIdx (::simt::thread_idx())
#define blockIdx (::simt::block_idx())
#define blockDim (::simt::block_dim())
#define gridDim (::simt::grid_dim())

inline void __syncthreads() { ::simt::syncthreads(); }
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  return ::simt::shfl_xor(mask, value, lane_mask);
}
// A block's fibers share one OS thread and never switch inside these, and the blocks of
// a stream run one after another: plain adds are atomic. (Kernels on two streams that
// add into one buffer would race here as they would not on a GPU; exec/cuda has none.)
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline double atomicAdd(double* p, double v) {
  const double old = *p;
  *p = old + v;
  return old;
}
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
