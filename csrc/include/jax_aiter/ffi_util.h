// Small helpers shared by the FFI handlers: element-type names and viewing a buffer as rows x cols.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "jax_aiter/element.h"
#include "xla/ffi/api/ffi.h"

namespace jax_aiter {

namespace ffi = xla::ffi;

inline const char* dtype_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::S32: return "int32";
    default: return "unsupported dtype";
  }
}

inline bool is_float_activation(ffi::DataType t) {
  return t == ffi::DataType::BF16 || t == ffi::DataType::F16 || t == ffi::DataType::F32;
}

// A buffer seen as [rows, cols] with cols = its last dimension (rank >= 1).
struct RowView {
  int64_t rows = 0;
  int64_t cols = 0;
};

inline ffi::ErrorOr<RowView> row_view(const ffi::AnyBuffer& buffer, const char* what) {
  auto dims = buffer.dimensions();
  if (dims.size() < 1) return ffi::Error::InvalidArgument(std::string(what) + " must have rank >= 1");
  RowView view;
  view.cols = dims.back();
  view.rows = view.cols == 0 ? 0 : static_cast<int64_t>(buffer.element_count()) / view.cols;
  return view;
}

inline ffi::Error same_dtype(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const char* a_name,
                             const char* b_name) {
  if (a.element_type() != b.element_type())
    return ffi::Error::InvalidArgument(std::string(a_name) + " and " + b_name + " must have the same dtype, got " +
                                       dtype_name(a.element_type()) + " and " + dtype_name(b.element_type()));
  return ffi::Error::Success();
}

// Calls fn(Bf16{}), fn(Fp16{}) or fn(Fp32{}) for the buffer's element type, so one generic lambda serves
// every float activation dtype; any other dtype is an InvalidArgument error naming `what`.
template <typename Fn>
ffi::Error visit_float_element(ffi::DataType type, const char* what, Fn&& fn) {
  switch (type) {
    case ffi::DataType::BF16: return fn(Bf16{});
    case ffi::DataType::F16: return fn(Fp16{});
    case ffi::DataType::F32: return fn(Fp32{});
    default:
      return ffi::Error::InvalidArgument(std::string(what) + " must be bfloat16, float16 or float32, got " +
                                         dtype_name(type));
  }
}

// Kernels index a row's columns and the grid's rows with 32-bit integers.
inline constexpr int64_t kMaxRowsOrCols = std::numeric_limits<int32_t>::max();

inline ffi::Error check_same_shape(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const char* a_name,
                                   const char* b_name) {
  if (auto err = same_dtype(a, b, a_name, b_name); err.failure()) return err;
  if (a.element_count() != b.element_count())
    return ffi::Error::InvalidArgument(std::string(a_name) + " must have the shape of " + b_name);
  return ffi::Error::Success();
}

inline ffi::ErrorOr<RowView> float_rows(const ffi::AnyBuffer& x, const char* what) {
  auto rv = row_view(x, what);
  if (rv.has_error()) return rv;
  if (!is_float_activation(x.element_type()))
    return ffi::Error::InvalidArgument(std::string(what) + " must be bfloat16, float16 or float32, got " +
                                       dtype_name(x.element_type()));
  if (rv.value().rows > kMaxRowsOrCols || rv.value().cols > kMaxRowsOrCols)
    return ffi::Error::InvalidArgument(std::string(what) + " has more than 2^31-1 rows or columns");
  return rv;
}

}  // namespace jax_aiter
