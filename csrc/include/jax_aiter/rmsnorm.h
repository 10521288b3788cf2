// The FFI contract of the RMSNorm targets, shared by the CPU handlers (csrc/cpu/rmsnorm.cc) and the GPU ones
// (csrc/gpu/rmsnorm.cu): each target's operand binding, and the operand validation, so every platform accepts the
// same operands and rejects the same calls with the same messages (as ffi::Error, never an abort). The Python
// wrappers check first; these checks guard the FFI boundary against direct ffi_call use.
//
//   ja_rms_norm_fwd      x, gamma; epsilon               -> y, rms (f32, one per row)
//   ja_add_rms_norm_fwd  x, residual, gamma; epsilon     -> y, sum (= x + residual), rms
//   ja_rms_norm_bwd      dy, x, gamma, rms, d_sum         -> dx, dgamma, dgamma_partial (GPU workspace)
//
// rms = sqrt(mean(x^2) + epsilon) per row, exact for every finite x (rows whose float32 sum of squares
// overflows are summed scaled): a normal float32 from sqrt(epsilon) >= 2^-63 up to float32's largest value,
// where 1/rms would be subnormal above 2^126 (and XLA's CPU runtime flushes subnormals to zero).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "jax_aiter/ffi_util.h"

namespace jax_aiter {

// Bindings take the platform's context (none on the CPU, the stream on a GPU) already bound.
template <typename Binding>
auto bind_rms_norm_forward(Binding&& binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Attr<float>("epsilon")
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::F32>>();
}

template <typename Binding>
auto bind_add_rms_norm_forward(Binding&& binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Attr<float>("epsilon")
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::F32>>();
}

template <typename Binding>
auto bind_rms_norm_backward(Binding&& binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::F32>>();
}

inline ffi::ErrorOr<RowView> check_norm_input(const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma,
                                              const ffi::Buffer<ffi::F32>& rms) {
  auto rv = float_rows(x, "x");
  if (rv.has_error()) return rv;
  if (auto err = same_dtype(x, gamma, "x", "gamma"); err.failure()) return err;
  if (gamma.dimensions().size() != 1 || gamma.dimensions()[0] != rv.value().cols)
    return ffi::Error::InvalidArgument("gamma must be 1-D with x's last dimension");
  if (static_cast<int64_t>(rms.element_count()) != rv.value().rows)
    return ffi::Error::InvalidArgument("rms must hold one value per row of x");
  return rv;
}

// Forward; `residual` and `sum` are null for the plain norm and present for the fused add.
inline ffi::ErrorOr<RowView> check_rms_norm_forward(const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
                                                    const ffi::AnyBuffer& gamma, const ffi::AnyBuffer& y,
                                                    const ffi::AnyBuffer* sum,
                                                    const ffi::Buffer<ffi::F32>& rms) {
  auto rv = check_norm_input(x, gamma, rms);
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
                                                     const ffi::Buffer<ffi::F32>& rms,
                                                     const ffi::AnyBuffer& d_sum, const ffi::AnyBuffer& dx,
                                                     const ffi::AnyBuffer& dgamma,
                                                     const ffi::Buffer<ffi::F32>& dgamma_partial) {
  auto rv = check_norm_input(x, gamma, rms);
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

}  // namespace jax_aiter
