// RMSNorm on the CPU: forward (optionally with the residual add fused in front) and backward.
// y = x * rsqrt(mean(x^2) + eps) * gamma, float32 math; the forward also returns rsqrt(...) per row for the
// backward. With the add, s = round_to_dtype(x + residual) is written and normalized.

#include <cmath>
#include <cstdint>
#include <vector>

#include "jax_aiter/element.h"
#include "jax_aiter/ffi_util.h"

namespace jax_aiter {
namespace {

template <typename E>
void rms_norm_forward(const typename E::Storage* x, const typename E::Storage* residual,
                      const typename E::Storage* gamma, float epsilon, int64_t rows, int64_t cols,
                      typename E::Storage* y, typename E::Storage* sum_out, float* inv_rms) {
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    float sum_sq = 0.f;
    for (int64_t c = 0; c < cols; ++c) {
      float v = E::load(x[base + c]);
      if (residual != nullptr) {
        const typename E::Storage rounded = E::store(v + E::load(residual[base + c]));
        sum_out[base + c] = rounded;
        v = E::load(rounded);
      }
      row[c] = v;
      sum_sq += v * v;
    }
    const float scale = 1.f / std::sqrt(sum_sq / static_cast<float>(cols) + epsilon);
    inv_rms[r] = scale;
    for (int64_t c = 0; c < cols; ++c) y[base + c] = E::store(row[c] * scale * E::load(gamma[c]));
  }
}

// dx = r * (g*dy) - x * r^3 * mean(g*dy*x) (+ d_sum when the add was fused); dgamma = sum_rows(dy * x * r).
template <typename E>
void rms_norm_backward(const typename E::Storage* dy, const typename E::Storage* x, const typename E::Storage* gamma,
                       const float* inv_rms, const typename E::Storage* d_sum, int64_t rows, int64_t cols,
                       typename E::Storage* dx, typename E::Storage* dgamma) {
  std::vector<float> dgamma_acc(cols, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    const float scale = inv_rms[r];
    float dot = 0.f;
    for (int64_t c = 0; c < cols; ++c) {
      const float xv = E::load(x[base + c]);
      const float dyv = E::load(dy[base + c]);
      dot += dyv * E::load(gamma[c]) * xv;
      dgamma_acc[c] += dyv * xv * scale;
    }
    const float correction = dot / static_cast<float>(cols) * scale * scale * scale;
    for (int64_t c = 0; c < cols; ++c) {
      float g = scale * E::load(dy[base + c]) * E::load(gamma[c]) - E::load(x[base + c]) * correction;
      if (d_sum != nullptr) g += E::load(d_sum[base + c]);
      dx[base + c] = E::store(g);
    }
  }
  for (int64_t c = 0; c < cols; ++c) dgamma[c] = E::store(dgamma_acc[c]);
}

template <typename E>
using Ptr = typename E::Storage*;

ffi::Error check_norm_operands(const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma, RowView* view) {
  auto rv = row_view(x, "x");
  if (rv.has_error()) return rv.error();
  *view = rv.value();
  if (!is_float_activation(x.element_type()))
    return ffi::Error::InvalidArgument(std::string("x must be bfloat16, float16 or float32, got ") +
                                       dtype_name(x.element_type()));
  if (auto err = same_dtype(x, gamma, "x", "gamma"); err.failure()) return err;
  if (gamma.dimensions().size() != 1 || gamma.dimensions()[0] != view->cols)
    return ffi::Error::InvalidArgument("gamma must be 1-D with x's last dimension");
  return ffi::Error::Success();
}

ffi::Error RmsNormForward(ffi::AnyBuffer x, ffi::AnyBuffer gamma, float epsilon, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Result<ffi::Buffer<ffi::F32>> inv_rms) {
  RowView v;
  if (auto err = check_norm_operands(x, gamma, &v); err.failure()) return err;
  if (static_cast<int64_t>(inv_rms->element_count()) != v.rows)
    return ffi::Error::InvalidArgument("inv_rms must hold one value per row");
  switch (x.element_type()) {
#define JA_CASE(DT, E)                                                                                      \
  case ffi::DataType::DT:                                                                                   \
    rms_norm_forward<E>(x.typed_data<E::Storage>(), nullptr, gamma.typed_data<E::Storage>(), epsilon, v.rows, \
                        v.cols, y->typed_data<E::Storage>(), nullptr, inv_rms->typed_data());               \
    break;
    JA_CASE(BF16, Bf16) JA_CASE(F16, Fp16) JA_CASE(F32, Fp32)
#undef JA_CASE
    default: break;
  }
  return ffi::Error::Success();
}

ffi::Error AddRmsNormForward(ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer gamma, float epsilon,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> sum,
                             ffi::Result<ffi::Buffer<ffi::F32>> inv_rms) {
  RowView v;
  if (auto err = check_norm_operands(x, gamma, &v); err.failure()) return err;
  if (auto err = same_dtype(x, residual, "x", "residual"); err.failure()) return err;
  if (residual.element_count() != x.element_count())
    return ffi::Error::InvalidArgument("residual must have x's shape");
  if (static_cast<int64_t>(inv_rms->element_count()) != v.rows)
    return ffi::Error::InvalidArgument("inv_rms must hold one value per row");
  switch (x.element_type()) {
#define JA_CASE(DT, E)                                                                                  \
  case ffi::DataType::DT:                                                                               \
    rms_norm_forward<E>(x.typed_data<E::Storage>(), residual.typed_data<E::Storage>(),                  \
                        gamma.typed_data<E::Storage>(), epsilon, v.rows, v.cols, y->typed_data<E::Storage>(), \
                        sum->typed_data<E::Storage>(), inv_rms->typed_data());                          \
    break;
    JA_CASE(BF16, Bf16) JA_CASE(F16, Fp16) JA_CASE(F32, Fp32)
#undef JA_CASE
    default: break;
  }
  return ffi::Error::Success();
}

// d_sum is the cotangent of the fused add's sum output; it has x's shape when present, else 0 elements.
ffi::Error RmsNormBackward(ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer gamma, ffi::Buffer<ffi::F32> inv_rms,
                           ffi::AnyBuffer d_sum, ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dgamma) {
  RowView v;
  if (auto err = check_norm_operands(x, gamma, &v); err.failure()) return err;
  if (auto err = same_dtype(x, dy, "x", "dy"); err.failure()) return err;
  if (dy.element_count() != x.element_count()) return ffi::Error::InvalidArgument("dy must have x's shape");
  if (static_cast<int64_t>(inv_rms.element_count()) != v.rows)
    return ffi::Error::InvalidArgument("inv_rms must hold one value per row");
  const bool has_d_sum = d_sum.element_count() != 0;
  if (has_d_sum) {
    if (auto err = same_dtype(x, d_sum, "x", "d_sum"); err.failure()) return err;
    if (d_sum.element_count() != x.element_count())
      return ffi::Error::InvalidArgument("d_sum must have x's shape or be empty");
  }
  switch (x.element_type()) {
#define JA_CASE(DT, E)                                                                                         \
  case ffi::DataType::DT:                                                                                      \
    rms_norm_backward<E>(dy.typed_data<E::Storage>(), x.typed_data<E::Storage>(), gamma.typed_data<E::Storage>(), \
                         inv_rms.typed_data(), has_d_sum ? d_sum.typed_data<E::Storage>() : nullptr, v.rows,   \
                         v.cols, dx->typed_data<E::Storage>(), dgamma->typed_data<E::Storage>());              \
    break;
    JA_CASE(BF16, Bf16) JA_CASE(F16, Fp16) JA_CASE(F32, Fp32)
#undef JA_CASE
    default: break;
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormFwdCpu, jax_aiter::RmsNormForward,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Attr<float>("epsilon")
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAddRmsNormFwdCpu, jax_aiter::AddRmsNormForward,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Attr<float>("epsilon")
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormBwdCpu, jax_aiter::RmsNormBackward,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());
