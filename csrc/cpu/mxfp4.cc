// MXFP4 on the CPU (contracts in csrc/include/jax_aiter/mxfp4.h), block by block through the shared codec
// (jax_aiter/mxfp4_codec.h): the casts (target ja_cast_mxfp4), the rowwise copy of x and/or of x^T, and the
// exact dequantization into bf16 (ja_dequantize_mxfp4).

#include <cstdint>
#include <cstring>

#include "jax_aiter/element.h"
#include "jax_aiter/mxfp4.h"

namespace jax_aiter {
namespace {

using mxfp4::kBlock;

// The keyed signs and the rotation of block b of a row of the view (kFlush: see mxfp4::rotation_never_flushes).
template <bool kFlush>
void rotate_block(const Mxfp4CastPlan& plan, int size, uint32_t col_offset, int64_t b, float (&y)[kBlock]) {
  for (int i = 0; i < kBlock; ++i) {
    const uint32_t index = col_offset + static_cast<uint32_t>(b * kBlock + i);
    const uint32_t sign =
        plan.hadamard_signs ? mxfp4::hadamard_sign_bit(plan.hadamard_key[0], plan.hadamard_key[1], index) : 0u;
    y[i] = mxfp4::hadamard_input<kFlush>(y[i], sign);
  }
  for (int chunk = 0; chunk < kBlock; chunk += size) {
    if (size == 16) mxfp4::hadamard_chunk<16, kFlush>(y + chunk);
    else mxfp4::hadamard_chunk<32, kFlush>(y + chunk);
  }
}

// Quantizes the view [copy.rows, copy.cols] of x: element (r, c) is x[r, c], or x[c, r] when `transposed`.
// Hashes take the element's indices in the logical input (x offset by plan.index_offset).
template <typename E>
void quantize_copy(const Mxfp4CastPlan& plan, const Mxfp4CopyPlan& copy, bool transposed) {
  using S = typename E::Storage;
  const S* x = static_cast<const S*>(plan.x);
  const uint32_t key1_stream = plan.sr_key[1] ^ (transposed ? mxfp4::kColumnwiseStream : mxfp4::kRowwiseStream);
  // Logical offsets of the view's rows and columns.
  const uint32_t row_offset = plan.index_offset[transposed ? 1 : 0];
  const uint32_t col_offset = plan.index_offset[transposed ? 0 : 1];
  const int64_t blocks = copy.cols / kBlock;
  if (copy.padded) std::memset(copy.scales, 0, static_cast<size_t>(copy.scale_bytes));

  for (int64_t r = 0; r < copy.rows; ++r) {
    const uint32_t view_row = row_offset + static_cast<uint32_t>(r);
    for (int64_t b = 0; b < blocks; ++b) {
      float y[kBlock];
      for (int i = 0; i < kBlock; ++i) {
        const int64_t c = b * kBlock + i;
        y[i] = E::load(transposed ? x[c * plan.k + r] : x[r * plan.k + c]);
      }
      if (copy.hadamard != 0) {
        uint32_t nonzero_min = 0xFFFFFFFFu;
        for (int i = 0; i < kBlock; ++i) nonzero_min = mxfp4::nonzero_min_step(nonzero_min, y[i]);
        if (mxfp4::rotation_never_flushes(nonzero_min)) rotate_block<false>(plan, copy.hadamard, col_offset, b, y);
        else rotate_block<true>(plan, copy.hadamard, col_offset, b, y);
      }
      uint32_t bits[kBlock];
      uint32_t amax = 0;
      for (int i = 0; i < kBlock; ++i) {
        bits[i] = float_as_bits(y[i]);
        const uint32_t magnitude = bits[i] & mxfp4::kAbsMask;
        amax = magnitude > amax ? magnitude : amax;
      }
      const mxfp4::BlockScale scale = mxfp4::block_scale(amax, plan.rule);
      copy.scales[mxfp4::scale_offset(copy.layout, r, b, blocks)] = scale.byte;

      uint8_t packed[kBlock / 2] = {};
      if (scale.finite) {
        const uint32_t row_hash = plan.stochastic && !transposed ? mxfp4::sr_row(plan.sr_key[0], view_row) : 0u;
        for (int i = 0; i < kBlock; ++i) {
          const uint32_t view_col = col_offset + static_cast<uint32_t>(b * kBlock + i);
          uint32_t draw = 0;
          // The logical element is (view_row, view_col), or (view_col, view_row) in a transposed view.
          if (plan.stochastic)
            draw = transposed ? mxfp4::sr_finish(mxfp4::sr_row(plan.sr_key[0], view_col), view_row, key1_stream)
                              : mxfp4::sr_finish(row_hash, view_col, key1_stream);
          const uint32_t code = scale.tiny ? mxfp4::encode<true>(bits[i], scale, plan.stochastic, draw)
                                           : mxfp4::encode<false>(bits[i], scale, plan.stochastic, draw);
          packed[i / 2] |= static_cast<uint8_t>(code << (4 * (i % 2)));
        }
      }
      if (copy.values) {
        const mxfp4::Bf16Table table = mxfp4::bf16_table(scale.byte);
        uint16_t* dst = reinterpret_cast<uint16_t*>(copy.data) + r * copy.cols + b * kBlock;
        for (int i = 0; i < 4; ++i) {
          uint32_t word, values[4];
          std::memcpy(&word, packed + 4 * i, sizeof(word));
          mxfp4::dequantize_word_bf16(word, table, values);
          std::memcpy(dst + 8 * i, values, sizeof(values));
        }
      } else {
        std::memcpy(copy.data + mxfp4::data_offset(copy.layout, r, b * (kBlock / 2), copy.cols / 2), packed,
                    sizeof(packed));
      }
    }
  }
}

ffi::Error CastMxfp4(ffi::AnyBuffer x, ffi::Buffer<ffi::U32> sr_key, ffi::Buffer<ffi::U32> hadamard_key,
                     ffi::Buffer<ffi::U32> index_offset, ffi::Result<ffi::AnyBuffer> row_data,
                     ffi::Result<ffi::AnyBuffer> row_scales, ffi::Result<ffi::AnyBuffer> col_data,
                     ffi::Result<ffi::AnyBuffer> col_scales, CastMxfp4Attrs attrs) {
  auto plan =
      plan_cast_mxfp4(x, sr_key, hadamard_key, index_offset, *row_data, *row_scales, *col_data, *col_scales, attrs);
  if (plan.has_error()) return plan.error();
  return visit_float_element(plan.value().dtype, "x", [&](auto e) {
    using E = decltype(e);
    if (plan.value().row.enabled) quantize_copy<E>(plan.value(), plan.value().row, false);
    if (plan.value().col.enabled) quantize_copy<E>(plan.value(), plan.value().col, true);
    return ffi::Error::Success();
  });
}

// Each 32-element block: one scale byte, 16 data bytes (contiguous in every layout), 64 bytes of bf16 out.
ffi::Error DequantizeMxfp4(ffi::AnyBuffer data, ffi::AnyBuffer scales, ffi::Result<ffi::AnyBuffer> out,
                           std::string_view layout) {
  auto planned = plan_dequantize_mxfp4(data, scales, *out, layout);
  if (planned.has_error()) return planned.error();
  const Mxfp4DequantizePlan& plan = planned.value();
  const int64_t blocks = plan.cols / kBlock;
  for (int64_t r = 0; r < plan.rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const mxfp4::Bf16Table table = mxfp4::bf16_table(plan.scales[mxfp4::scale_offset(plan.layout, r, b, blocks)]);
      const uint8_t* bytes = plan.data + mxfp4::data_offset(plan.layout, r, b * (kBlock / 2), plan.cols / 2);
      uint16_t* dst = plan.out + r * plan.cols + b * kBlock;
      for (int i = 0; i < 4; ++i) {
        uint32_t word, values[4];
        std::memcpy(&word, bytes + 4 * i, sizeof(word));
        mxfp4::dequantize_word_bf16(word, table, values);
        std::memcpy(dst + 8 * i, values, sizeof(values));
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaDequantizeMxfp4Cpu, jax_aiter::DequantizeMxfp4,
                              jax_aiter::bind_dequantize_mxfp4(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaCastMxfp4Cpu, jax_aiter::CastMxfp4,
                              jax_aiter::bind_cast_mxfp4(xla::ffi::Ffi::Bind()));
