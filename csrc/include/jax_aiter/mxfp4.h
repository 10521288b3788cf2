// The FFI contracts of targets "ja_cast_mxfp4" and "ja_dequantize_mxfp4", shared by the CPU handlers
// (csrc/cpu/mxfp4.cc) and the GPU ones (csrc/gpu/mxfp4.cu): attributes, the operand binding, operand validation,
// and the resulting plan (what to write where). One cast target serves both cast ops of docs/mxfp4.md:
// cast_mxfp4 asks for one copy, cast_mxfp4_dual for both; a copy that is not asked for has 0-element outputs.
//
// Operands: x [M, K] (bf16, fp16, fp32), sr_key uint32[2], hadamard_key uint32[2], index_offset uint32[2]
//           (row, column) of x[0, 0] in the logical input: hashes use logical indices, so a tile or shard of
//           a tensor quantizes exactly as the same elements of the whole tensor.
// Results:  row_data uint8 [M, K/2], row_scales uint8 [M, K/32] (plain) or the padded shuffled shape,
//           col_data uint8 [K, M/2], col_scales uint8 [K, M/32] or padded: the rowwise copy of x^T.
//           A copy in layout "values" has its exact values as data instead, bf16 [M, K] (or [K, M]), the same
//           as ja_dequantize_mxfp4 of its packed bytes, with plain scales.
//
// ja_dequantize_mxfp4 (attribute layout: plain, gemm_a or gemm_b, as the cast writes them):
// Operands: data uint8 [R, C/2], scales uint8 [R, C/32] (plain) or the padded shuffled shape.
// Result:   out bf16 [R, C], row-major: the exact values (every MXFP4 value is a bf16 value).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <string_view>

#include "jax_aiter/ffi_util.h"
#include "jax_aiter/mxfp4_codec.h"

namespace jax_aiter {

struct CastMxfp4Attrs {
  bool rowwise;
  bool columnwise;
  std::string_view scale_rule;
  bool stochastic;
  int32_t hadamard_rowwise;
  int32_t hadamard_columnwise;
  bool hadamard_signs;
  std::string_view layout_rowwise;
  std::string_view layout_columnwise;
};

}  // namespace jax_aiter

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(jax_aiter::CastMxfp4Attrs,
                                      xla::ffi::StructMember<bool>("rowwise"),
                                      xla::ffi::StructMember<bool>("columnwise"),
                                      xla::ffi::StructMember<std::string_view>("scale_rule"),
                                      xla::ffi::StructMember<bool>("stochastic"),
                                      xla::ffi::StructMember<int32_t>("hadamard_rowwise"),
                                      xla::ffi::StructMember<int32_t>("hadamard_columnwise"),
                                      xla::ffi::StructMember<bool>("hadamard_signs"),
                                      xla::ffi::StructMember<std::string_view>("layout_rowwise"),
                                      xla::ffi::StructMember<std::string_view>("layout_columnwise"));

namespace jax_aiter {

// The binding takes the platform's context (none on the CPU, the stream on a GPU) already bound.
template <typename Binding>
auto bind_cast_mxfp4(Binding&& binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::U32>>()
      .template Arg<ffi::Buffer<ffi::U32>>()
      .template Arg<ffi::Buffer<ffi::U32>>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<CastMxfp4Attrs>();
}

// One output copy: the rowwise quantization of the view [rows, cols] (x, or x^T for the columnwise copy).
struct Mxfp4CopyPlan {
  bool enabled = false;
  int hadamard = 0;  // 0, 16 or 32
  mxfp4::Layout layout = mxfp4::Layout::kPlain;
  bool values = false;  // data is bf16 [rows, cols]: the copy's exact values (layout "values"; plain scales)
  int64_t rows = 0;
  int64_t cols = 0;
  uint8_t* data = nullptr;
  uint8_t* scales = nullptr;
  int64_t scale_bytes = 0;  // allocated, padding included
  bool padded = false;      // the allocated scales hold zero padding beyond rows x cols/32
};

struct Mxfp4CastPlan {
  int64_t m = 0;
  int64_t k = 0;
  ffi::DataType dtype = ffi::DataType::INVALID;
  const void* x = nullptr;
  const uint32_t* sr_key = nullptr;        // host memory for the CPU handler, device memory for the GPU one
  const uint32_t* hadamard_key = nullptr;  // likewise
  const uint32_t* index_offset = nullptr;  // likewise
  mxfp4::ScaleRule rule = mxfp4::ScaleRule::kEven;
  bool stochastic = false;
  bool hadamard_signs = false;
  Mxfp4CopyPlan row;
  Mxfp4CopyPlan col;
};

namespace cast_mxfp4_detail {

inline ffi::Error invalid(const std::string& message) { return ffi::Error::InvalidArgument("cast_mxfp4: " + message); }

inline bool parse_layout(std::string_view name, mxfp4::Layout* layout) {
  if (name == "plain") *layout = mxfp4::Layout::kPlain;
  else if (name == "gemm_a") *layout = mxfp4::Layout::kGemmA;
  else if (name == "gemm_b") *layout = mxfp4::Layout::kGemmB;
  else return false;
  return true;
}

inline bool has_shape(const ffi::AnyBuffer& b, int64_t rows, int64_t cols) {
  auto dims = b.dimensions();
  return dims.size() == 2 && dims[0] == rows && dims[1] == cols;
}

inline ffi::Error plan_copy(const char* which, bool enabled, int32_t hadamard, std::string_view layout_name,
                            int64_t rows, int64_t cols, ffi::AnyBuffer& data, ffi::AnyBuffer& scales,
                            Mxfp4CopyPlan* copy) {
  const std::string name(which);
  if (!enabled) {
    if (data.element_count() != 0 || scales.element_count() != 0)
      return invalid(name + " copy is not requested, so its outputs must have 0 elements");
    return ffi::Error::Success();
  }
  copy->enabled = true;
  if (hadamard != 0 && hadamard != 16 && hadamard != 32)
    return invalid("hadamard_" + name + " must be 0, 16 or 32, got " + std::to_string(hadamard));
  copy->hadamard = hadamard;
  copy->values = layout_name == "values";
  if (!copy->values && !parse_layout(layout_name, &copy->layout))
    return invalid("layout_" + name + " must be plain, gemm_a, gemm_b or values, got " + std::string(layout_name));
  if (cols % mxfp4::kBlock != 0)
    return invalid("the " + name + " copy quantizes along an axis of length " + std::to_string(cols) +
                   ", which is not a multiple of 32");
  if (copy->layout == mxfp4::Layout::kGemmB && (rows % 16 != 0 || cols % 64 != 0))
    return invalid("layout gemm_b of the " + name + " copy needs rows % 16 == 0 and a quantization axis % 64 == 0");
  if (data.element_type() != (copy->values ? ffi::DataType::BF16 : ffi::DataType::U8))
    return invalid(name + " data must be " + (copy->values ? "bfloat16 (layout values)" : "uint8"));
  if (scales.element_type() != ffi::DataType::U8) return invalid(name + " scales must be uint8");
  const int64_t scale_cols = cols / mxfp4::kBlock;
  int64_t scale_rows_alloc = rows, scale_cols_alloc = scale_cols;
  if (copy->layout != mxfp4::Layout::kPlain) {
    scale_rows_alloc = mxfp4::padded_scale_rows(rows);
    scale_cols_alloc = mxfp4::padded_scale_cols(scale_cols);
  }
  if (!has_shape(data, rows, copy->values ? cols : cols / 2))
    return invalid(name + " data must have shape [rows, " + (copy->values ? "cols" : "cols/2") + "] of its view");
  if (!has_shape(scales, scale_rows_alloc, scale_cols_alloc))
    return invalid(name + " scales must have shape [" + std::to_string(scale_rows_alloc) + ", " +
                   std::to_string(scale_cols_alloc) + "]");
  copy->rows = rows;
  copy->cols = cols;
  copy->data = static_cast<uint8_t*>(data.untyped_data());
  copy->scales = scales.typed_data<uint8_t>();
  copy->scale_bytes = scale_rows_alloc * scale_cols_alloc;
  copy->padded = copy->scale_bytes != rows * scale_cols;
  return ffi::Error::Success();
}

}  // namespace cast_mxfp4_detail

inline ffi::ErrorOr<Mxfp4CastPlan> plan_cast_mxfp4(const ffi::AnyBuffer& x, const ffi::Buffer<ffi::U32>& sr_key,
                                                   const ffi::Buffer<ffi::U32>& hadamard_key,
                                                   const ffi::Buffer<ffi::U32>& index_offset,
                                                   ffi::AnyBuffer& row_data, ffi::AnyBuffer& row_scales,
                                                   ffi::AnyBuffer& col_data, ffi::AnyBuffer& col_scales,
                                                   const CastMxfp4Attrs& attrs) {
  using cast_mxfp4_detail::invalid;
  Mxfp4CastPlan plan;
  auto dims = x.dimensions();
  if (dims.size() != 2) return invalid("x must be 2-D");
  if (!is_float_activation(x.element_type()))
    return invalid(std::string("x must be bfloat16, float16 or float32, got ") + dtype_name(x.element_type()));
  plan.m = dims[0];
  plan.k = dims[1];
  if (plan.m > (int64_t{1} << 31) || plan.k > (int64_t{1} << 31))
    return invalid("x has more than 2^31 rows or columns");
  plan.dtype = x.element_type();
  plan.x = x.untyped_data();
  if (sr_key.element_count() != 2 || hadamard_key.element_count() != 2 || index_offset.element_count() != 2)
    return invalid("sr_key, hadamard_key and index_offset must be uint32[2]");
  plan.sr_key = sr_key.typed_data();
  plan.hadamard_key = hadamard_key.typed_data();
  plan.index_offset = index_offset.typed_data();
  if (attrs.scale_rule == "even") plan.rule = mxfp4::ScaleRule::kEven;
  else if (attrs.scale_rule == "floor") plan.rule = mxfp4::ScaleRule::kFloor;
  else if (attrs.scale_rule == "ceil") plan.rule = mxfp4::ScaleRule::kCeil;
  else return invalid("scale_rule must be even, floor or ceil, got " + std::string(attrs.scale_rule));
  plan.stochastic = attrs.stochastic;
  plan.hadamard_signs = attrs.hadamard_signs;
  if (!attrs.rowwise && !attrs.columnwise) return invalid("at least one of rowwise and columnwise must be requested");
  if (auto err = cast_mxfp4_detail::plan_copy("rowwise", attrs.rowwise, attrs.hadamard_rowwise, attrs.layout_rowwise,
                                              plan.m, plan.k, row_data, row_scales, &plan.row);
      err.failure())
    return err;
  if (auto err = cast_mxfp4_detail::plan_copy("columnwise", attrs.columnwise, attrs.hadamard_columnwise,
                                              attrs.layout_columnwise, plan.k, plan.m, col_data, col_scales,
                                              &plan.col);
      err.failure())
    return err;
  return plan;
}

// --- ja_dequantize_mxfp4 ------------------------------------------------------------------------------------

template <typename Binding>
auto bind_dequantize_mxfp4(Binding&& binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::string_view>("layout");
}

struct Mxfp4DequantizePlan {
  int64_t rows = 0;
  int64_t cols = 0;  // elements per row
  mxfp4::Layout layout = mxfp4::Layout::kPlain;
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
  uint16_t* out = nullptr;  // bf16 bits
};

inline ffi::ErrorOr<Mxfp4DequantizePlan> plan_dequantize_mxfp4(const ffi::AnyBuffer& data,
                                                               const ffi::AnyBuffer& scales, ffi::AnyBuffer& out,
                                                               std::string_view layout) {
  using cast_mxfp4_detail::has_shape;
  auto invalid = [](const std::string& message) {
    return ffi::Error::InvalidArgument("dequantize_mxfp4: " + message);
  };
  Mxfp4DequantizePlan plan;
  if (!cast_mxfp4_detail::parse_layout(layout, &plan.layout))
    return invalid("layout must be plain, gemm_a or gemm_b, got " + std::string(layout));
  if (data.element_type() != ffi::DataType::U8 || data.dimensions().size() != 2)
    return invalid("data must be a 2-D uint8 array");
  if (scales.element_type() != ffi::DataType::U8 || scales.dimensions().size() != 2)
    return invalid("scales must be a 2-D uint8 array");
  if (out.element_type() != ffi::DataType::BF16 || out.dimensions().size() != 2)
    return invalid("out must be a 2-D bfloat16 array");
  plan.rows = data.dimensions()[0];
  plan.cols = data.dimensions()[1] * 2;
  if (plan.rows > kMaxRowsOrCols || plan.cols > kMaxRowsOrCols)
    return invalid("data has more than 2^31 - 1 rows or elements per row");
  if (plan.cols % mxfp4::kBlock != 0)
    return invalid("data must have a multiple of 16 bytes per row (32-element blocks), got " +
                   std::to_string(plan.cols / 2));
  if (plan.layout == mxfp4::Layout::kGemmB && (plan.rows % 16 != 0 || plan.cols % 64 != 0))
    return invalid("data in layout gemm_b needs rows % 16 == 0 and a multiple of 32 bytes per row");
  const int64_t blocks = plan.cols / mxfp4::kBlock;
  int64_t scale_rows = plan.rows, scale_cols = blocks;
  if (plan.layout != mxfp4::Layout::kPlain) {
    scale_rows = mxfp4::padded_scale_rows(plan.rows);
    scale_cols = mxfp4::padded_scale_cols(blocks);
  }
  if (!has_shape(scales, scale_rows, scale_cols))
    return invalid("scales must have shape [" + std::to_string(scale_rows) + ", " + std::to_string(scale_cols) +
                   "] for data of shape [" + std::to_string(plan.rows) + ", " + std::to_string(plan.cols / 2) +
                   "] in layout " + std::string(layout));
  if (!has_shape(out, plan.rows, plan.cols))
    return invalid("out must have shape [" + std::to_string(plan.rows) + ", " + std::to_string(plan.cols) + "]");
  plan.data = data.typed_data<uint8_t>();
  plan.scales = scales.typed_data<uint8_t>();
  plan.out = static_cast<uint16_t*>(out.untyped_data());
  return plan;
}

}  // namespace jax_aiter
