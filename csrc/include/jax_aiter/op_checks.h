// Operand validation shared by the CPU and GPU handlers of the norm and activation ops, so every platform
// rejects the same calls with the same messages (as ffi::Error, never an abort). The Python wrappers check
// first; these checks guard the FFI boundary against direct ffi_call use.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "jax_aiter/ffi_util.h"

namespace jax_aiter {

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

inline ffi::ErrorOr<RowView> check_norm_input(const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma,
                                              const ffi::Buffer<ffi::F32>& inv_rms) {
  auto rv = float_rows(x, "x");
  if (rv.has_error()) return rv;
  if (auto err = same_dtype(x, gamma, "x", "gamma"); err.failure()) return err;
  if (gamma.dimensions().size() != 1 || gamma.dimensions()[0] != rv.value().cols)
    return ffi::Error::InvalidArgument("gamma must be 1-D with x's last dimension");
  if (static_cast<int64_t>(inv_rms.element_count()) != rv.value().rows)
    return ffi::Error::InvalidArgument("inv_rms must hold one value per row of x");
  return rv;
}

// Forward; `residual` and `sum` are null for the plain norm and present for the fused add.
inline ffi::ErrorOr<RowView> check_rms_norm_forward(const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
                                                    const ffi::AnyBuffer& gamma, const ffi::AnyBuffer& y,
                                                    const ffi::AnyBuffer* sum,
                                                    const ffi::Buffer<ffi::F32>& inv_rms) {
  auto rv = check_norm_input(x, gamma, inv_rms);
  if (rv.has_error()) return rv;
  if (auto err = check_same_shape(y, x, "y", "x"); err.failure()) return err;
  if (residual != nullptr) {
    if (auto err = check_same_shape(*residual, x, "residual", "x"); err.failure()) return err;
    if (auto err = check_same_shape(*sum, x, "sum", "x"); err.failure()) return err;
  }
  return rv;
}

// Backward; d_sum (the fused add's sum cotangent) has x's shape, or 0 elements for the plain norm;
// dgamma_partial is the GPU kernel's [blocks, cols] workspace, blocks in [1, rows] (0 only without rows).
inline ffi::ErrorOr<RowView> check_rms_norm_backward(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& x,
                                                     const ffi::AnyBuffer& gamma,
                                                     const ffi::Buffer<ffi::F32>& inv_rms,
                                                     const ffi::AnyBuffer& d_sum, const ffi::AnyBuffer& dx,
                                                     const ffi::AnyBuffer& dgamma,
                                                     const ffi::Buffer<ffi::F32>& dgamma_partial) {
  auto rv = check_norm_input(x, gamma, inv_rms);
  if (rv.has_error()) return rv;
  if (auto err = check_same_shape(dy, x, "dy", "x"); err.failure()) return err;
  if (d_sum.element_count() != 0)
    if (auto err = check_same_shape(d_sum, x, "d_sum", "x"); err.failure()) return err;
  if (auto err = check_same_shape(dx, x, "dx", "x"); err.failure()) return err;
  if (auto err = check_same_shape(dgamma, gamma, "dgamma", "gamma"); err.failure()) return err;
  auto partial = dgamma_partial.dimensions();
  const int64_t rows = rv.value().rows;
  if (partial.size() != 2 || partial[1] != rv.value().cols || partial[0] > rows || (partial[0] == 0 && rows != 0))
    return ffi::Error::InvalidArgument("dgamma_partial must be [blocks, cols] float32 with 1 <= blocks <= rows");
  return rv;
}

// x = [gate | up]: rows of 2 * half elements. `half_sized` is the forward output or the backward's dout.
inline ffi::ErrorOr<RowView> check_silu_and_mul(const ffi::AnyBuffer& x, const ffi::AnyBuffer& half_sized,
                                                const char* half_name) {
  auto rv = float_rows(x, "x");
  if (rv.has_error()) return rv;
  if (rv.value().cols % 2 != 0) return ffi::Error::InvalidArgument("x's last dimension must be even ([gate | up])");
  if (auto err = same_dtype(half_sized, x, half_name, "x"); err.failure()) return err;
  if (half_sized.element_count() * 2 != x.element_count())
    return ffi::Error::InvalidArgument(std::string(half_name) + " must have half of x's last dimension");
  return rv;
}

}  // namespace jax_aiter
