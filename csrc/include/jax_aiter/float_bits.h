// bf16 / fp16 <-> fp32 conversions on raw bits, identical on host and device, round-to-nearest-even, so CPU
// and GPU kernels agree bit for bit with XLA's conversions.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__HIP__)
#include <hip/hip_runtime.h>  // device intrinsics (__float_as_uint) and attributes for the code below
#endif

#if defined(__CUDACC__) || defined(__HIP__)
#define JA_HOST_DEVICE __host__ __device__ inline __attribute__((always_inline))
#else
#define JA_HOST_DEVICE inline
#endif

// Register arrays must be indexed by constants on a GPU (else they go to local memory): unroll fully there.
// Host compilers do not know the pragma.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define JA_UNROLL _Pragma("unroll")
#else
#define JA_UNROLL
#endif

namespace jax_aiter {

JA_HOST_DEVICE uint32_t float_as_bits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

JA_HOST_DEVICE float bits_as_float(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

JA_HOST_DEVICE float bf16_to_float(uint16_t h) { return bits_as_float(static_cast<uint32_t>(h) << 16); }

JA_HOST_DEVICE uint16_t float_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // One instruction instead of five: memory-bound kernels run out of registers before bandwidth.
  // Same rounding; a NaN comes out as the canonical 0x7fff instead of keeping its sign and payload.
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  uint32_t u = float_as_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
#endif
}

JA_HOST_DEVICE float fp16_to_float(uint16_t h) {
  // GPUs convert in one instruction with the same result (the widening is exact); the bit version below
  // costs registers the kernels need for data.
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#elif defined(__HIP_DEVICE_COMPILE__)
  return static_cast<float>(__builtin_bit_cast(_Float16, h));
#else
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
#endif
}

JA_HOST_DEVICE uint16_t float_to_fp16(float f) {
  // Round-to-nearest-even in hardware, identical to the bit version except for NaN payloads.
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __builtin_bit_cast(uint16_t, static_cast<_Float16>(f));
#else
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
#endif
}

}  // namespace jax_aiter
