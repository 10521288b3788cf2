// Argument blocks of AITER's ASM GEMM code objects, byte for byte (docs/aiter-bridge.md, "Argument blocks").
//
// The code objects read their arguments from fixed offsets, one 16-byte slot per argument: a pointer is 8 bytes
// + 8 of padding, a 32-bit scalar 4 bytes + 12 of padding. The structs below spell the padding out and are
// checked against the documented offsets at compile time, so a wrong edit fails the build instead of feeding a
// kernel garbage. Plain C++ (no HIP), so the CPU tests compile it too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jax_aiter::aiter {

// Padding after a pointer (to 16 bytes) and after a 32-bit scalar (to 16 bytes).
struct PadAfterPointer {
  uint32_t words[2];
};
struct PadAfterScalar {
  uint32_t words[3];
};

// The prefix both GEMM families share: out = alpha * A . B^T + beta * C, with row strides and sizes.
#define JA_AITER_GEMM_COMMON_FIELDS \
  void* ptr_d;                      \
  PadAfterPointer pad_d;            \
  void* ptr_c;                      \
  PadAfterPointer pad_c;            \
  void* ptr_a;                      \
  PadAfterPointer pad_a;            \
  void* ptr_b;                      \
  PadAfterPointer pad_b;            \
  float alpha;                      \
  PadAfterScalar pad_alpha;         \
  float beta;                       \
  PadAfterScalar pad_beta;          \
  uint32_t stride_d0;               \
  PadAfterScalar pad_stride_d0;     \
  uint32_t stride_d1;               \
  PadAfterScalar pad_stride_d1;     \
  uint32_t stride_c0;               \
  PadAfterScalar pad_stride_c0;     \
  uint32_t stride_c1;               \
  PadAfterScalar pad_stride_c1;     \
  uint32_t stride_a0;               \
  PadAfterScalar pad_stride_a0;     \
  uint32_t stride_a1;               \
  PadAfterScalar pad_stride_a1;     \
  uint32_t stride_b0;               \
  PadAfterScalar pad_stride_b0;     \
  uint32_t stride_b1;               \
  PadAfterScalar pad_stride_b1;     \
  uint32_t m;                       \
  PadAfterScalar pad_m;             \
  uint32_t n;                       \
  PadAfterScalar pad_n;             \
  uint32_t k;                       \
  PadAfterScalar pad_k;

// FP4 (a4w4, gfx950): A [M, K] fp4x2 plain, B [N, K] fp4x2 shuffled, per-1x32 e8m0 scales (both shuffled).
// stride_a0/stride_b0 count fp4 elements (= row bytes * 2), stride_c0/stride_d0 output elements, the scale
// strides bytes. The block ends at log2_k_split without trailing padding: 372 bytes are passed although the
// code objects declare 384, as AITER itself does.
struct __attribute__((packed)) Fp4GemmArgs {
  JA_AITER_GEMM_COMMON_FIELDS
  void* ptr_scale_a;
  PadAfterPointer pad_scale_a;
  void* ptr_scale_b;
  PadAfterPointer pad_scale_b;
  uint32_t stride_scale_a0;
  PadAfterScalar pad_stride_scale_a0;
  uint32_t stride_scale_a1;
  PadAfterScalar pad_stride_scale_a1;
  uint32_t stride_scale_b0;
  PadAfterScalar pad_stride_scale_b0;
  uint32_t stride_scale_b1;
  PadAfterScalar pad_stride_scale_b1;
  int32_t log2_k_split;
};

// BF16 (a16w16, gfx942/gfx950): A [M, K] and B [N, K] bf16, out bf16 or fp32. Strides are in bytes.
struct __attribute__((packed)) Bf16GemmArgs {
  JA_AITER_GEMM_COMMON_FIELDS
  uint32_t splitk;
  PadAfterScalar pad_splitk;
  uint32_t is_out_b16;
  PadAfterScalar pad_is_out_b16;
  void* ptr_bias;
  PadAfterPointer pad_bias;
  uint32_t add_bias;
  PadAfterScalar pad_add_bias;
  void* ptr_semaphore;
  PadAfterPointer pad_semaphore;
};

#undef JA_AITER_GEMM_COMMON_FIELDS

// The documented layout (aiter-abi.md). offsetof on these standard-layout structs is well defined.
#define JA_AITER_CHECK_OFFSET(type, field, offset) \
  static_assert(offsetof(type, field) == (offset), #type "::" #field " must be at byte " #offset)

#define JA_AITER_CHECK_COMMON_OFFSETS(type)    \
  JA_AITER_CHECK_OFFSET(type, ptr_d, 0x00);     \
  JA_AITER_CHECK_OFFSET(type, ptr_c, 0x10);     \
  JA_AITER_CHECK_OFFSET(type, ptr_a, 0x20);     \
  JA_AITER_CHECK_OFFSET(type, ptr_b, 0x30);     \
  JA_AITER_CHECK_OFFSET(type, alpha, 0x40);     \
  JA_AITER_CHECK_OFFSET(type, beta, 0x50);      \
  JA_AITER_CHECK_OFFSET(type, stride_d0, 0x60); \
  JA_AITER_CHECK_OFFSET(type, stride_d1, 0x70); \
  JA_AITER_CHECK_OFFSET(type, stride_c0, 0x80); \
  JA_AITER_CHECK_OFFSET(type, stride_c1, 0x90); \
  JA_AITER_CHECK_OFFSET(type, stride_a0, 0xA0); \
  JA_AITER_CHECK_OFFSET(type, stride_a1, 0xB0); \
  JA_AITER_CHECK_OFFSET(type, stride_b0, 0xC0); \
  JA_AITER_CHECK_OFFSET(type, stride_b1, 0xD0); \
  JA_AITER_CHECK_OFFSET(type, m, 0xE0);         \
  JA_AITER_CHECK_OFFSET(type, n, 0xF0);         \
  JA_AITER_CHECK_OFFSET(type, k, 0x100)

JA_AITER_CHECK_COMMON_OFFSETS(Fp4GemmArgs);
JA_AITER_CHECK_OFFSET(Fp4GemmArgs, ptr_scale_a, 0x110);
JA_AITER_CHECK_OFFSET(Fp4GemmArgs, ptr_scale_b, 0x120);
JA_AITER_CHECK_OFFSET(Fp4GemmArgs, stride_scale_a0, 0x130);
JA_AITER_CHECK_OFFSET(Fp4GemmArgs, stride_scale_a1, 0x140);
JA_AITER_CHECK_OFFSET(Fp4GemmArgs, stride_scale_b0, 0x150);
JA_AITER_CHECK_OFFSET(Fp4GemmArgs, stride_scale_b1, 0x160);
JA_AITER_CHECK_OFFSET(Fp4GemmArgs, log2_k_split, 0x170);
static_assert(sizeof(Fp4GemmArgs) == 372, "Fp4GemmArgs must be 372 bytes (0x170 + one int32)");

JA_AITER_CHECK_COMMON_OFFSETS(Bf16GemmArgs);
JA_AITER_CHECK_OFFSET(Bf16GemmArgs, splitk, 0x110);
JA_AITER_CHECK_OFFSET(Bf16GemmArgs, is_out_b16, 0x120);
JA_AITER_CHECK_OFFSET(Bf16GemmArgs, ptr_bias, 0x130);
JA_AITER_CHECK_OFFSET(Bf16GemmArgs, add_bias, 0x140);
JA_AITER_CHECK_OFFSET(Bf16GemmArgs, ptr_semaphore, 0x150);
static_assert(sizeof(Bf16GemmArgs) == 352, "Bf16GemmArgs must be 352 bytes");

#undef JA_AITER_CHECK_COMMON_OFFSETS
#undef JA_AITER_CHECK_OFFSET

// The code objects run 4 wavefronts of 64 lanes per workgroup.
inline constexpr unsigned kGemmBlockThreads = 256;

// Split-K GEMMs (bf16) keep one u32 counter per output tile of a launch: [16, 64] per stream, zeroed.
inline constexpr int kBf16SemaphoreRows = 16;
inline constexpr int kBf16SemaphoreCols = 64;
inline constexpr int kBf16SemaphoreWords = kBf16SemaphoreRows * kBf16SemaphoreCols;

}  // namespace jax_aiter::aiter
