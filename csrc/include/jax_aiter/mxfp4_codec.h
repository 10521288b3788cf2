// The MXFP4 codec of docs/mxfp4.md as host + device functions, shared by the CPU cast (csrc/cpu/mxfp4.cc)
// and the GPU kernels (csrc/gpu/mxfp4.cuh), so every backend produces the reference's bytes
// (jax_aiter/ref/mxfp4.py).
//
// The reference decides codes in integer arithmetic on float32 bits. Here the per-element work is float math
// where that is exact and cheaper: for a block exponent e, v = |x| * 2^-e is exact whenever it is normal, and
// rounding to the E2M1 grid is one multiply-add that rounds at the right binade. Two places would meet
// subnormal floats, which XLA's CPU runtime flushes (FTZ/DAZ) and GPUs do not, so both avoid them:
// * 2^-e is normal for every finite block (e <= 126), and a v below 2^-126 encodes as 0 on either side;
// * a subnormal input (|x| < 2^-126) only matters in a block with e <= -99: stochastic rounding can round
//   it up once z = floor(|x| * 2^(28 - e)) >= 1 (nearest rounding needs e <= -125); such blocks take
//   `scaled_magnitude_tiny`, which rebuilds the input's value from its integer mantissa.
// The Hadamard butterfly flushes after every stage exactly as the reference specifies.
#pragma once

#include <cmath>
#include <cstdint>

#include "jax_aiter/element.h"
#include "jax_aiter/float_bits.h"

namespace jax_aiter::mxfp4 {

inline constexpr int kBlock = 32;
inline constexpr uint8_t kNanScale = 0xFF;
inline constexpr uint32_t kRowwiseStream = 0x6A09E667u;
inline constexpr uint32_t kColumnwiseStream = 0xBB67AE85u;
inline constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kSignMask = 0x80000000u;
inline constexpr uint32_t kInfBits = 0x7F800000u;
inline constexpr uint32_t kMinNormalBits = 0x00800000u;
// Blocks with a shared exponent at or below this can hold subnormal inputs whose code may be non-zero (see
// the top of this file).
inline constexpr int kTinyBlockExponent = -99;

enum class ScaleRule : int { kEven = 0, kFloor = 1, kCeil = 2 };
enum class Layout : int { kPlain = 0, kGemmA = 1, kGemmB = 2 };

// --- hashing (stochastic rounding, Hadamard signs) ------------------------------------------------------

// MurmurHash3's 32-bit finalizer.
JA_HOST_DEVICE uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

// The draw for element (row, col) of the logical input is sr_finish(sr_row(key0, row), col, key1 ^ stream);
// the first step depends on the row only, so kernels hoist it.
JA_HOST_DEVICE uint32_t sr_row(uint32_t key0, uint32_t row) { return fmix32(row ^ key0); }
JA_HOST_DEVICE uint32_t sr_finish(uint32_t row_hash, uint32_t col, uint32_t key1_stream) {
  return fmix32(fmix32(row_hash ^ col) ^ key1_stream);
}

// 1 where the Hadamard sign of quantization-axis index `index` is -1.
JA_HOST_DEVICE uint32_t hadamard_sign_bit(uint32_t key0, uint32_t key1, uint32_t index) {
  return fmix32(fmix32(index ^ key0) ^ key1) >> 31;
}

// --- Hadamard butterfly ------------------------------------------------------------------------------

JA_HOST_DEVICE float flush_subnormal(float y) {
  const uint32_t b = float_as_bits(y);
  return (b & kAbsMask) < kMinNormalBits ? bits_as_float(b & kSignMask) : y;
}

// One butterfly pair: (low + high, low - high), each flushed below 2^-126 (kFlush false: a rotation that can
// meet no subnormal, see rotation_never_flushes, skips the test).
template <bool kFlush = true>
JA_HOST_DEVICE float butterfly_sum(float low, float high) {
  return kFlush ? flush_subnormal(low + high) : low + high;
}
template <bool kFlush = true>
JA_HOST_DEVICE float butterfly_difference(float low, float high) {
  return kFlush ? flush_subnormal(low - high) : low - high;
}

// The input side of the rotation: flushed, then negated where the keyed sign is -1 (sign_bit = 1).
template <bool kFlush = true>
JA_HOST_DEVICE float hadamard_input(float x, uint32_t sign_bit) {
  return bits_as_float(float_as_bits(kFlush ? flush_subnormal(x) : x) ^ (sign_bit << 31));
}

// The last step: times float32(1/sqrt(size)), with |y| < 2^-123 going to a signed zero instead.
template <bool kFlush = true>
JA_HOST_DEVICE float hadamard_output(float y, int size) {
  const uint32_t b = float_as_bits(y);
  const float scale = size == 16 ? 0.25f : bits_as_float(0x3E3504F3u);
  return kFlush && (b & kAbsMask) < 0x02000000u ? bits_as_float(b & kSignMask) : y * scale;
}

// When every non-zero input of a rotation has |x| >= 2^-100, no flush of the rotation can change a value, so
// kFlush = false gives the same bits: each input is then a multiple of 2^-123 (its unit in the last place or a
// multiple of it), sums and differences of multiples of 2^-123 round to multiples of 2^-123, so every
// intermediate is 0, non-finite or at least 2^-123 in magnitude: never below the stages' 2^-126 nor the
// output's 2^-123. nonzero_min_step keeps the running minimum of (|x| bits - 1) as an unsigned integer, in
// which zeros wrap to the top; start it at 0xFFFFFFFF.
inline constexpr uint32_t kNeverFlushedMagnitude = 0x0D800000u;  // 2^-100
JA_HOST_DEVICE uint32_t nonzero_min_step(uint32_t acc, float x) {
  const uint32_t below = (float_as_bits(x) & kAbsMask) - 1u;
  return below < acc ? below : acc;
}
JA_HOST_DEVICE bool rotation_never_flushes(uint32_t nonzero_min) {
  return nonzero_min >= kNeverFlushedMagnitude - 1u;
}

// In-place rotation of kSize (16 or 32) consecutive values already passed through hadamard_input.
template <int kSize, bool kFlush = true>
JA_HOST_DEVICE void hadamard_chunk(float* y) {
  constexpr int kStages = kSize == 16 ? 4 : 5;
  // Stages counted linearly: loop unrollers need an affine trip count (half *= 2 is not).
  JA_UNROLL
  for (int stage = 0; stage < kStages; ++stage) {
    const int half = 1 << stage;
    JA_UNROLL
    for (int i = 0; i < kSize; ++i) {
      if (i & half) continue;
      const float low = y[i];
      const float high = y[i + half];
      y[i] = butterfly_sum<kFlush>(low, high);
      y[i + half] = butterfly_difference<kFlush>(low, high);
    }
  }
  JA_UNROLL
  for (int i = 0; i < kSize; ++i) y[i] = hadamard_output<kFlush>(y[i], kSize);
}

// --- scale -------------------------------------------------------------------------------------------

// Shared exponent of a finite block from the float32 bits of its amax (|x| bits, integer max), clamped to
// [-127, 127]; an all-zero block gets -127 (scale byte 0). Every rule is floor(log2) - 2 of amax rounded up
// at some mantissa position first: "even" adds 0x200000 (significand >= 1.75 moves up), "floor" nothing,
// "ceil" 0x3FFFFF (any significand above 1.5 moves up: then |x| / 2^e would exceed 6).
JA_HOST_DEVICE uint32_t scale_bias(ScaleRule rule) {
  return rule == ScaleRule::kEven ? 0x200000u : (rule == ScaleRule::kFloor ? 0u : 0x3FFFFFu);
}

JA_HOST_DEVICE int scale_exponent(uint32_t amax, ScaleRule rule) {
  const int e = static_cast<int>((amax + scale_bias(rule)) >> 23) - 129;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

JA_HOST_DEVICE uint8_t scale_byte(uint32_t amax, int e) {
  return amax >= kInfBits ? kNanScale : static_cast<uint8_t>(e + 127);
}

// 2^n as a float for n in [-126, 127] (always a normal number).
JA_HOST_DEVICE float pow2(int n) { return bits_as_float(static_cast<uint32_t>(n + 127) << 23); }

// --- elements ----------------------------------------------------------------------------------------

// v = |x| / 2^e from the magnitude bits; `inv_scale` = pow2(-e). Exact when v is normal; below 2^-126 the
// result may differ from the exact value, but every such v encodes as 0 (z = floor(v * 2^28) = 0 as well).
// A flushed subnormal input matters only in tiny blocks, which use scaled_magnitude_tiny.
JA_HOST_DEVICE float scaled_magnitude(uint32_t magnitude, float inv_scale) {
  return bits_as_float(magnitude) * inv_scale;
}

// The same for blocks with e <= kTinyBlockExponent, where subnormal inputs matter: a subnormal's value is
// mantissa * 2^-149, and the mantissa is recovered exactly as (2^23 + mantissa) - 2^23 in normal floats.
JA_HOST_DEVICE float scaled_magnitude_tiny(uint32_t magnitude, int e) {
  if (magnitude >= kMinNormalBits) return bits_as_float(magnitude) * pow2(-e);
  const float mantissa = bits_as_float(magnitude | 0x4B000000u) - 8388608.f;
  return mantissa * pow2(-149 - e);
}

// E2M1 magnitude code (0..7) of v in [0, 8) rounded to nearest, ties to the even code. Below 2 the grid step
// is 0.5, in [2, 4) it is 1, from 4 it is 2: scaling by 1/step puts the grid on the integers, and adding
// 2^23 + (first code of the binade - its first grid index) rounds once (ties to even) into the low bits.
JA_HOST_DEVICE uint32_t round_nearest(float v) {
  const float multiplier = v >= 4.f ? 0.5f : (v >= 2.f ? 1.f : 2.f);
  const float magic = v >= 4.f ? 8388612.f : (v >= 2.f ? 8388610.f : 8388608.f);
  const uint32_t code = float_as_bits(v * multiplier + magic) - 0x4B000000u;
  return code > 7u ? 7u : code;
}

// Stochastic rounding as the reference: z = floor(v * 2^28); adding a draw below one grid step and truncating
// rounds up with probability equal to the distance past the lower neighbour.
// z comes from v's bits in integer operations, not from a float-to-integer conversion, which GPUs issue at an
// eighth of the rate of other arithmetic: for a normal v = M * 2^(E - 150) (M the 24-bit significand, E the
// exponent field), z = M * 2^(E - 122), i.e. (M << 7) >> (129 - E), as v < 8 makes E <= 129; M << 7 < 2^31,
// so a shift of 31 gives 0, which is z for every v below 2^-28, subnormals and zero included.
JA_HOST_DEVICE uint32_t fixed_point_28(float v) {
  const uint32_t bits = float_as_bits(v);
  const uint32_t shifted_significand = ((bits << 7) & 0x3FFFFF80u) | 0x40000000u;
  const int right = 129 - static_cast<int>(bits >> 23);
  return shifted_significand >> (right < 31 ? right : 31);
}

JA_HOST_DEVICE uint32_t round_stochastic(float v, uint32_t draw) {
  const uint32_t z = fixed_point_28(v);
  const uint32_t region = (z >= (1u << 29) ? 1u : 0u) + (z >= (1u << 30) ? 1u : 0u);
  const uint32_t step = (z + (draw >> (5 - region))) >> (27 + region);
  const uint32_t code = step + 2 * region;
  return code > 7u ? 7u : code;
}

// Sign bit 3 from the input's float32 bits, except that a zero code stays +0: code + 7 has bit 3 set
// exactly for codes 1..7.
JA_HOST_DEVICE uint32_t signed_code(uint32_t code, uint32_t bits) {
  return code | ((bits >> 28) & (code + 7u) & 8u);
}

// --- blocks ------------------------------------------------------------------------------------------

struct BlockScale {
  int e;            // shared exponent
  float inv_scale;  // 2^-e
  bool finite;      // false: scale byte 0xFF, every code 0
  bool tiny;        // e <= kTinyBlockExponent: elements go through scaled_magnitude_tiny
  uint8_t byte;     // the E8M0 scale byte
};

// amax: the largest |x| bit pattern of the block (integer max, so NaN counts as larger than Inf).
JA_HOST_DEVICE BlockScale block_scale(uint32_t amax, ScaleRule rule) {
  BlockScale s;
  s.e = scale_exponent(amax, rule);
  s.finite = amax < kInfBits;
  s.tiny = s.e <= kTinyBlockExponent;
  s.inv_scale = pow2(s.e > 126 ? -126 : -s.e);  // e = 127 needs amax >= 2^129: never finite
  s.byte = scale_byte(amax, s.e);
  return s;
}

// The 4-bit code of one element x of a finite, not tiny block, rounded to nearest (the kernels' common case).
JA_HOST_DEVICE uint32_t encode_nearest(float x, float inv_scale) {
  return signed_code(round_nearest(fabsf(x) * inv_scale), float_as_bits(x));
}

// The 4-bit code of one element of a finite block, from its float32 bits. kTiny must be s.tiny; it is a
// template argument so that the common case carries no per-element branch.
template <bool kTiny>
JA_HOST_DEVICE uint32_t encode(uint32_t bits, const BlockScale& s, bool stochastic, uint32_t draw) {
  const uint32_t magnitude = bits & kAbsMask;
  const float v = kTiny ? scaled_magnitude_tiny(magnitude, s.e) : scaled_magnitude(magnitude, s.inv_scale);
  return signed_code(stochastic ? round_stochastic(v, draw) : round_nearest(v), bits);
}

// --- round to nearest from bf16 with subnormal floats (the GPU kernels' common case) --------------------
//
// For a finite block with shared exponent e <= 23, p = |x| * 2^(-e-126) = v * 2^-126 (v = |x| / 2^e) is a
// normal float for v >= 1, with exponent field k = v's binade + 1, and a subnormal float with bits v * 2^23
// below 1. Either way the E2M1 code is p's bits rounded to a multiple of 2^22, ties to even, over 2^22: 2k plus
// the top mantissa bit for normals, round(2 v) for subnormals, which is the E2M1 grid with its subnormal 0.5.
// p is exact for v >= 1/4 when x has at most 8 significant bits (bf16): its last bit is then at least
// 2^-9 * 2^23, so no bit of v is lost to the subnormal grid, and below 1/4 (code 0) rounding cannot pass 1/4.
// The rounding itself is a float addition (subnormal_rounded_bits), so an element costs a multiplication, an
// addition and two integer operations, about half of encode()'s binade selection; but the multiplication must
// keep subnormal results, which GPUs do and XLA's CPU runtime (FTZ/DAZ) does not, so only the CUDA kernels use
// this.
JA_HOST_DEVICE bool subnormal_codes_apply(const BlockScale& s) { return s.finite && s.e <= 23; }

// 2^(-e-126) for e in [-127, 23]: normal up to e = 0, subnormal above.
JA_HOST_DEVICE float subnormal_code_factor(int e) {
  return bits_as_float(e <= 0 ? static_cast<uint32_t>(1 - e) << 23 : 0x400000u >> (e - 1));
}

// The E2M1 magnitude code c of one element (0..8; 8, for v in [7, 8), happens under the floor rule only and
// saturates to 7 in signed_codes) plus kRoundedBias. p's bits are below 2^25 and, for a bf16 input with v >= 1/4,
// multiples of 4, so 2^23 + bits / 4 is a float in [2^23, 2^24) whose value is exact; adding 2^43, whose unit in the
// last place is 2^20, rounds it once, ties to even, to 2^43 + 2^23 + round(bits / 2^22) * 2^20, whose bits are
// kRoundedBias + c. (Below v = 1/4 the dropped bits only lower a value that rounds to 0 anyway.) The bias is
// linear, so callers sum shifted results and subtract the shifted biases once.
inline constexpr uint32_t kRoundedBias = 0x55000008u;  // float bits of 2^43 + 2^23

// x * y rounded to nearest, subnormal results kept: on the device an explicit PTX multiplication without .ftz,
// so that a build with -ftz=true or --use_fast_math (which flush the plain `*`) still gets exact codes.
JA_HOST_DEVICE float multiply_keeping_subnormals(float x, float y) {
#if defined(__CUDA_ARCH__)
  float product;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(product) : "f"(x), "f"(y));
  return product;
#else
  return x * y;
#endif
}

JA_HOST_DEVICE uint32_t subnormal_rounded_bits(float x, float factor) {
  const uint32_t p = float_as_bits(multiply_keeping_subnormals(fabsf(x), factor));
  return float_as_bits(bits_as_float(0x4B000000u + (p >> 2)) + 8796093022208.f);
}

// Eight packed codes (nibble j: element j's code, 0..8) with their signs (bit 4j + 3 of `signs`; its other bits
// are ignored): 8 saturates to 7, and a zero code keeps a + sign (code + 7 has bit 3 set exactly for 1..7).
JA_HOST_DEVICE uint32_t signed_codes(uint32_t codes, uint32_t signs) {
  codes -= (codes >> 3) & 0x11111111u;
  return codes | (signs & (codes + 0x77777777u) & 0x88888888u);
}

// Sign bits for signed_codes from the high bytes of eight bf16 elements, whose top bit is the sign: `even`
// holds the bytes of elements 0, 2, 4, 6 and `odd` those of 1, 3, 5, 7 (byte i: element 2i or 2i + 1).
JA_HOST_DEVICE uint32_t interleave_signs(uint32_t even, uint32_t odd) {
  return ((even >> 4) & 0x0F0F0F0Fu) | (odd & 0xF0F0F0F0u);
}

// --- dequantization into bf16 --------------------------------------------------------------------------

// bf16 bits of E2M1 magnitude code m (0..7) times 2^(s - 127), for a scale byte s < 255, by the reference's
// rule (_dequantized_bits): every MXFP4 value is a bf16 value, so this is exact, subnormals and Inf included.
JA_HOST_DEVICE uint32_t dequantized_magnitude_bf16(uint32_t m, uint32_t s) {
  if (m == 0) return 0;
  const uint32_t half = m >= 2 ? (m & 1u) : 0u;
  const int field = (m >= 2 ? static_cast<int>(m >> 1) - 1 : -1) + static_cast<int>(s);
  if (field >= 255) return 0x7F80u;
  if (field >= 1) return (static_cast<uint32_t>(field) << 7) | (half << 6);
  return (2u + half) << (field + 5);  // below 2^-126: field is -1 or 0
}

// CUDA's __byte_perm with selectors 0..7: byte i of the result is byte (s >> 4i) & 7 of the 8 bytes b:a.
// HIP's __byte_perm goes through a byte array; the portable form below is what HIP and hosts use.
JA_HOST_DEVICE uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, s);
#else
  const uint64_t bytes = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  JA_UNROLL
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((bytes >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// The high bytes (sign and top exponent bits) of the eight bf16 values in words a, b, c, d, two per word: those
// of the words' low halves in order (a's, b's, c's, d's), and of their high halves.
struct Bf16HighBytes {
  uint32_t low_halves, high_halves;
};

JA_HOST_DEVICE Bf16HighBytes bf16_high_bytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  const uint32_t ab = byte_perm(a, b, 0x7351u);  // bytes a.1, b.1, a.3, b.3
  const uint32_t cd = byte_perm(c, d, 0x7351u);
  return {byte_perm(ab, cd, 0x5410u), byte_perm(ab, cd, 0x7632u)};
}

// Packed codes, rounded to nearest through subnormal floats, of eight bf16 values of one block for which
// subnormal_codes_apply holds (factor = subnormal_code_factor(e)): consecutive values in four words, as a row's
// 16-byte chunk holds them, ...
JA_HOST_DEVICE uint32_t subnormal_codes_bf16_row(const uint32_t (&w)[4], float factor) {
  uint32_t biased = 0;
  JA_UNROLL
  for (int j = 0; j < 8; ++j) biased += subnormal_rounded_bits(Bf16::load_word(w[j / 2], j % 2), factor) << (4 * j);
  const uint32_t codes = biased - kRoundedBias * 0x11111111u;
  const Bf16HighBytes high = bf16_high_bytes(w[0], w[1], w[2], w[3]);
  return signed_codes(codes, interleave_signs(high.low_halves, high.high_halves));
}

// ... or one half (0: low, 1: high) of each of eight words, as a column of a tile of rows holds them.
JA_HOST_DEVICE uint32_t subnormal_codes_bf16_column(const uint32_t* w, int half, float factor) {
  uint32_t biased = 0;
  JA_UNROLL
  for (int j = 0; j < 8; ++j) biased += subnormal_rounded_bits(Bf16::load_word(w[j], half), factor) << (4 * j);
  const uint32_t codes = biased - kRoundedBias * 0x11111111u;
  const Bf16HighBytes even = bf16_high_bytes(w[0], w[2], w[4], w[6]);
  const Bf16HighBytes odd = bf16_high_bytes(w[1], w[3], w[5], w[7]);
  return signed_codes(codes, half == 0 ? interleave_signs(even.low_halves, odd.low_halves)
                                       : interleave_signs(even.high_halves, odd.high_halves));
}

// float32 bits rounded to odd at bf16 precision: the low 16 bits dropped, and the lowest kept bit set when any of
// them was set (their sum with 0xFFFF carries into bit 16 exactly then). Rounding to odd keeps every value that
// bf16 holds and moves every other one strictly between its two bf16 neighbours, so a later rounding to nearest on
// a grid at least 4 times coarser than bf16's (E2M1 codes: at most 2 significant bits, 8 for bf16; for subnormal
// float32 values the grid steps are 2^-133 and at least 2^-128) sees the same ties and the same sides of them as
// the float32 value: the code is the same.
JA_HOST_DEVICE uint32_t odd_rounded_bf16_bits(uint32_t bits) {
  return (bits | ((bits & 0xFFFFu) + 0xFFFFu)) & 0xFFFF0000u;
}

// Packed codes of eight float32 values of one block for which subnormal_codes_apply holds (the GPU kernels'
// rotated values): rounded to odd at bf16 precision, then encoded as bf16 inputs (subnormal_codes_bf16_row).
JA_HOST_DEVICE uint32_t subnormal_codes_float(const float* y, float factor) {
  uint32_t w[4];
  JA_UNROLL
  for (int i = 0; i < 4; ++i)
    w[i] = (odd_rounded_bf16_bits(float_as_bits(y[2 * i])) >> 16) | odd_rounded_bf16_bits(float_as_bits(y[2 * i + 1]));
  return subnormal_codes_bf16_row(w, factor);
}

// The 8 bf16 magnitudes of one block's scale byte as byte tables for byte_perm (lo/hi: low/high bytes of the
// magnitudes of codes 0..3 and 4..7), and where sign bits apply: everywhere but in a NaN block, whose every
// element is the bf16 NaN 0x7FC0 (the reference ignores the sign there).
struct Bf16Table {
  uint32_t lo0123, lo4567, hi0123, hi4567;
  uint32_t sign_mask;  // 0x80808080 or 0
};

JA_HOST_DEVICE Bf16Table bf16_table(uint32_t s) {
  uint32_t pair[4];  // magnitudes of codes 2i (low half) and 2i + 1 (high half)
  if (s - 2u <= 250u) {
    // Scale bytes 2..252, the common case: every non-zero magnitude is normal and finite, (s - 1) * 2^7 plus
    // 0, 128, 192, 256, 320, 384, 448 for codes 1..7 (code << 6 from code 2 on), added to both halves at once.
    const uint32_t base = ((s - 1u) << 7) * 0x10001u;
    pair[0] = base & 0xFFFF0000u;
    pair[1] = base + 0x00C00080u;
    pair[2] = base + 0x01400100u;
    pair[3] = base + 0x01C00180u;
  } else if (s == kNanScale) {
    pair[0] = pair[1] = pair[2] = pair[3] = 0x7FC07FC0u;
  } else {
    JA_UNROLL
    for (int i = 0; i < 4; ++i)
      pair[i] = dequantized_magnitude_bf16(2u * i, s) | (dequantized_magnitude_bf16(2u * i + 1u, s) << 16);
  }
  Bf16Table t;
  t.lo0123 = byte_perm(pair[0], pair[1], 0x6420u);
  t.hi0123 = byte_perm(pair[0], pair[1], 0x7531u);
  t.lo4567 = byte_perm(pair[2], pair[3], 0x6420u);
  t.hi4567 = byte_perm(pair[2], pair[3], 0x7531u);
  t.sign_mask = s == kNanScale ? 0u : 0x80808080u;
  return t;
}

// The 8 bf16 values of 4 packed bytes w (little-endian; element j in nibble j) of one block, as 4 words of
// bf16 pairs: the nibbles' magnitude bits are the byte_perm selectors of 4 elements at a time, the sign bits
// move to the top of the high bytes, and the low and high bytes interleave into bf16 pairs.
JA_HOST_DEVICE void dequantize_word_bf16(uint32_t w, const Bf16Table& t, uint32_t (&out)[4]) {
  const uint32_t sel03 = w & 0x7777u;
  const uint32_t sel47 = (w >> 16) & 0x7777u;
  const uint32_t sign_even = (w << 4) & t.sign_mask;  // byte i: the sign of element 2i in its top bit
  const uint32_t sign_odd = w & t.sign_mask;          // byte i: the sign of element 2i + 1
  const uint32_t lo03 = byte_perm(t.lo0123, t.lo4567, sel03);
  const uint32_t hi03 = byte_perm(t.hi0123, t.hi4567, sel03) | byte_perm(sign_even, sign_odd, 0x5140u);
  const uint32_t lo47 = byte_perm(t.lo0123, t.lo4567, sel47);
  const uint32_t hi47 = byte_perm(t.hi0123, t.hi4567, sel47) | byte_perm(sign_even, sign_odd, 0x7362u);
  out[0] = byte_perm(lo03, hi03, 0x5140u);
  out[1] = byte_perm(lo03, hi03, 0x7362u);
  out[2] = byte_perm(lo47, hi47, 0x5140u);
  out[3] = byte_perm(lo47, hi47, 0x7362u);
}

// --- AITER layouts -----------------------------------------------------------------------------------

// Byte offset of packed byte (row, col) of a [rows, cols] fp4x2 matrix in the (16, 16) shuffled layout:
// view (rows/16, 16, cols/32, 2, 16), transposed to (0, 2, 3, 1, 4). Needs rows % 16 == 0 and cols % 32 == 0;
// 16-byte runs of a row (col % 16 == 0) stay contiguous.
JA_HOST_DEVICE int64_t shuffled_data_offset(int64_t row, int64_t col, int64_t cols) {
  const int64_t r0 = row >> 4, r1 = row & 15;
  const int64_t c0 = col >> 5, c1 = (col >> 4) & 1, c2 = col & 15;
  return (((r0 * (cols >> 5) + c0) * 2 + c1) * 16 + r1) * 16 + c2;
}

// Padded scale matrix of a [rows, cols] scale matrix: (ceil(rows/256)*256, ceil(cols/8)*8).
JA_HOST_DEVICE int64_t padded_scale_rows(int64_t rows) { return (rows + 255) / 256 * 256; }
JA_HOST_DEVICE int64_t padded_scale_cols(int64_t cols) { return (cols + 7) / 8 * 8; }

// Offset of scale (row, col) in the shuffled padded layout: view (Rp/32, 2, 16, Sp/8, 2, 4), transposed to
// (0, 3, 5, 2, 4, 1).
JA_HOST_DEVICE int64_t shuffled_scale_offset(int64_t row, int64_t col, int64_t padded_cols) {
  const int64_t a = row >> 5, b = (row >> 4) & 1, c = row & 15;
  const int64_t d = col >> 3, e = (col >> 2) & 1, f = col & 3;
  return ((((a * (padded_cols >> 3) + d) * 4 + f) * 16 + c) * 2 + e) * 2 + b;
}

JA_HOST_DEVICE int64_t scale_offset(Layout layout, int64_t row, int64_t col, int64_t cols) {
  return layout == Layout::kPlain ? row * cols + col : shuffled_scale_offset(row, col, padded_scale_cols(cols));
}

JA_HOST_DEVICE int64_t data_offset(Layout layout, int64_t row, int64_t col, int64_t cols) {
  return layout == Layout::kGemmB ? shuffled_data_offset(row, col, cols) : row * cols + col;
}

}  // namespace jax_aiter::mxfp4
