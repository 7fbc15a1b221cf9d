// fp16 emulation: IEEE binary16 as the GPU stores it — round to nearest even, subnormals
// below 2⁻¹⁴, ±inf from 65520 on, NaN kept — in every build (also EMU_EXACT: fp16's
// range is what loss scaling is about, so the emulation keeps it).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
struct __half {
  std::uint16_t bits = 0;
  inline operator float() const;  // as cuda_fp16.hpp's (implicit) conversion
};
inline __half __float2half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  __half h;
  if (a > 0x7f800000u) {
    h.bits = static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  } else if (a >= 0x477ff000u) {
    h.bits = static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520 (and inf): inf
  } else if (a < 0x38800000u) {
    // Below 2⁻¹⁴: a multiple of 2⁻²⁴, rounded to nearest even (a·2²⁴ < 1024 is exact).
    float v;
    std::memcpy(&v, &a, 4);
    h.bits = static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(v * 16777216.0f)));
  } else {
    const std::uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // round to nearest even at bit 13
    h.bits = static_cast<std::uint16_t>(sign | ((r - 0x38000000u) >> 13));  // exponent bias 127 → 15
  }
  return h;
}
inline float __half2float(__half h) {
  const std::uint32_t sign = std::uint32_t(h.bits & 0x8000u) << 16, e = (h.bits >> 10) & 0x1fu, m = h.bits & 0x3ffu;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  const std::uint32_t u = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __half::operator float() const { return __half2float(*this); }
