// The FFI contract of the SiLU-and-mul targets, shared by the CPU handlers (csrc/cpu/activation.cc) and the GPU
// ones (csrc/gpu/activation.cu): operand bindings and validation.
//
//   ja_silu_and_mul_fwd  x = [gate | up]  -> out = silu(gate) * up
//   ja_silu_and_mul_bwd  dout, x          -> dx = [dgate | dup]
#pragma once

#include <string>
#include <utility>

#include "jax_aiter/ffi_util.h"

namespace jax_aiter {

// Bindings take the platform's context (none on the CPU, the stream on a GPU) already bound.
template <typename Binding>
auto bind_silu_and_mul_forward(Binding&& binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>();
}

template <typename Binding>
auto bind_silu_and_mul_backward(Binding&& binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>();
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
