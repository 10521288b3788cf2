// SiLU-and-mul on the CPU: x = [gate | up] along the last axis, out = silu(gate) * up, float32 math.
// Backward: d_gate = dout * up * s * (1 + gate * (1 - s)), d_up = dout * gate * s, with s = sigmoid(gate).

#include <cmath>
#include <cstdint>

#include "jax_aiter/element.h"
#include "jax_aiter/ffi_util.h"

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

ffi::Error check_input(const ffi::AnyBuffer& x, RowView* view) {
  auto rv = row_view(x, "x");
  if (rv.has_error()) return rv.error();
  *view = rv.value();
  if (!is_float_activation(x.element_type()))
    return ffi::Error::InvalidArgument(std::string("x must be bfloat16, float16 or float32, got ") +
                                       dtype_name(x.element_type()));
  if (view->cols % 2 != 0) return ffi::Error::InvalidArgument("x's last dimension must be even ([gate | up])");
  return ffi::Error::Success();
}

ffi::Error SiluAndMulForward(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  RowView v;
  if (auto err = check_input(x, &v); err.failure()) return err;
  if (out->element_count() * 2 != x.element_count()) return ffi::Error::InvalidArgument("out must be half of x");
  switch (x.element_type()) {
#define JA_CASE(DT, E)                                                                                     \
  case ffi::DataType::DT:                                                                                  \
    silu_and_mul_forward<E>(x.typed_data<E::Storage>(), v.rows, v.cols / 2, out->typed_data<E::Storage>()); \
    break;
    JA_CASE(BF16, Bf16) JA_CASE(F16, Fp16) JA_CASE(F32, Fp32)
#undef JA_CASE
    default: break;
  }
  return ffi::Error::Success();
}

ffi::Error SiluAndMulBackward(ffi::AnyBuffer dout, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> dx) {
  RowView v;
  if (auto err = check_input(x, &v); err.failure()) return err;
  if (auto err = same_dtype(x, dout, "x", "dout"); err.failure()) return err;
  if (dout.element_count() * 2 != x.element_count()) return ffi::Error::InvalidArgument("dout must be half of x");
  switch (x.element_type()) {
#define JA_CASE(DT, E)                                                                                      \
  case ffi::DataType::DT:                                                                                   \
    silu_and_mul_backward<E>(dout.typed_data<E::Storage>(), x.typed_data<E::Storage>(), v.rows, v.cols / 2, \
                             dx->typed_data<E::Storage>());                                                 \
    break;
    JA_CASE(BF16, Bf16) JA_CASE(F16, Fp16) JA_CASE(F32, Fp32)
#undef JA_CASE
    default: break;
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaSiluAndMulFwdCpu, jax_aiter::SiluAndMulForward,
                              xla::ffi::Ffi::Bind().Arg<xla::ffi::AnyBuffer>().Ret<xla::ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaSiluAndMulBwdCpu, jax_aiter::SiluAndMulBackward,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());
