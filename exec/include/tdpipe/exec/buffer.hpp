// buffer.hpp — the tensors the interpreter hands between a backend's compute and
// transport: a shared, typed block of memory, and the key naming what it holds.
//
// Ownership: a Buffer shares ownership of its memory (std::shared_ptr). Moving a
// Buffer into Compute::run or Transport::post hands it over; whoever holds the last
// copy frees it. A Buffer may also alias memory owned by someone else (a view, e.g.
// Compute::grad_bucket): its shared_ptr then keeps that owner alive or, where the
// backend documents it, has a no-op deleter and is valid until the next step.
// CPU backend: host memory. CUDA backend: device memory of the rank's GPU.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>

#include "tdpipe/ir/op.hpp"

namespace tdpipe::exec {

/// U8: raw bytes (1-bit Adam's packed sign bits and scales). BF16: bfloat16 (the CUDA
/// backend's activations and gradients between stages, TrainOptions::bf16_wire).
enum class DType : std::uint8_t { F32, F64, U8, BF16 };

/// Bytes of one element of `dtype`.
constexpr std::int64_t dtype_bytes(DType dtype) {
  return dtype == DType::F32 ? 4 : dtype == DType::U8 ? 1 : dtype == DType::BF16 ? 2 : 8;
}

/// x rounded to the nearest bfloat16 (ties to even), as CUDA's __float2bfloat16 rounds
/// the fp32 value: through float first, NaN kept, ±inf and overflow to ±inf.
inline double round_to_bf16(double x) {
  const float f = static_cast<float>(x);
  if (f != f) return x;
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<double>(std::bit_cast<float>(u & 0xFFFF0000u));
}

/// A block of elements in the backend's memory; empty when `data` is null.
struct Buffer {
  std::shared_ptr<void> data;  ///< host (cpu) or device (cuda) memory
  std::int64_t elements = 0;
  DType dtype = DType::F64;

  std::int64_t bytes() const { return elements * dtype_bytes(dtype); }
  bool empty() const { return data == nullptr; }
  template <typename T>
  T* as() const { return static_cast<T*>(data.get()); }
};

/// Names a tensor that crosses virtual stages: what the PRODUCER op made.
/// payload F: the output activation of F(mb, stage, slice), consumed by stage + 1;
/// payload B: the gradient w.r.t. the input of B/BW(mb, stage, slice), consumed by
/// stage − 1. `stage` is the producer's virtual stage (ir::Plan::stage_of).
struct TensorKey {
  ir::OpKind payload = ir::OpKind::F;
  int stage = 0;
  int mb = 0;
  int slice = 0;

  friend bool operator==(const TensorKey&, const TensorKey&) = default;
  friend auto operator<=>(const TensorKey&, const TensorKey&) = default;
};

}  // namespace tdpipe::exec
