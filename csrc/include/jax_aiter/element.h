// Loading and storing bf16 / fp16 / fp32 elements as float, so one kernel body serves all three dtypes.
#pragma once

#include <cstdint>

#include "jax_aiter/float_bits.h"

namespace jax_aiter {

struct Bf16 {
  using Storage = uint16_t;
  static JA_HOST_DEVICE float load(Storage v) { return bf16_to_float(v); }
  static JA_HOST_DEVICE Storage store(float v) { return float_to_bf16(v); }
};

struct Fp16 {
  using Storage = uint16_t;
  static JA_HOST_DEVICE float load(Storage v) { return fp16_to_float(v); }
  static JA_HOST_DEVICE Storage store(float v) { return float_to_fp16(v); }
};

struct Fp32 {
  using Storage = float;
  static JA_HOST_DEVICE float load(Storage v) { return v; }
  static JA_HOST_DEVICE Storage store(float v) { return v; }
};

}  // namespace jax_aiter
