// bf16 / fp16 <-> fp32 conversions on raw bits, identical on host and device, round-to-nearest-even, so CPU
// and GPU kernels agree bit for bit with XLA's conversions.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define JA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define JA_HOST_DEVICE inline
#endif

namespace jax_aiter {

JA_HOST_DEVICE uint32_t float_as_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

JA_HOST_DEVICE float bits_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

JA_HOST_DEVICE float bf16_to_float(uint16_t h) { return bits_as_float(static_cast<uint32_t>(h) << 16); }

JA_HOST_DEVICE uint16_t float_to_bf16(float f) {
  uint32_t u = float_as_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

JA_HOST_DEVICE float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_as_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_as_float(sign);
    // Subnormal: value = mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return bits_as_float(sign | float_as_bits(magnitude));
  }
  return bits_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

JA_HOST_DEVICE uint16_t float_to_fp16(float f) {
  const uint32_t u = float_as_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                        // below fp16's smallest normal: subnormal or zero
    // Adding 0.5 (2^-1) puts the fp16 subnormal grid (step 2^-24) in the low mantissa bits of the sum,
    // where the fp32 addition itself rounds to nearest even.
    const float shifted = bits_as_float(abs) + 0.5f;
    return sign | static_cast<uint16_t>(float_as_bits(shifted) - 0x3f000000u);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

}  // namespace jax_aiter
