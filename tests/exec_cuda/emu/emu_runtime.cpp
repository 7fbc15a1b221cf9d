// emu_runtime.cpp — host emulation of the CUDA runtime pieces exec/cuda/gpt_cuda.cpp
// calls besides its kernels: DeviceMemory (NaN-filled, poisoned on free), the status
// checks, and cuBLAS's column-major GEMM contract. The kernels come from
// emu_kernels.cpp (their contracts) or from kernels.cu itself under simt/.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "device_memory.hpp"
#include "kernels.cuh"

#ifdef EMU_ASAN
// Freed device memory is poisoned and kept, never returned (DeviceMemory::reset): those
// are not leaks to report.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
#endif

namespace tdpipe::exec::cuda {
namespace detail {
void throw_cuda(cudaError_t s, const char* call, const char* file, int line) {
  throw Error(std::string("cuda ") + std::to_string(s) + " " + call + " " + file + ":" + std::to_string(line));
}
void throw_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(std::string("cublas ") + std::to_string(s) + " " + call + " " + file + ":" + std::to_string(line));
}
void throw_nccl(ncclResult_t s, const char* call, const char* file, int line) {
  throw Error(std::string("nccl ") + std::to_string(s) + " " + call + " " + file + ":" + std::to_string(line));
}
}  // namespace detail

// NaN-filled allocations: a read of anything not written shows up in the results.
static void* emu_alloc(std::size_t bytes) {
  void* p = std::malloc((bytes + 3) / 4 * 4);
  std::memset(p, 0xff, (bytes + 3) / 4 * 4);  // NaN as fp32 and as bf16
  return p;
}
DeviceMemory::DeviceMemory(std::size_t bytes, cudaStream_t stream, bool zero) : bytes_(bytes), stream_(stream) {
  if (bytes == 0) return;
  ptr_ = emu_alloc(bytes);
  if (zero) std::memset(ptr_, 0, bytes);
}
void DeviceMemory::reset() {
  if (ptr_ == nullptr) return;
  // Poisoned and leaked, not freed: a read after the free (a stash dropped too early)
  // then yields NaN in the results instead of stale, plausible values.
  std::memset(ptr_, 0xff, bytes_);
  ptr_ = nullptr;
}
Buffer device_buffer(std::int64_t elements, cudaStream_t) {
  Buffer b;
  b.data = std::shared_ptr<void>(emu_alloc(std::size_t(elements > 0 ? elements : 1) * 4), [](void*) {});  // leaked: see reset()
  b.elements = elements;
  b.dtype = DType::F32;
  return b;
}
}  // namespace tdpipe::exec::cuda

using tdpipe::exec::cuda::kernels::bf16;
static float ld_el(const void* p, cudaDataType t, long long i) {
  return t == CUDA_R_16BF ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType at, int lda,
                                          long long sa, const void* B, cudaDataType bt, int ldb, long long sb,
                                          const void* beta, void* C, cudaDataType ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t, cublasGemmAlgo_t) {
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // cuBLAS's argument rules (column-major).
  if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) ||
      ldc < std::max(1, m)) {
    std::fprintf(stderr, "cuBLAS would reject: m %d n %d k %d lda %d ldb %d ldc %d\n", m, n, k, lda, ldb, ldc);
    return 7;
  }
  for (int bi = 0; bi < batch; ++bi)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0;
        for (int p = 0; p < k; ++p) {
          const long long ia = bi * sa + (ta == CUBLAS_OP_N ? i + (long long)p * lda : p + (long long)i * lda);
          const long long ib = bi * sb + (tb == CUBLAS_OP_N ? p + (long long)j * ldb : j + (long long)p * ldb);
          acc += ld_el(A, at, ia) * ld_el(B, bt, ib);
        }
        const long long ic = bi * sc + i + (long long)j * ldc;
        float v = al * acc;
        if (be != 0.f) v += be * ld_el(C, ct, ic);
        if (ct == CUDA_R_16BF)
          static_cast<bf16*>(C)[ic] = __float2bfloat16(v);
        else
          static_cast<float*>(C)[ic] = v;
      }
  return 0;
}
