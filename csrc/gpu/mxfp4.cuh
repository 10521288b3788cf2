// MXFP4 casts on the GPU (CUDA and HIP from this one source): the rowwise copy of x [M, K] and/or of x^T,
// reading x once for both. Numerics: the shared codec (jax_aiter/mxfp4_codec.h), bit-exact with the reference.
//
// A block of 256 threads owns a tile of 64 rows x 512 bytes of x (256 bf16/fp16 or 128 fp32 columns), or for
// some 16-bit casts with a rotated columnwise copy 32 rows (cast_tile_rows says which: twice the blocks, half the
// work per thread).
// * Load: each thread loads 8 chunks (4 in a 32-row tile) of 16 bytes, 32 consecutive threads one tile row (fully
//   coalesced).
// * Rowwise copy, from those registers: a 32-element block spans kGroup = 32 / (elements per chunk) adjacent
//   lanes (4 for 16-bit types, 8 for fp32), which combine amax and the cross-lane Hadamard stages through
//   shuffles of width kGroup; each lane writes its packed bytes (a warp writes a contiguous run).
// * Columnwise copy, through shared memory: each thread takes one 32-row half of the tile and one 4-byte
//   column of it (two 16-bit columns or one fp32 column), quantizes each column's 32 values in registers and
//   writes 16 bytes per column; the two halves of a column make one 32-byte sector. In a 32-row tile each thread
//   takes one 16-bit column.
// Three variants of each kernel (CastPath): the plain one (no Hadamard) keeps its inputs packed and carries no
// rotation code, so it stays within fewer registers and instructions per element; the rotated-columns one is the
// same with the columnwise copy rotated (the default recipe's wgrad operands); the general one handles every
// option (a rotated rowwise copy). The first two come in two roundings, to nearest and stochastic (a compile-time
// choice, so that the common nearest kernels carry no hashing).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "jax_aiter/element.h"
#include "jax_aiter/gpu.h"
#include "jax_aiter/mxfp4_codec.h"

namespace jax_aiter::kernels {

struct Mxfp4CopyArgs {
  uint8_t* data;  // packed codes, or with `values` the copy's bf16 values [rows, cols]
  uint8_t* scales;
  int hadamard;  // 0, 16 or 32
  mxfp4::Layout layout;
  bool values;
};

template <typename S>
struct CastMxfp4Args {
  const S* x;
  int64_t m;
  int64_t k;
  const uint32_t* sr_key;  // device memory, uint32[2] each
  const uint32_t* hadamard_key;
  const uint32_t* index_offset;
  mxfp4::ScaleRule rule;
  bool stochastic;
  bool hadamard_signs;
  Mxfp4CopyArgs row;  // the view x [M, K]
  Mxfp4CopyArgs col;  // the view x^T [K, M]
};

inline constexpr int kCastThreads = 256;
inline constexpr int kCastTileRows = 64;
inline constexpr int kCastSmallTileRows = 32;
inline constexpr int kCastChunksPerRow = 32;  // 16-byte chunks per tile row: 512 bytes
template <int kRows>
inline constexpr int kCastChunksPerThread = kRows * kCastChunksPerRow / kCastThreads;

template <typename S>
inline constexpr int kCastTileCols = kCastChunksPerRow * gpu::kVec16<S>;

namespace cast_detail {

// 16 bytes of x as four 32-bit words: 16-bit elements stay packed in registers (two per word) and are
// widened where used, which keeps register use (and so occupancy) the same for every dtype.
using Chunk = gpu::Vec<uint32_t, 4>;

template <typename E>
__device__ __forceinline__ float chunk_value(const Chunk& c, int j) {
  if constexpr (sizeof(typename E::Storage) == 4) return bits_as_float(c.v[j]);
  return E::load_word(c.v[j / 2], j % 2);
}

// Codes of N values of one block part with their block's scale, packed 4 bits each (element j at bit 4j).
template <int N>
__device__ __forceinline__ uint32_t encode_packed(const uint32_t (&bits)[N], const mxfp4::BlockScale& s,
                                                  bool stochastic, const uint32_t (&draw)[N]) {
  static_assert(N <= 8, "one 32-bit word holds 8 codes");
  uint32_t packed = 0;
  if (!s.finite) return packed;
  if (s.tiny) {
#pragma unroll
    for (int j = 0; j < N; ++j) packed |= mxfp4::encode<true>(bits[j], s, stochastic, draw[j]) << (4 * j);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) packed |= mxfp4::encode<false>(bits[j], s, stochastic, draw[j]) << (4 * j);
  }
  return packed;
}

template <int N>
__device__ __forceinline__ uint32_t amax_of(const uint32_t (&bits)[N]) {
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) amax = gpu::amax_step(amax, bits_as_float(bits[j]));
  return float_as_bits(amax);
}

// The kGroup lanes of one block combine their amax (each a non-negative float carrier, see gpu::amax_step).
template <int kGroup>
__device__ __forceinline__ uint32_t group_amax(uint32_t amax) {
  constexpr int kStages = kGroup == 4 ? 2 : 3;
  float a = bits_as_float(amax);
#pragma unroll
  for (int stage = 0; stage < kStages; ++stage) a = gpu::amax_step(a, gpu::shfl_xor(a, 1 << stage, kGroup));
  return float_as_bits(a);
}

// A rowwise copy in layout "values": the bf16 values of one lane's V codes (elements col .. col + V - 1 of row).
template <int V, typename S>
__device__ __forceinline__ void store_row_values(const CastMxfp4Args<S>& a, int64_t row, int64_t col, uint8_t scale,
                                                 uint32_t packed) {
  gpu::Vec<uint32_t, 4> values;
  mxfp4::dequantize_word_bf16(packed, mxfp4::bf16_table(scale), values.v);
  uint32_t* out = reinterpret_cast<uint32_t*>(reinterpret_cast<uint16_t*>(a.row.data) + row * a.k + col);
  if constexpr (V == 8) {
    gpu::store_global_16(out, values);
  } else {
    gpu::store_vec<2>(out, gpu::Vec<uint32_t, 2>{{values.v[0], values.v[1]}});
  }
}

// Rowwise output of one lane: its scale byte (first lane of the group) and V/2 packed bytes.
template <int V, typename S>
__device__ __forceinline__ void store_rowwise(const CastMxfp4Args<S>& a, int64_t row, int64_t col, int lane,
                                              uint8_t scale, uint32_t packed) {
  if (lane == 0)
    a.row.scales[mxfp4::scale_offset(a.row.layout, row, col / mxfp4::kBlock, a.k / mxfp4::kBlock)] = scale;
  if (a.row.values) {
    store_row_values<V>(a, row, col, scale, packed);
    return;
  }
  uint8_t* out = a.row.data + mxfp4::data_offset(a.row.layout, row, col / 2, a.k / 2);
  if constexpr (V == 8) {
    *reinterpret_cast<uint32_t*>(out) = packed;
  } else {
    *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(packed);
  }
}

// Where a thread's rowwise output goes. Its chunk i sits in row first_row + 8i (first_row = tile start + 0..7,
// tiles start at multiples of 32 and hold at most 64 rows), so in every layout the offsets are the chunk-0 offsets plus
//   data:  (i >> 1) * data_pair + (i & 1) * data_odd
//   scale: (i >> 2) * scale_quad + ((i >> 1) & 1) * scale_pair + (i & 1) * scale_odd
// (in the shuffled layouts, i & 1 moves within a 16-row group and i >> 1 to the next). With i a constant of
// the unrolled loop, that is one or two adds per chunk instead of the full index arithmetic.
struct RowwiseOffsets {
  int64_t data, data_pair, data_odd;
  int64_t scale, scale_quad, scale_pair, scale_odd;
};

template <typename S>
__device__ __forceinline__ RowwiseOffsets rowwise_offsets(const CastMxfp4Args<S>& a, int64_t first_row,
                                                          int64_t col) {
  const int64_t data_cols = a.k / 2, scale_cols = a.k / mxfp4::kBlock;
  RowwiseOffsets o;
  o.data = mxfp4::data_offset(a.row.layout, first_row, col / 2, data_cols);
  o.data_pair = 16 * data_cols;
  o.data_odd = a.row.layout == mxfp4::Layout::kGemmB ? 8 * 16 : 8 * data_cols;
  o.scale = mxfp4::scale_offset(a.row.layout, first_row, col / mxfp4::kBlock, scale_cols);
  if (a.row.layout == mxfp4::Layout::kPlain) {
    o.scale_quad = 32 * scale_cols;
    o.scale_pair = 16 * scale_cols;
    o.scale_odd = 8 * scale_cols;
  } else {
    o.scale_quad = 32 * mxfp4::padded_scale_cols(scale_cols);
    o.scale_pair = 1;
    o.scale_odd = 8 * 4;
  }
  return o;
}

// bf16 on CUDA rounds through subnormal floats (mxfp4::subnormal_rounded_bits, about half the instructions of
// mxfp4::encode_nearest); HIP keeps the portable encoder, as its denormal mode is not verified here.
template <typename E>
inline constexpr bool kSubnormalCodes = std::is_same_v<E, Bf16> && !JA_HIP;

// Packed codes of one chunk's V elements (one block part) rounded to nearest with their block's scale.
template <typename E, int V>
__device__ __forceinline__ uint32_t chunk_codes_nearest(const Chunk& chunk, const mxfp4::BlockScale& s) {
  if constexpr (kSubnormalCodes<E>) {
    if (mxfp4::subnormal_codes_apply(s)) {
      return mxfp4::subnormal_codes_bf16_row(chunk.v, mxfp4::subnormal_code_factor(s.e));
    }
  }
  uint32_t packed = 0;
  if (s.finite && !s.tiny) {
#pragma unroll
    for (int j = 0; j < V; ++j) packed |= mxfp4::encode_nearest(chunk_value<E>(chunk, j), s.inv_scale) << (4 * j);
  } else if (s.finite) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      packed |= mxfp4::encode<true>(float_as_bits(chunk_value<E>(chunk, j)), s, false, 0u) << (4 * j);
  }
  return packed;
}

// Where the draws of stochastic rounding come from (docs/mxfp4.md): the element (row, col) of the logical input
// draws sr_finish(sr_row(key0, row), col, key1 ^ stream).
struct DrawKeys {
  uint32_t key0;
  uint32_t key1_stream;
};

// Packed codes of one chunk's V elements (one block part, logical columns logical_col ..) rounded stochastically.
template <typename E, int V>
__device__ __forceinline__ uint32_t chunk_codes_stochastic(const Chunk& chunk, const mxfp4::BlockScale& s,
                                                           uint32_t row_hash, uint32_t logical_col,
                                                           uint32_t key1_stream) {
  uint32_t bits[V];
  uint32_t draw[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    bits[j] = float_as_bits(chunk_value<E>(chunk, j));
    draw[j] = mxfp4::sr_finish(row_hash, logical_col + static_cast<uint32_t>(j), key1_stream);
  }
  return encode_packed(bits, s, true, draw);
}

// Rowwise, no rotation: straight from the loaded chunk i, in row first_row + 8i, rounded to nearest or (kStochastic)
// stochastically with draws for logical row row_offset + that row and logical columns logical_col ...
template <typename E, int V, bool kStochastic, int i>
__device__ __forceinline__ void rowwise_chunk_plain(const CastMxfp4Args<typename E::Storage>& a, const Chunk& chunk,
                                                    const RowwiseOffsets& o, int64_t first_row, int64_t col,
                                                    bool valid, DrawKeys keys, uint32_t row_offset,
                                                    uint32_t logical_col) {
  constexpr int kGroup = mxfp4::kBlock / V;
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) amax = gpu::amax_step(amax, chunk_value<E>(chunk, j));
  const mxfp4::BlockScale s = mxfp4::block_scale(group_amax<kGroup>(float_as_bits(amax)), a.rule);
  uint32_t packed;
  if constexpr (kStochastic) {
    const uint32_t row_hash = mxfp4::sr_row(keys.key0, row_offset + static_cast<uint32_t>(first_row + 8 * i));
    packed = chunk_codes_stochastic<E, V>(chunk, s, row_hash, logical_col, keys.key1_stream);
  } else {
    packed = chunk_codes_nearest<E, V>(chunk, s);
  }
  if (!valid) return;
  if (static_cast<int>(threadIdx.x) % kGroup == 0)
    a.row.scales[o.scale + (i >> 2) * o.scale_quad + ((i >> 1) & 1) * o.scale_pair + (i & 1) * o.scale_odd] = s.byte;
  if (a.row.values) {
    store_row_values<V>(a, first_row + 8 * i, col, s.byte, packed);
    return;
  }
  uint8_t* out = a.row.data + o.data + (i >> 1) * o.data_pair + (i & 1) * o.data_odd;
  if constexpr (V == 8) {
    *reinterpret_cast<uint32_t*>(out) = packed;
  } else {
    *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(packed);
  }
}

template <typename E, int V, bool kStochastic, int... kChunks>
__device__ __forceinline__ void rowwise_plain(const CastMxfp4Args<typename E::Storage>& a,
                                              const Chunk (&chunks)[sizeof...(kChunks)], int64_t first_row,
                                              int64_t col, std::integer_sequence<int, kChunks...>) {
  static_assert(kCastThreads / kCastChunksPerRow == 8 && sizeof...(kChunks) <= 8, "offset strides assume this");
  const RowwiseOffsets o = rowwise_offsets(a, first_row, col);
  DrawKeys keys{};
  uint32_t row_offset = 0, logical_col = 0;
  if constexpr (kStochastic) {
    keys = {a.sr_key[0], a.sr_key[1] ^ mxfp4::kRowwiseStream};
    row_offset = a.index_offset[0];
    logical_col = a.index_offset[1] + static_cast<uint32_t>(col);
  }
  (rowwise_chunk_plain<E, V, kStochastic, kChunks>(a, chunks[kChunks], o, first_row, col,
                                                   first_row + 8 * kChunks < a.m && col < a.k, keys, row_offset,
                                                   logical_col),
   ...);
}

// The rotation of one rowwise block across the kGroup lanes that hold it, V values per lane (kFlush: see
// mxfp4::rotation_never_flushes).
template <bool kFlush, int V>
__device__ __forceinline__ void rotate_rowwise(float (&y)[V], int size, uint32_t sign_bits, int lane) {
  constexpr int kGroup = mxfp4::kBlock / V;
#pragma unroll
  for (int j = 0; j < V; ++j) y[j] = mxfp4::hadamard_input<kFlush>(y[j], (sign_bits >> j) & 1u);
  // Stages with half < V pair values inside the lane, the others pair lanes (half / V apart). Stages are
  // counted linearly so that every loop unrolls (an unroller needs an affine trip count).
  constexpr int kLaneStages = V == 8 ? 3 : 2;
#pragma unroll
  for (int stage = 0; stage < kLaneStages; ++stage) {
    const int half = 1 << stage;
    if (half >= size) break;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (j & half) continue;
      const float low = y[j];
      const float high = y[j + half];
      y[j] = mxfp4::butterfly_sum<kFlush>(low, high);
      y[j + half] = mxfp4::butterfly_difference<kFlush>(low, high);
    }
  }
#pragma unroll
  for (int stage = kLaneStages; stage < 5; ++stage) {
    if ((1 << stage) >= size) break;
    const int mask = (1 << stage) / V;
    const bool low_lane = (lane & mask) == 0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float other = gpu::shfl_xor(y[j], mask, kGroup);
      y[j] = low_lane ? mxfp4::butterfly_sum<kFlush>(y[j], other) : mxfp4::butterfly_difference<kFlush>(other, y[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) y[j] = mxfp4::hadamard_output<kFlush>(y[j], size);
}

// Rowwise, general: this lane's V consecutive elements of one 32-element block whose other elements sit in
// the neighbouring lanes of its group. Every lane of the wave calls this (the shuffles need all lanes); `valid`
// says whether the lane's chunk is inside x; `unflushed` (the same in every lane of the wave) that no rotation
// of the wave's blocks can flush.
template <typename E, int V>
__device__ __forceinline__ void rowwise_chunk(const CastMxfp4Args<typename E::Storage>& a, const Chunk& chunk,
                                              int64_t row, int64_t col, bool valid, bool unflushed,
                                              uint32_t sign_bits, uint32_t row_hash, uint32_t key1_stream,
                                              uint32_t col_offset) {
  constexpr int kGroup = mxfp4::kBlock / V;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  float y[V];
#pragma unroll
  for (int j = 0; j < V; ++j) y[j] = chunk_value<E>(chunk, j);

  const int size = a.row.hadamard;
  if (size != 0) {
    if (unflushed) rotate_rowwise<false>(y, size, sign_bits, lane);
    else rotate_rowwise<true>(y, size, sign_bits, lane);
  }

  uint32_t bits[V];
#pragma unroll
  for (int j = 0; j < V; ++j) bits[j] = float_as_bits(y[j]);
  const mxfp4::BlockScale s = mxfp4::block_scale(group_amax<kGroup>(amax_of(bits)), a.rule);

  uint32_t draw[V] = {};
  if (a.stochastic) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      draw[j] = mxfp4::sr_finish(row_hash, col_offset + static_cast<uint32_t>(col + j), key1_stream);
  }
  const uint32_t packed = encode_packed(bits, s, a.stochastic, draw);
  if (valid) store_rowwise<V>(a, row, col, lane, s.byte, packed);
}

// One block of the columnwise copy (row `col` of x^T, elements row0 .. row0 + 31): its 16 packed bytes, or in
// layout "values" their 32 bf16 values.
template <typename S>
__device__ __forceinline__ void store_column_block(const CastMxfp4Args<S>& a, int64_t col, int64_t row0, uint8_t scale,
                                                   const gpu::Vec<uint32_t, 4>& packed) {
  if (a.col.values) {
    const mxfp4::Bf16Table table = mxfp4::bf16_table(scale);
    uint32_t* out = reinterpret_cast<uint32_t*>(reinterpret_cast<uint16_t*>(a.col.data) + col * a.m + row0);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      gpu::Vec<uint32_t, 4> values;
      mxfp4::dequantize_word_bf16(packed.v[w], table, values.v);
      gpu::store_global_16(out + 4 * w, values);
    }
    return;
  }
  gpu::store_vec<4>(reinterpret_cast<uint32_t*>(a.col.data + mxfp4::data_offset(a.col.layout, col, row0 / 2, a.m / 2)),
                    packed);
}

// Columnwise: the 32 values of one column of one 32-row half of the tile, quantized as one block of x^T.
// row_signs: the keyed sign bit (0 or 1) of each of the 32 rows, or nullptr for the plain Hadamard.
template <bool kFlush>
__device__ __forceinline__ void rotate_column(float (&y)[mxfp4::kBlock], int size, const uint32_t* row_signs) {
  if (row_signs != nullptr) {
#pragma unroll
    for (int j = 0; j < mxfp4::kBlock; ++j) y[j] = mxfp4::hadamard_input<kFlush>(y[j], row_signs[j]);
  } else {
#pragma unroll
    for (int j = 0; j < mxfp4::kBlock; ++j) y[j] = mxfp4::hadamard_input<kFlush>(y[j], 0u);
  }
  if (size == 16) {
    mxfp4::hadamard_chunk<16, kFlush>(y);
    mxfp4::hadamard_chunk<16, kFlush>(y + 16);
  } else {
    mxfp4::hadamard_chunk<32, kFlush>(y);
  }
}

// The rotation of one column block, without the flushes when none of its inputs can meet one
// (mxfp4::rotation_never_flushes).
__device__ __forceinline__ void rotate_column_block(float (&y)[mxfp4::kBlock], int size, const uint32_t* row_signs) {
  uint32_t nonzero_min = 0xFFFFFFFFu;
#pragma unroll
  for (int j = 0; j < mxfp4::kBlock; ++j) nonzero_min = mxfp4::nonzero_min_step(nonzero_min, y[j]);
  if (mxfp4::rotation_never_flushes(nonzero_min)) rotate_column<false>(y, size, row_signs);
  else rotate_column<true>(y, size, row_signs);
}

// Packed codes of the 32 values of one column block, value(j) giving element j as a float; rounded to nearest, or
// stochastically with element j drawing for logical row row_hashes[j] (sr_row of it) and logical column logical_col.
template <typename Value>
__device__ __forceinline__ gpu::Vec<uint32_t, 4> column_codes(const mxfp4::BlockScale& s, Value value,
                                                             bool stochastic, const uint32_t* row_hashes,
                                                             uint32_t logical_col, uint32_t key1_stream) {
  gpu::Vec<uint32_t, 4> packed;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t part[8];
    uint32_t draw[8] = {};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      part[j] = float_as_bits(value(8 * w + j));
      if (stochastic) draw[j] = mxfp4::sr_finish(row_hashes[8 * w + j], logical_col, key1_stream);
    }
    packed.v[w] = encode_packed(part, s, stochastic, draw);
  }
  return packed;
}

template <typename S>
__device__ __forceinline__ void columnwise_block(const CastMxfp4Args<S>& a, float (&y)[mxfp4::kBlock], int64_t col,
                                                 int64_t row0, const uint32_t* row_signs,
                                                 const uint32_t* row_hashes, uint32_t key1_stream,
                                                 uint32_t col_offset) {
  if (a.col.hadamard != 0) rotate_column_block(y, a.col.hadamard, row_signs);
  uint32_t bits[mxfp4::kBlock];
#pragma unroll
  for (int j = 0; j < mxfp4::kBlock; ++j) bits[j] = float_as_bits(y[j]);
  const mxfp4::BlockScale s = mxfp4::block_scale(amax_of(bits), a.rule);
  a.col.scales[mxfp4::scale_offset(a.col.layout, col, row0 / mxfp4::kBlock, a.m / mxfp4::kBlock)] = s.byte;

  const uint32_t logical_col = col_offset + static_cast<uint32_t>(col);
  const gpu::Vec<uint32_t, 4> packed =
      column_codes(s, [&](int j) { return y[j]; }, a.stochastic, row_hashes, logical_col, key1_stream);
  store_column_block(a, col, row0, s.byte, packed);
}

// Columnwise, round to nearest, no rotation: column c of the 4-byte words of 32 tile rows, widened where
// used (twice: amax, then codes) instead of held as 32 floats.
template <typename E, int kCols>
__device__ __forceinline__ float column_value(uint32_t word, int c) {
  return E::load_word(word, c);
}

// Columnwise, no rotation, rounded to nearest or (kStochastic) stochastically.
template <typename E, int kCols, bool kStochastic>
__device__ __forceinline__ void columnwise_block_plain(const CastMxfp4Args<typename E::Storage>& a,
                                                       const uint32_t (&words)[mxfp4::kBlock], int c, int64_t col,
                                                       int64_t row0, const uint32_t* row_hashes,
                                                       uint32_t logical_col, uint32_t key1_stream) {
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < mxfp4::kBlock; ++j) amax = gpu::amax_step(amax, column_value<E, kCols>(words[j], c));
  const mxfp4::BlockScale s = mxfp4::block_scale(float_as_bits(amax), a.rule);
  a.col.scales[mxfp4::scale_offset(a.col.layout, col, row0 / mxfp4::kBlock, a.m / mxfp4::kBlock)] = s.byte;
  gpu::Vec<uint32_t, 4> packed{};
  if constexpr (kStochastic) {
    packed = column_codes(
        s, [&](int j) { return column_value<E, kCols>(words[j], c); }, true, row_hashes, logical_col, key1_stream);
  } else if (kSubnormalCodes<E> && mxfp4::subnormal_codes_apply(s)) {
    const float factor = mxfp4::subnormal_code_factor(s.e);
#pragma unroll
    for (int g = 0; g < 4; ++g) packed.v[g] = mxfp4::subnormal_codes_bf16_column(&words[8 * g], c, factor);
  } else if (s.finite && !s.tiny) {
#pragma unroll
    for (int j = 0; j < mxfp4::kBlock; ++j)
      packed.v[j / 8] |= mxfp4::encode_nearest(column_value<E, kCols>(words[j], c), s.inv_scale) << (4 * (j % 8));
  } else if (s.finite) {
#pragma unroll
    for (int j = 0; j < mxfp4::kBlock; ++j)
      packed.v[j / 8] |= mxfp4::encode<true>(float_as_bits(column_value<E, kCols>(words[j], c)), s, false, 0u)
                         << (4 * (j % 8));
  }
  store_column_block(a, col, row0, s.byte, packed);
}

// The portable encoder meets no subnormal float; CUDA's keeps them (see kSubnormalCodes), so on CUDA rotated
// float32 values go through the subnormal-float encoder too, rounded to odd at bf16 precision first.
inline constexpr bool kSubnormalFloatCodes = !JA_HIP;

// Columnwise, round to nearest, rotated: column c of the 4-byte words of 32 tile rows (read from shared memory
// once per column: holding the words as well as the 32 rotated values would cost a third of the occupancy),
// widened, rotated along the rows (x^T's quantization axis) and encoded.
template <typename E, int kCols, bool kStochastic>
__device__ __forceinline__ void columnwise_block_rotated(const CastMxfp4Args<typename E::Storage>& a,
                                                         const uint32_t* words, int stride, int c, int64_t col,
                                                         int64_t row0, const uint32_t* row_signs,
                                                         const uint32_t* row_hashes, uint32_t logical_col,
                                                         uint32_t key1_stream) {
  float y[mxfp4::kBlock];
#pragma unroll
  for (int j = 0; j < mxfp4::kBlock; ++j) y[j] = column_value<E, kCols>(words[j * stride], c);
  rotate_column_block(y, a.col.hadamard, row_signs);
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < mxfp4::kBlock; ++j) amax = gpu::amax_step(amax, y[j]);
  const mxfp4::BlockScale s = mxfp4::block_scale(float_as_bits(amax), a.rule);
  a.col.scales[mxfp4::scale_offset(a.col.layout, col, row0 / mxfp4::kBlock, a.m / mxfp4::kBlock)] = s.byte;
  gpu::Vec<uint32_t, 4> packed{};
  if constexpr (kStochastic) {
    packed = column_codes(s, [&](int j) { return y[j]; }, true, row_hashes, logical_col, key1_stream);
  } else if (kSubnormalFloatCodes && mxfp4::subnormal_codes_apply(s)) {
    const float factor = mxfp4::subnormal_code_factor(s.e);
#pragma unroll
    for (int g = 0; g < 4; ++g) packed.v[g] = mxfp4::subnormal_codes_float(&y[8 * g], factor);
  } else if (s.finite && !s.tiny) {
#pragma unroll
    for (int j = 0; j < mxfp4::kBlock; ++j)
      packed.v[j / 8] |= mxfp4::encode_nearest(y[j], s.inv_scale) << (4 * (j % 8));
  } else if (s.finite) {
#pragma unroll
    for (int j = 0; j < mxfp4::kBlock; ++j)
      packed.v[j / 8] |= mxfp4::encode<true>(float_as_bits(y[j]), s, false, 0u) << (4 * (j % 8));
  }
  store_column_block(a, col, row0, s.byte, packed);
}

// A shuffled copy's scales are allocated in whole tiles of 256 rows and 8 block columns; no block of the view
// [rows, blocks * 32] lands on the rest, which must read 0. The cast's threads write those zeros instead of a memset
// of the whole allocation before the launch, a launch of its own. In the shuffled layout (shuffled_scale_offset) the
// rows come in groups of 32, each a run of 32 * padded_cols bytes made of one 256-byte run per 8 block columns. So
// the padding is the groups past the real rows (one contiguous range, written 16 bytes at a time), the last 8-column
// run of every group of real rows when blocks is not a multiple of 8, and the other runs of a group that ends in
// padding rows. All of it is spread over every thread of the grid by flat indices taken apart with shifts only (a
// division made a kernel held to three blocks per SM spill). One thread per padding row, as it was, took about 30 us
// for the 64 padding rows of a 192-row copy (benchmarks/results/small_casts_h200_2026-12-06/).
// Not inlined, so that its index arithmetic takes no registers from the tile's code around it (inlined, it made
// the stochastic rotated-columns kernel, held to three blocks per SM, spill).
__device__ __noinline__ void zero_shuffled_scale_padding(uint8_t* scales, int64_t rows, int64_t blocks) {
  const int64_t padded_cols = mxfp4::padded_scale_cols(blocks);
  const int64_t group_bytes = 32 * padded_cols;
  const int64_t real_groups = (rows + 31) >> 5;
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  const int64_t thread = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;

  uint8_t* const past = scales + real_groups * group_bytes;
  const int64_t past_bytes = ((mxfp4::padded_scale_rows(rows) >> 5) - real_groups) * group_bytes;  // 256 * n
  if (reinterpret_cast<uintptr_t>(past) % 16 == 0) {
#pragma unroll 1
    for (int64_t i = thread; i < past_bytes / 16; i += threads)
      gpu::store_global_16(reinterpret_cast<uint32_t*>(past + 16 * i), gpu::Vec<uint32_t, 4>{});
  } else {
#pragma unroll 1
    for (int64_t i = thread; i < past_bytes; i += threads) past[i] = 0;
  }

  // Byte j of a 256-byte run holds row 16 * (j & 1) + ((j >> 2) & 15) of its group and column
  // 4 * ((j >> 1) & 1) + (j >> 6) of its 8.
  const int64_t last_run = (padded_cols >> 3) - 1;
  if (blocks < padded_cols) {
#pragma unroll 1
    for (int64_t i = thread; i < real_groups * 256; i += threads) {
      const int64_t group = i >> 8;
      const int j = static_cast<int>(i & 255);
      const int64_t row = 32 * group + 16 * (j & 1) + ((j >> 2) & 15);
      const int64_t col = 8 * last_run + 4 * ((j >> 1) & 1) + (j >> 6);
      if (row >= rows || col >= blocks) scales[group * group_bytes + 256 * last_run + j] = 0;
    }
  }
  if (rows % 32 != 0) {
    const int64_t group = real_groups - 1;
    const int64_t runs = blocks < padded_cols ? last_run : last_run + 1;  // the last one is done above
#pragma unroll 1
    for (int64_t i = thread; i < runs * 256; i += threads) {
      const int j = static_cast<int>(i & 255);
      if (32 * group + 16 * (j & 1) + ((j >> 2) & 15) >= rows) scales[group * group_bytes + i] = 0;
    }
  }
}

__device__ __forceinline__ void zero_scale_padding(const Mxfp4CopyArgs& copy, int64_t rows, int64_t blocks) {
  if (copy.data == nullptr || copy.values || copy.layout == mxfp4::Layout::kPlain) return;
  zero_shuffled_scale_padding(copy.scales, rows, blocks);
}

// Where in the kernel this runs changes the register allocation around it (ptxas, sm_90), even as a call: last, the
// general bf16 dual kernel takes 145 registers instead of 128 (one block per SM instead of two). So the general
// kernels run it first and the others last.
template <bool kRowwise, bool kColumnwise, typename S>
__device__ __forceinline__ void zero_scale_paddings(const CastMxfp4Args<S>& a) {
  if constexpr (kRowwise) zero_scale_padding(a.row, a.m, a.k / mxfp4::kBlock);
  if constexpr (kColumnwise) zero_scale_padding(a.col, a.k, a.m / mxfp4::kBlock);
}

}  // namespace cast_detail

// kPlain: no rotation. kRotatedColumns: the same, with the columnwise copy rotated (the rowwise copy, if any, is
// not); both round as kStochastic says. kGeneral: stochastic rounding and Hadamard rotations as the arguments say
// (kStochastic unused).
enum class CastPath { kPlain, kRotatedColumns, kGeneral };

// kVectorLoads: x rows are 16-byte aligned (K * sizeof(S) % 16 == 0 and x aligned), so chunks load as one
// access; otherwise (possible only for a columnwise-only cast) elements load one by one.
template <typename E, int kRows, bool kRowwise, bool kColumnwise, bool kVectorLoads, CastPath kPath, bool kStochastic>
__device__ __forceinline__ void cast_mxfp4_tile(const CastMxfp4Args<typename E::Storage>& a) {
  using S = typename E::Storage;
  using namespace cast_detail;
  constexpr bool kGeneral = kPath == CastPath::kGeneral;
  constexpr bool kRotatedColumns = kPath == CastPath::kRotatedColumns;
  constexpr int V = gpu::kVec16<S>;
  constexpr int kTileCols = kCastTileCols<S>;
  constexpr int kChunks = kCastChunksPerThread<kRows>;
  constexpr int kTileRowsStored = kColumnwise ? kRows : 1;
  __shared__ Chunk tile[kTileRowsStored][kCastChunksPerRow];
  static_assert(!(kGeneral && kStochastic), "the general kernel decides stochastic rounding at run time");
  constexpr int kHashRows = kColumnwise && (kGeneral || kStochastic) ? kRows : 1;
  constexpr int kSignRows = kColumnwise && kPath != CastPath::kPlain ? kRows : 1;
  __shared__ uint32_t col_row_hash[kHashRows];
  __shared__ uint32_t col_sign[kSignRows];

  const int64_t tiles_k = (a.k + kTileCols - 1) / kTileCols;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) / tiles_k * kRows;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) % tiles_k * kTileCols;
  const int t = static_cast<int>(threadIdx.x);
  const int chunk_col = t % kCastChunksPerRow;
  const int64_t col = k0 + int64_t{chunk_col} * V;
  const uint32_t row_offset = a.index_offset[0];
  const uint32_t col_offset = a.index_offset[1];

  Chunk chunks[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int tile_row = t / kCastChunksPerRow + i * (kCastThreads / kCastChunksPerRow);
    const int64_t row = m0 + tile_row;
    const S* src = a.x + row * a.k + col;
    chunks[i] = Chunk{};
    if constexpr (kVectorLoads) {
      if (row < a.m && col < a.k) chunks[i] = gpu::load_vec<4>(reinterpret_cast<const uint32_t*>(src));
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (row >= a.m || col + j >= a.k) continue;
        if constexpr (sizeof(S) == 4) {
          chunks[i].v[j] = float_as_bits(src[j]);
        } else {
          chunks[i].v[j / 2] |= static_cast<uint32_t>(src[j]) << (16 * (j % 2));
        }
      }
    }
    if constexpr (kColumnwise) tile[tile_row][chunk_col] = chunks[i];
  }

  if constexpr (kColumnwise && (kPath != CastPath::kPlain || kStochastic)) {
    if (t < kRows) {
      const uint32_t logical_row = row_offset + static_cast<uint32_t>(m0 + t);
      if (kStochastic || (kGeneral && a.stochastic)) col_row_hash[t] = mxfp4::sr_row(a.sr_key[0], logical_row);
      if (a.hadamard_signs && a.col.hadamard != 0)
        col_sign[t] = mxfp4::hadamard_sign_bit(a.hadamard_key[0], a.hadamard_key[1], logical_row);
    }
  }

  if constexpr (kRowwise && !kGeneral) {
    rowwise_plain<E, V, kStochastic>(a, chunks, m0 + t / kCastChunksPerRow, col,
                                     std::make_integer_sequence<int, kChunks>{});
  }

  if constexpr (kRowwise && kGeneral) {
    uint32_t sign_bits = 0;
    if (a.hadamard_signs && a.row.hadamard != 0) {
#pragma unroll
      for (int j = 0; j < V; ++j)
        sign_bits |= mxfp4::hadamard_sign_bit(a.hadamard_key[0], a.hadamard_key[1],
                                              col_offset + static_cast<uint32_t>(col + j))
                     << j;
    }
    // One decision for the wave (its lanes rotate together): no flush when no element it holds can meet one.
    bool unflushed = false;
    if (a.row.hadamard != 0) {
      uint32_t nonzero_min = 0xFFFFFFFFu;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
#pragma unroll
        for (int j = 0; j < V; ++j) nonzero_min = mxfp4::nonzero_min_step(nonzero_min, chunk_value<E>(chunks[i], j));
      }
      unflushed = mxfp4::rotation_never_flushes(gpu::wave_min(nonzero_min));
    }
    const uint32_t key1_stream = a.sr_key[1] ^ mxfp4::kRowwiseStream;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int64_t row = m0 + t / kCastChunksPerRow + i * (kCastThreads / kCastChunksPerRow);
      const uint32_t row_hash =
          a.stochastic ? mxfp4::sr_row(a.sr_key[0], row_offset + static_cast<uint32_t>(row)) : 0u;
      rowwise_chunk<E, V>(a, chunks[i], row, col, row < a.m && col < a.k, unflushed, sign_bits, row_hash,
                          key1_stream, col_offset);
    }
  }

  if constexpr (kColumnwise) {
    __syncthreads();
    constexpr int kColsPerWord = static_cast<int>(4 / sizeof(S));  // one 4-byte word of a tile row
    static_assert(kColsPerWord == 1 || kColsPerWord == 2, "fp32, or a 16-bit type");
    constexpr int kWordsPerRow = kCastChunksPerRow * 4;
    static_assert(kWordsPerRow * 2 == kCastThreads, "two threads per word column");
    // A 64-row tile: thread t takes the 32-row half t / 128 of word column t % 128, every column of the word; a
    // 32-row tile (16-bit types): column t / 128 of that word.
    constexpr bool kHalves = kRows == kCastTileRows;
    static_assert(kHalves || (kRows == kCastSmallTileRows && kColsPerWord == 2), "32-row tiles hold 16-bit types");
    constexpr int kThreadCols = kHalves ? kColsPerWord : 1;
    const int word = t % kWordsPerRow;
    const int half = kHalves ? t / kWordsPerRow : 0;
    const int first_c = kHalves ? 0 : t / kWordsPerRow;
    const int64_t row0 = m0 + half * mxfp4::kBlock;
    if (row0 >= a.m) return;
    const uint32_t* row_signs = nullptr;
    if constexpr (kPath != CastPath::kPlain) {
      if (a.hadamard_signs && a.col.hadamard != 0) row_signs = &col_sign[half * mxfp4::kBlock];
    }
    const uint32_t* row_hashes = &col_row_hash[kHashRows > 1 ? half * mxfp4::kBlock : 0];
    const uint32_t key1_stream = kHashRows > 1 ? a.sr_key[1] ^ mxfp4::kColumnwiseStream : 0u;
    if constexpr (kRotatedColumns) {
      const uint32_t* words = reinterpret_cast<const uint32_t*>(&tile[half * mxfp4::kBlock][0]) + word;
#pragma unroll
      for (int i = 0; i < kThreadCols; ++i) {
        const int c = first_c + i;
        const int64_t column = k0 + int64_t{word} * kColsPerWord + c;
        if (column < a.k)
          columnwise_block_rotated<E, kColsPerWord, kStochastic>(
              a, words, kWordsPerRow, c, column, row0, row_signs, row_hashes,
              col_offset + static_cast<uint32_t>(column), key1_stream);
      }
    } else if constexpr (!kGeneral) {
      uint32_t words[mxfp4::kBlock];
#pragma unroll
      for (int j = 0; j < mxfp4::kBlock; ++j)
        words[j] = reinterpret_cast<const uint32_t*>(&tile[half * mxfp4::kBlock + j][0])[word];
#pragma unroll
      for (int i = 0; i < kThreadCols; ++i) {
        const int c = first_c + i;
        const int64_t column = k0 + int64_t{word} * kColsPerWord + c;
        if (column < a.k)
          columnwise_block_plain<E, kColsPerWord, kStochastic>(a, words, c, column, row0, row_hashes,
                                                               col_offset + static_cast<uint32_t>(column),
                                                               key1_stream);
      }
    } else {
      float y[kThreadCols][mxfp4::kBlock];
#pragma unroll
      for (int j = 0; j < mxfp4::kBlock; ++j) {
        const uint32_t bits = reinterpret_cast<const uint32_t*>(&tile[half * mxfp4::kBlock + j][0])[word];
#pragma unroll
        for (int i = 0; i < kThreadCols; ++i) y[i][j] = E::load_word(bits, first_c + i);
      }
#pragma unroll
      for (int i = 0; i < kThreadCols; ++i) {
        const int64_t column = k0 + int64_t{word} * kColsPerWord + first_c + i;
        if (column < a.k)
          columnwise_block(a, y[i], column, row0, row_signs, row_hashes, key1_stream, col_offset);
      }
    }
  }
}

// On CUDA the stochastic rotated-columns kernels are held to three blocks per SM (at most 85 registers, no spills):
// left alone, the compiler gives the dual ones 96-98 registers and two blocks, 18-22 % slower on the H200
// (benchmarks/results/sr_casts_h200_2026-12-05/). The same bound makes the plain stochastic dual kernels spill, and
// on HIP it spills too; those, and every other kernel, keep the compiler's own allocation.
template <typename E, int kRows, bool kRowwise, bool kColumnwise, bool kVectorLoads, CastPath kPath, bool kStochastic>
__global__ void __launch_bounds__(kCastThreads) cast_mxfp4_kernel(CastMxfp4Args<typename E::Storage> a) {
  if constexpr (kPath == CastPath::kGeneral) cast_detail::zero_scale_paddings<kRowwise, kColumnwise>(a);
  cast_mxfp4_tile<E, kRows, kRowwise, kColumnwise, kVectorLoads, kPath, kStochastic>(a);
  if constexpr (kPath != CastPath::kGeneral) cast_detail::zero_scale_paddings<kRowwise, kColumnwise>(a);
}

template <typename E, int kRows, bool kRowwise, bool kColumnwise, bool kVectorLoads>
__global__ void __launch_bounds__(kCastThreads, 3)
    cast_mxfp4_stochastic_rotated_kernel(CastMxfp4Args<typename E::Storage> a) {
  cast_mxfp4_tile<E, kRows, kRowwise, kColumnwise, kVectorLoads, CastPath::kRotatedColumns, true>(a);
  cast_detail::zero_scale_paddings<kRowwise, kColumnwise>(a);
}

template <typename E, int kRows, bool kRowwise, bool kColumnwise, bool kVectorLoads, CastPath kPath, bool kStochastic>
void launch_cast_kernel(const CastMxfp4Args<typename E::Storage>& a, unsigned grid, gpu::Stream stream) {
  if constexpr (kStochastic && kPath == CastPath::kRotatedColumns && !JA_HIP)
    cast_mxfp4_stochastic_rotated_kernel<E, kRows, kRowwise, kColumnwise, kVectorLoads>
        <<<grid, kCastThreads, 0, stream>>>(a);
  else
    cast_mxfp4_kernel<E, kRows, kRowwise, kColumnwise, kVectorLoads, kPath, kStochastic>
        <<<grid, kCastThreads, 0, stream>>>(a);
}

template <typename E, int kRows, CastPath kPath, bool kStochastic = false>
void launch_cast_variant(const CastMxfp4Args<typename E::Storage>& a, unsigned grid, bool row, bool col,
                         bool vector_loads, gpu::Stream stream) {
  if (row && col)
    launch_cast_kernel<E, kRows, true, true, true, kPath, kStochastic>(a, grid, stream);
  else if (row)
    launch_cast_kernel<E, kRows, true, false, true, kPath, kStochastic>(a, grid, stream);
  else if (vector_loads)
    launch_cast_kernel<E, kRows, false, true, true, kPath, kStochastic>(a, grid, stream);
  else
    launch_cast_kernel<E, kRows, false, true, false, kPath, kStochastic>(a, grid, stream);
}

// A 16-bit cast whose columnwise copy is rotated (and its rowwise one not) runs 32-row tiles when it rounds
// stochastically or has at least kRotatedSmallTilesFrom tiles of 64 rows: its threads each rotate two 32-value
// columns serially, and halving that work (48 registers against 80 for the bf16 dual) paid for twice the blocks
// (5-21 % at 16384 rows and widths 768-4096). The narrow ones rounding to nearest (the 192-wide key and value
// gradients: 256 tiles) ran faster on 64 rows, and plain casts did at every size from 1024 columns: with 32 rows the
// columnwise data leave in 16-byte halves of sectors (benchmarks/results/small_casts_h200_2026-12-06/).
inline constexpr int64_t kRotatedSmallTilesFrom = 512;

template <typename S>
int64_t cast_tiles_of(const CastMxfp4Args<S>& a, int rows) {
  return (a.m + rows - 1) / rows * ((a.k + kCastTileCols<S> - 1) / kCastTileCols<S>);
}

template <typename S>
int cast_tile_rows(const CastMxfp4Args<S>& a) {
  if (sizeof(S) != 2 || a.col.data == nullptr || a.col.hadamard == 0 ||
      (a.row.data != nullptr && a.row.hadamard != 0))
    return kCastTileRows;
  const bool small = a.stochastic || cast_tiles_of(a, kCastTileRows) >= kRotatedSmallTilesFrom;
  return small ? kCastSmallTileRows : kCastTileRows;
}

// Tiles (thread blocks) the cast a launches; the handler rejects more than a grid holds.
template <typename S>
int64_t cast_mxfp4_tiles(const CastMxfp4Args<S>& a) {
  return cast_tiles_of(a, cast_tile_rows(a));
}

template <typename E, bool kStochastic>
void launch_rotated_columns(const CastMxfp4Args<typename E::Storage>& a, unsigned grid, bool row,
                            bool vector_loads, gpu::Stream stream) {
  if constexpr (sizeof(typename E::Storage) == 2) {
    if (cast_tile_rows(a) == kCastSmallTileRows) {
      launch_cast_variant<E, kCastSmallTileRows, CastPath::kRotatedColumns, kStochastic>(a, grid, row, true,
                                                                                         vector_loads, stream);
      return;
    }
  }
  launch_cast_variant<E, kCastTileRows, CastPath::kRotatedColumns, kStochastic>(a, grid, row, true, vector_loads,
                                                                               stream);
}

// Rowwise needs whole 16-byte chunks (K % 32 == 0 gives that); the caller checks alignment of x.
template <typename E>
gpu::Status launch_cast_mxfp4(const CastMxfp4Args<typename E::Storage>& a, gpu::Stream stream) {
  if (a.m == 0 || a.k == 0) return gpu::kSuccess;
  const auto grid = static_cast<unsigned>(cast_mxfp4_tiles(a));
  const bool row = a.row.data != nullptr;
  const bool col = a.col.data != nullptr;
  const bool vector_loads = a.k % gpu::kVec16<typename E::Storage> == 0 && gpu::aligned16(a.x);
  const bool rotated_columns = col && a.col.hadamard != 0;
  if (row && a.row.hadamard != 0)
    launch_cast_variant<E, kCastTileRows, CastPath::kGeneral>(a, grid, row, col, vector_loads, stream);
  else if (rotated_columns && a.stochastic)
    launch_rotated_columns<E, true>(a, grid, row, vector_loads, stream);
  else if (rotated_columns)
    launch_rotated_columns<E, false>(a, grid, row, vector_loads, stream);
  else if (a.stochastic)
    launch_cast_variant<E, kCastTileRows, CastPath::kPlain, true>(a, grid, row, col, vector_loads, stream);
  else
    launch_cast_variant<E, kCastTileRows, CastPath::kPlain>(a, grid, row, col, vector_loads, stream);
  return gpu::last_error();
}

// --- exact dequantization into bf16 (ja_dequantize_mxfp4) ---------------------------------------------------
//
// The output [R, C] bf16 dominates the traffic (4 bytes written per byte read), so the thread mapping serves it:
// each thread decodes 8 elements (one 4-byte word of data, within one 32-element block) into one 16-byte store,
// and 8 consecutive threads write 128 contiguous bytes of a row. A block of 256 threads writes a tile of
// 16 rows x 512 columns: thread t takes the 8 columns 8 * (t % 8) of the 64-column chunk t / 32 and the rows
// 4j + (t / 8) % 4 for j = 0..3, its four words loaded before any is decoded. Reads stay whole 32-byte
// sectors in every layout: a plain row gives 32 contiguous bytes per 64 columns, and in the shuffled layout
// four consecutive rows of a 16-row tile are 64 contiguous bytes for each half of the 64 columns. Each thread
// reads its block's scale byte (the 4 threads of a block share that load) and turns it into the block's
// table of 8 magnitudes (mxfp4::bf16_table), which byte_perm then indexes 4 elements at a time.

inline constexpr int kDequantThreads = 256;
inline constexpr int kDequantTileRows = 16;
inline constexpr int kDequantTileCols = 512;
inline constexpr int kDequantSteps = 4;  // rows per thread
static_assert(kDequantTileRows == 4 * kDequantSteps && kDequantTileCols == 8 * kDequantThreads / 4,
              "each thread covers 8 columns in 4 rows");

struct DequantizeMxfp4Args {
  const uint8_t* data;
  const uint8_t* scales;
  uint16_t* out;
  int64_t rows;
  int64_t cols;
};

template <mxfp4::Layout kLayout>
__global__ void __launch_bounds__(kDequantThreads) dequantize_mxfp4_kernel(DequantizeMxfp4Args a) {
  const int t = static_cast<int>(threadIdx.x);
  const int64_t col_tiles = (a.cols + kDequantTileCols - 1) / kDequantTileCols;
  const int64_t tile = blockIdx.x;
  const int64_t row0 = tile / col_tiles * kDequantTileRows + (t / 8) % 4;
  const int64_t col = tile % col_tiles * kDequantTileCols + (t / 32) * 64 + (t % 8) * 8;
  if (col >= a.cols) return;
  const int64_t blocks = a.cols / mxfp4::kBlock;
  uint32_t words[kDequantSteps];
  uint32_t scales[kDequantSteps];
#pragma unroll
  for (int j = 0; j < kDequantSteps; ++j) {
    const int64_t row = row0 + 4 * j;
    if (row < a.rows) {
      words[j] = *reinterpret_cast<const uint32_t*>(a.data +
                                                   mxfp4::data_offset(kLayout, row, col / 2, a.cols / 2));
      scales[j] = a.scales[mxfp4::scale_offset(kLayout, row, col / mxfp4::kBlock, blocks)];
    }
  }
#pragma unroll
  for (int j = 0; j < kDequantSteps; ++j) {
    const int64_t row = row0 + 4 * j;
    if (row >= a.rows) break;
    gpu::Vec<uint32_t, 4> values;
    mxfp4::dequantize_word_bf16(words[j], mxfp4::bf16_table(scales[j]), values.v);
    gpu::store_global_16(reinterpret_cast<uint32_t*>(a.out + row * a.cols + col), values);
  }
}

inline int64_t dequantize_mxfp4_tiles(int64_t rows, int64_t cols) {
  return (rows + kDequantTileRows - 1) / kDequantTileRows * ((cols + kDequantTileCols - 1) / kDequantTileCols);
}

// The caller checks that the tiles fit one grid and that data and out are 16-byte aligned.
inline gpu::Status launch_dequantize_mxfp4(const DequantizeMxfp4Args& a, mxfp4::Layout layout, gpu::Stream stream) {
  if (a.rows == 0 || a.cols == 0) return gpu::kSuccess;
  const auto grid = static_cast<unsigned>(dequantize_mxfp4_tiles(a.rows, a.cols));
  if (layout == mxfp4::Layout::kGemmB)
    dequantize_mxfp4_kernel<mxfp4::Layout::kGemmB><<<grid, kDequantThreads, 0, stream>>>(a);
  else if (layout == mxfp4::Layout::kGemmA)
    dequantize_mxfp4_kernel<mxfp4::Layout::kGemmA><<<grid, kDequantThreads, 0, stream>>>(a);
  else
    dequantize_mxfp4_kernel<mxfp4::Layout::kPlain><<<grid, kDequantThreads, 0, stream>>>(a);
  return gpu::last_error();
}

}  // namespace jax_aiter::kernels
