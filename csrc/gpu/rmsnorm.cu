// RMSNorm FFI handlers for CUDA and HIP (kernels in rmsnorm.cuh). Same targets, operands and
// validation as the CPU handlers in csrc/cpu/rmsnorm.cc.

#include "gpu_ffi.h"
#include "jax_aiter/rmsnorm.h"
#include "rmsnorm.cuh"

namespace jax_aiter {
namespace {

template <typename E>
ffi::Error forward(gpu::Stream stream, const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
                   const ffi::AnyBuffer& gamma, float epsilon, ffi::AnyBuffer& y, ffi::AnyBuffer* sum,
                   ffi::Buffer<ffi::F32>& rms, RowView v) {
  using S = typename E::Storage;
  kernels::RmsNormForwardArgs<S> args{x.typed_data<S>(),
                                      residual != nullptr ? residual->typed_data<S>() : nullptr,
                                      gamma.typed_data<S>(),
                                      y.typed_data<S>(),
                                      sum != nullptr ? sum->typed_data<S>() : nullptr,
                                      rms.typed_data(),
                                      v.rows,
                                      v.cols,
                                      epsilon};
  return gpu_error(kernels::launch_rms_norm_forward<E>(args, stream), "rms_norm forward launch");
}

ffi::Error RmsNormForward(gpu::Stream stream, ffi::AnyBuffer x, ffi::AnyBuffer gamma, float epsilon,
                          ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::F32>> rms) {
  auto v = check_rms_norm_forward(x, nullptr, gamma, *y, nullptr, *rms);
  if (v.has_error()) return v.error();
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    return forward<decltype(e)>(stream, x, nullptr, gamma, epsilon, *y, nullptr, *rms, v.value());
  });
}

ffi::Error AddRmsNormForward(gpu::Stream stream, ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer gamma,
                             float epsilon, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> sum,
                             ffi::Result<ffi::Buffer<ffi::F32>> rms) {
  auto v = check_rms_norm_forward(x, &residual, gamma, *y, &(*sum), *rms);
  if (v.has_error()) return v.error();
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    return forward<decltype(e)>(stream, x, &residual, gamma, epsilon, *y, &(*sum), *rms, v.value());
  });
}

// dgamma_partial: the [max blocks, cols] float32 workspace XLA allocates for the per-block dgamma sums.
ffi::Error RmsNormBackward(gpu::Stream stream, int32_t device, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                           ffi::AnyBuffer gamma, ffi::Buffer<ffi::F32> rms, ffi::AnyBuffer d_sum,
                           ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dgamma,
                           ffi::Result<ffi::Buffer<ffi::F32>> dgamma_partial) {
  auto v = check_rms_norm_backward(dy, x, gamma, rms, d_sum, *dx, *dgamma, *dgamma_partial);
  if (v.has_error()) return v.error();
  return visit_float_element(x.element_type(), "x", [&](auto e) -> ffi::Error {
    using E = decltype(e);
    using S = typename E::Storage;
    kernels::RmsNormBackwardArgs<S> args{dy.typed_data<S>(),
                                         x.typed_data<S>(),
                                         gamma.typed_data<S>(),
                                         rms.typed_data(),
                                         d_sum.element_count() != 0 ? d_sum.typed_data<S>() : nullptr,
                                         dx->typed_data<S>(),
                                         dgamma_partial->typed_data(),
                                         v.value().rows,
                                         v.value().cols};
    kernels::RmsNormBackwardPlan plan;
    const auto max_blocks = static_cast<int>(dgamma_partial->dimensions()[0]);
    if (auto err = gpu_error(kernels::plan_rms_norm_backward<E>(args, device, max_blocks, &plan),
                             "rms_norm backward plan");
        err.failure())
      return err;
    return gpu_error(kernels::launch_rms_norm_backward<E>(args, plan, dgamma->typed_data<S>(), stream),
                     "rms_norm backward launch");
  });
}

}  // namespace
}  // namespace jax_aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormFwdGpu, jax_aiter::RmsNormForward,
                              jax_aiter::bind_rms_norm_forward(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<jax_aiter::gpu::Stream>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAddRmsNormFwdGpu, jax_aiter::AddRmsNormForward,
                              jax_aiter::bind_add_rms_norm_forward(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<jax_aiter::gpu::Stream>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaRmsNormBwdGpu, jax_aiter::RmsNormBackward,
                              jax_aiter::bind_rms_norm_backward(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<jax_aiter::gpu::Stream>>().Ctx<xla::ffi::DeviceOrdinal>()));
