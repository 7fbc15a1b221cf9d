// bf16 emulation: round-to-nearest-even to 8 significant bits, or exact (EMU_EXACT).
#pragma once
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 {
#ifdef EMU_EXACT
  float v;
#else
  std::uint16_t bits;
#endif
  inline operator float() const;  // as cuda_bf16.hpp's (implicit) conversion
};
inline __nv_bfloat16 __float2bfloat16(float f) {
  __nv_bfloat16 r;
#ifdef EMU_EXACT
  r.v = f;
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  r.bits = static_cast<std::uint16_t>(u >> 16);
#endif
  return r;
}
inline float __bfloat162float(__nv_bfloat16 b) {
#ifdef EMU_EXACT
  return b.v;
#else
  std::uint32_t u = std::uint32_t(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
inline __nv_bfloat16::operator float() const { return __bfloat162float(*this); }
