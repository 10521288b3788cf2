// SiLU-and-mul on the CPU: x = [gate | up] along the last axis, out = silu(gate) * up, float32 math.
// Backward: d_gate = dout * up * s * (1 + gate * (1 - s)), d_up = dout * gate * s, with s = sigmoid(gate).

#include <cmath>
#include <cstdint>

#include "jax_aiter/element.h"
#include "jax_aiter/activation.h"

namespace jax_aiter {
namespace {

inline float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

template <typename E>
void silu_and_mul_forward(const typename E::Storage* x, int64_t rows, int64_t half, typename E::Storage* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const typename E::Storage* gate = x + r * 2 * half;
    const typename E::Storage* up = gate + half;
    for (int64_t c = 0; c < half; ++c) {
      const float g = E::load(gate[c]);
      out[r * half + c] = E::store(g * sigmoid(g) * E::load(up[c]));
    }
  }
}

template <typename E>
void silu_and_mul_backward(const typename E::Storage* dout, const typename E::Storage* x, int64_t rows, int64_t half,
                           typename E::Storage* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const typename E::Storage* gate = x + r * 2 * half;
    const typename E::Storage* up = gate + half;
    for (int64_t c = 0; c < half; ++c) {
      const float g = E::load(gate[c]);
      const float u = E::load(up[c]);
      const float d = E::load(dout[r * half + c]);
      const float s = sigmoid(g);
      dx[r * 2 * half + c] = E::store(d * u * s * (1.f + g * (1.f - s)));
      dx[r * 2 * half + half + c] = E::store(d * g * s);
    }
  }
}

ffi::Error SiluAndMulForward(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  auto v = check_silu_and_mul(x, *out, "out");
  if (v.has_error()) return v.error();
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    silu_and_mul_forward<E>(x.typed_data<S>(), v.value().rows, v.value().cols / 2, out->typed_data<S>());
    return ffi::Error::Success();
  });
}

ffi::Error SiluAndMulBackward(ffi::AnyBuffer dout, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> dx) {
  auto v = check_silu_and_mul(x, dout, "dout");
  if (v.has_error()) return v.error();
  if (auto err = check_same_shape(*dx, x, "dx", "x"); err.failure()) return err;
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    silu_and_mul_backward<E>(dout.typed_data<S>(), x.typed_data<S>(), v.value().rows, v.value().cols / 2,
                             dx->typed_data<S>());
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jax_aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaSiluAndMulFwdCpu, jax_aiter::SiluAndMulForward,
                              jax_aiter::bind_silu_and_mul_forward(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaSiluAndMulBwdCpu, jax_aiter::SiluAndMulBackward,
                              jax_aiter::bind_silu_and_mul_backward(xla::ffi::Ffi::Bind()));
