// RMSNorm on the CPU: forward (optionally with the residual add fused in front) and backward.
// y = x / rms * gamma with rms = sqrt(mean(x^2) + eps); the forward also returns rms per row for the backward.
// With the add, s = round_to_dtype(x + residual) is written and normalized. The long reductions (a row's sum of
// squares, a row's dot product, dgamma over all rows) accumulate in double, so they stay accurate to float32
// rounding for rows and row counts in the millions. Double also holds every float32 square (up to 2^256) and
// 1/rms (down to 2^-128), so every finite input is exact here without the scaling the GPU kernels need.

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "jax_aiter/element.h"
#include "jax_aiter/rmsnorm.h"

namespace jax_aiter {
namespace {

template <typename E>
void rms_norm_forward(const typename E::Storage* x, const typename E::Storage* residual,
                      const typename E::Storage* gamma, float epsilon, int64_t rows, int64_t cols,
                      typename E::Storage* y, typename E::Storage* sum_out, float* rms_out) {
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    double sum_sq = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      float v = E::load(x[base + c]);
      if (residual != nullptr) {
        const typename E::Storage rounded = E::store(v + E::load(residual[base + c]));
        sum_out[base + c] = rounded;
        v = E::load(rounded);
      }
      row[c] = v;
      sum_sq += static_cast<double>(v) * v;
    }
    const double rms = std::sqrt(sum_sq / static_cast<double>(cols) + epsilon);
    // A row at float32's largest values may round past it; inf and NaN rows keep their rms.
    rms_out[r] = std::isfinite(rms) && rms > FLT_MAX ? FLT_MAX : static_cast<float>(rms);
    const double inv_rms = 1.0 / rms;
    for (int64_t c = 0; c < cols; ++c)
      y[base + c] = E::store(static_cast<float>(row[c] * inv_rms * E::load(gamma[c])));
  }
}

// With n = x / rms: dx = (g*dy - n * mean(g*dy*n)) / rms (+ d_sum when the add was fused); dgamma = sum_rows(dy * n).
// This form has no 1/rms^3, which leaves even double's range for rows far below sqrt(epsilon) with a tiny epsilon.
template <typename E>
void rms_norm_backward(const typename E::Storage* dy, const typename E::Storage* x, const typename E::Storage* gamma,
                       const float* rms, const typename E::Storage* d_sum, int64_t rows, int64_t cols,
                       typename E::Storage* dx, typename E::Storage* dgamma) {
  std::vector<double> dgamma_acc(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    const double inv_rms = 1.0 / static_cast<double>(rms[r]);
    double dot = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double normalized = E::load(x[base + c]) * inv_rms;
      const double dyv = E::load(dy[base + c]);
      dot += dyv * E::load(gamma[c]) * normalized;
      dgamma_acc[c] += dyv * normalized;
    }
    const double mean_dot = dot / static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const double normalized = E::load(x[base + c]) * inv_rms;
      const double weighted = static_cast<double>(E::load(dy[base + c])) * E::load(gamma[c]);
      float g = static_cast<float>((weighted - normalized * mean_dot) * inv_rms);
      if (d_sum != nullptr) g += E::load(d_sum[base + c]);
      dx[base + c] = E::store(g);
    }
  }
  for (int64_t c = 0; c < cols; ++c) dgamma[c] = E::store(static_cast<float>(dgamma_acc[c]));
}

ffi::Error RmsNormForward(ffi::AnyBuffer x, ffi::AnyBuffer gamma, float epsilon, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Result<ffi::Buffer<ffi::F32>> rms) {
  auto v = check_rms_norm_forward(x, nullptr, gamma, *y, nullptr, *rms);
  if (v.has_error()) return v.error();
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    rms_norm_forward<E>(x.typed_data<S>(), nullptr, gamma.typed_data<S>(), epsilon, v.value().rows, v.value().cols,
                        y->typed_data<S>(), nullptr, rms->typed_data());
    return ffi::Error::Success();
  });
}

ffi::Error AddRmsNormForward(ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer gamma, float epsilon,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> sum,
                             ffi::Result<ffi::Buffer<ffi::F32>> rms) {
  auto v = check_rms_norm_forward(x, &residual, gamma, *y, &(*sum), *rms);
  if (v.has_error()) return v.error();
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    rms_norm_forward<E>(x.typed_data<S>(), residual.typed_data<S>(), gamma.typed_data<S>(), epsilon, v.value().rows,
                        v.value().cols, y->typed_data<S>(), sum->typed_data<S>(), rms->typed_data());
    return ffi::Error::Success();
  });
}

// d_sum is the cotangent of the fused add's sum output; it has x's shape when present, else 0 elements.
// dgamma_partial is the GPU kernel's workspace; the CPU sums dgamma in one pass and leaves it alone.
ffi::Error RmsNormBackward(ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer gamma, ffi::Buffer<ffi::F32> rms,
                           ffi::AnyBuffer d_sum, ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dgamma,
                           ffi::Result<ffi::Buffer<ffi::F32>> dgamma_partial) {
  auto v = check_rms_norm_backward(dy, x, gamma, rms, d_sum, *dx, *dgamma, *dgamma_partial);
  if (v.has_error()) return v.error();
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    rms_norm_backward<E>(dy.typed_data<S>(), x.typed_data<S>(), gamma.typed_data<S>(), rms.typed_data(),
                         d_sum.element_count() != 0 ? d_sum.typed_data<S>() : nullptr, v.value().rows,
                         v.value().cols, dx->typed_data<S>(), dgamma->typed_data<S>());
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jax_aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormFwdCpu, jax_aiter::RmsNormForward,
                              jax_aiter::bind_rms_norm_forward(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAddRmsNormFwdCpu, jax_aiter::AddRmsNormForward,
                              jax_aiter::bind_add_rms_norm_forward(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormBwdCpu, jax_aiter::RmsNormBackward,
                              jax_aiter::bind_rms_norm_backward(xla::ffi::Ffi::Bind()));
