// Loading and storing bf16 / fp16 / fp32 elements as float, so one kernel body serves all three dtypes.
#pragma once

#include <cstdint>

#include "jax_aiter/float_bits.h"

namespace jax_aiter {

// load_word(w, i): element i (0 = low half) of two packed in a 32-bit word, for kernels that keep 16-bit data
// packed in registers.
struct Bf16 {
  using Storage = uint16_t;
  static JA_HOST_DEVICE float load(Storage v) { return bf16_to_float(v); }
  static JA_HOST_DEVICE float load_word(uint32_t w, int i) { return bits_as_float(i ? w & 0xFFFF0000u : w << 16); }
  static JA_HOST_DEVICE Storage store(float v) { return float_to_bf16(v); }
};

struct Fp16 {
  using Storage = uint16_t;
  static JA_HOST_DEVICE float load(Storage v) { return fp16_to_float(v); }
  static JA_HOST_DEVICE float load_word(uint32_t w, int i) {
    return fp16_to_float(static_cast<uint16_t>(i ? w >> 16 : w & 0xFFFFu));
  }
  static JA_HOST_DEVICE Storage store(float v) { return float_to_fp16(v); }
};

struct Fp32 {
  using Storage = float;
  static JA_HOST_DEVICE float load(Storage v) { return v; }
  static JA_HOST_DEVICE float load_word(uint32_t w, int) { return bits_as_float(w); }
  static JA_HOST_DEVICE Storage store(float v) { return v; }
};

}  // namespace jax_aiter
