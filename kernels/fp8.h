// FP8 E4M3 (the OCP "E4M3FN" format NVIDIA's sm_89+ tensor cores take, vLLM's fp8 KV cache):
// 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN;
// the largest finite magnitude is 448 (S.1111.110), the smallest normal 2^-6, the smallest
// subnormal 2^-9. Shared by the CPU reference kernels and (later) the CUDA kernels, so the
// host and the device quantize bit-identically.
//
// Encoding rounds to nearest, ties to even, and saturates: |x| >= 448 (infinity included)
// becomes ±448, as the device's cvt with .satfinite does; NaN stays NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace llm {

constexpr float kE4m3Max = 448.f;

LLM_HOST_DEVICE float E4m3ToF32(uint8_t code) {
  const float sign = (code & 0x80) ? -1.f : 1.f;
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) return sign * float(m) * 0.001953125f;  // m · 2^-9
  // (1 + m/8) · 2^(e-7), built exactly from the bits of an fp32.
  const uint32_t bits = (uint32_t(e - 7 + 127) << 23) | (uint32_t(m) << 20);
  float f;
  std::memcpy(&f, &bits, 4);
  return sign * f;
}

LLM_HOST_DEVICE uint8_t F32ToE4m3(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7f;   // NaN
  if (u >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and infinity): saturate
  const int exp = int(u >> 23) - 127;
  if (exp >= -6) {  // a normal e4m3 number: keep 3 of the 23 mantissa bits, ties to even
    uint32_t m3 = (u >> 20) & 7;
    const uint32_t rest = u & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (m3 & 1))) ++m3;
    uint32_t e = uint32_t(exp + 7);
    if (m3 == 8) {
      m3 = 0;
      ++e;  // stays <= 15 with m3 <= 6: everything below 448 rounds to at most 448
    }
    return sign | uint8_t((e << 3) | m3);
  }
  // Subnormal: |x| · 2^9 rounded to an integer 0..8, ties to even (exact: a power-of-two
  // scale). 8 is the code of the smallest normal, 2^-6.
  float v;
  std::memcpy(&v, &u, 4);
#if defined(__CUDA_ARCH__)
  return sign | uint8_t(rintf(v * 512.f));
#else
  return sign | uint8_t(std::nearbyint(v * 512.f));
#endif
}

}  // namespace llm
