// SiLU-and-mul FFI handlers for CUDA and HIP (kernels in activation.cuh). Same targets,
// operands and validation as the CPU handlers in csrc/cpu/activation.cc.

#include <limits>

#include "activation.cuh"
#include "gpu_ffi.h"
#include "jax_aiter/activation.h"

namespace jax_aiter {
namespace {

template <typename E, bool kBackward>
ffi::Error launch(const kernels::SiluAndMulArgs<typename E::Storage>& args, gpu::Stream stream) {
  using S = typename E::Storage;
  const bool wide = kernels::silu_and_mul_wide(args);
  if (kernels::silu_and_mul_blocks<S>(args.rows, args.half, wide) > std::numeric_limits<int32_t>::max())
    return ffi::Error::InvalidArgument("silu_and_mul: x is too large for one launch");
  return gpu_error(kernels::launch_silu_and_mul<E, kBackward>(args, wide, stream), "silu_and_mul launch");
}

ffi::Error SiluAndMulForward(gpu::Stream stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  auto v = check_silu_and_mul(x, *out, "out");
  if (v.has_error()) return v.error();
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    kernels::SiluAndMulArgs<S> args{x.typed_data<S>(), nullptr, out->typed_data<S>(), v.value().rows,
                                    v.value().cols / 2};
    return launch<E, false>(args, stream);
  });
}

ffi::Error SiluAndMulBackward(gpu::Stream stream, ffi::AnyBuffer dout, ffi::AnyBuffer x,
                              ffi::Result<ffi::AnyBuffer> dx) {
  auto v = check_silu_and_mul(x, dout, "dout");
  if (v.has_error()) return v.error();
  if (auto err = check_same_shape(*dx, x, "dx", "x"); err.failure()) return err;
  return visit_float_element(x.element_type(), "x", [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    kernels::SiluAndMulArgs<S> args{x.typed_data<S>(), dout.typed_data<S>(), dx->typed_data<S>(), v.value().rows,
                                    v.value().cols / 2};
    return launch<E, true>(args, stream);
  });
}

}  // namespace
}  // namespace jax_aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaSiluAndMulFwdGpu, jax_aiter::SiluAndMulForward,
                              jax_aiter::bind_silu_and_mul_forward(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<jax_aiter::gpu::Stream>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaSiluAndMulBwdGpu, jax_aiter::SiluAndMulBackward,
                              jax_aiter::bind_silu_and_mul_backward(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<jax_aiter::gpu::Stream>>()));
