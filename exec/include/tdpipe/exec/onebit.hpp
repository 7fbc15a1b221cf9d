// onebit.hpp — 1-bit Adam's compression (Tang et al. 2021, arXiv 2102.02888; DeepSpeed's
// compressed_allreduce): a vector becomes one fp32 scale and one sign bit per element,
// with error feedback, and back. Host code, shared by the CPU backend and the tests; the
// CUDA backend runs the same arithmetic in kernels.
//
// A bucket of n elements is cut into `members` segments (part_range, as the data-parallel
// collectives cut it). The packed message of a bucket is `members` blocks of
// block_bytes(n, members) each: a 4-byte fp32 scale, then the segment's sign bits (bit k
// of byte k/8, LSB first; 1 = non-negative), zero-padded to the longest segment. One
// scale per segment on both sides (DeepSpeed's worker side has one per whole buffer; a
// scale per segment follows each segment's own magnitude, for 4 bytes more per member).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "tdpipe/ir/op.hpp"

namespace tdpipe::exec::onebit {

/// Bytes of one segment's block in a bucket of `elements` cut into `members` segments.
inline std::int64_t block_bytes(std::int64_t elements, int members) {
  return ir::compressed_bucket_bytes(elements, members) / (members < 1 ? 1 : members);
}

/// Compresses c = x + error (len elements) into `block`: scale = ‖c‖₂ / √len (so that
/// scale · sign(c) keeps c's norm), the sign bits, and error ← c − scale · sign(c), using
/// the fp32 scale as sent, so that what the receiver decodes and what the sender keeps
/// add up to c exactly up to the error's rounding.
template <class T>
void compress(const T* x, T* error, std::int64_t len, std::uint8_t* block) {
  double sum = 0;
  for (std::int64_t k = 0; k < len; ++k) {
    const double c = static_cast<double>(x[k]) + static_cast<double>(error[k]);
    sum += c * c;
  }
  const float scale = len > 0 ? static_cast<float>(std::sqrt(sum / static_cast<double>(len))) : 0.0f;
  std::memcpy(block, &scale, sizeof scale);
  std::uint8_t* bits = block + sizeof scale;
  std::memset(bits, 0, static_cast<std::size_t>((len + 7) / 8));
  for (std::int64_t k = 0; k < len; ++k) {
    const T c = x[k] + error[k];
    const bool positive = c >= T(0);
    if (positive) bits[k / 8] = static_cast<std::uint8_t>(bits[k / 8] | (1u << (k % 8)));
    error[k] = c - (positive ? T(scale) : -T(scale));
  }
}

/// The block's scale.
inline float block_scale(const std::uint8_t* block) {
  float scale;
  std::memcpy(&scale, block, sizeof scale);
  return scale;
}

/// out[k] (+)= weight · scale · sign_k for the len elements of `block`: assigns, or adds
/// when `accumulate`. With `keep` (assigning only): out[k] = 0 where keep[k] == 0 — the
/// momentum mask (below).
template <class T>
void expand(const std::uint8_t* block, std::int64_t len, T weight, T* out, bool accumulate,
            const T* keep = nullptr) {
  const T v = weight * static_cast<T>(block_scale(block));
  const std::uint8_t* bits = block + sizeof(float);
  for (std::int64_t k = 0; k < len; ++k) {
    const T s = (bits[k / 8] >> (k % 8)) & 1u ? v : -v;
    out[k] = accumulate ? out[k] + s : keep != nullptr && keep[k] == T(0) ? T(0) : s;
  }
}

// The momentum mask. Sign compression gives every element of a segment the segment's
// magnitude, also one whose gradient is exactly zero all along (an embedding row of a
// token the data never holds): its second moment froze at 0, and lr·m/(√v + ε) would
// move it by lr·scale/ε. DeepSpeed's 1-bit Adam asks the user for an `exp_avg_mask`
// of such parameters; tdpipe masks, after decoding, every element whose frozen second
// moment is exactly 0 — the same set, found from the warm-up itself.


}  // namespace tdpipe::exec::onebit
