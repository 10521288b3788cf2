// MXFP4 FFI handlers for CUDA and HIP, the cast and the dequantization into bf16 (kernels in mxfp4.cuh). Same
// targets, operands and validation as the CPU handlers (csrc/cpu/mxfp4.cc); the contracts are in
// jax_aiter/mxfp4.h.

#include <limits>

#include "gpu_ffi.h"
#include "jax_aiter/mxfp4.h"
#include "mxfp4.cuh"

namespace jax_aiter {
namespace {

kernels::Mxfp4CopyArgs copy_args(const Mxfp4CopyPlan& copy) {
  return {copy.enabled ? copy.data : nullptr, copy.scales, copy.hadamard, copy.layout, copy.values};
}

ffi::Error CastMxfp4(gpu::Stream stream, ffi::AnyBuffer x, ffi::Buffer<ffi::U32> sr_key,
                     ffi::Buffer<ffi::U32> hadamard_key, ffi::Buffer<ffi::U32> index_offset,
                     ffi::Result<ffi::AnyBuffer> row_data, ffi::Result<ffi::AnyBuffer> row_scales,
                     ffi::Result<ffi::AnyBuffer> col_data, ffi::Result<ffi::AnyBuffer> col_scales,
                     CastMxfp4Attrs attrs) {
  auto planned =
      plan_cast_mxfp4(x, sr_key, hadamard_key, index_offset, *row_data, *row_scales, *col_data, *col_scales, attrs);
  if (planned.has_error()) return planned.error();
  const Mxfp4CastPlan& plan = planned.value();
  if (plan.row.enabled && !gpu::aligned16(plan.x))
    return ffi::Error::InvalidArgument("cast_mxfp4: the rowwise copy needs x aligned to 16 bytes");
  for (const Mxfp4CopyPlan* copy : {&plan.row, &plan.col}) {
    if (copy->enabled && copy->values && !gpu::aligned16(copy->data))
      return ffi::Error::InvalidArgument("cast_mxfp4: a copy in layout values needs its data aligned to 16 bytes");
  }
  return visit_float_element(plan.dtype, "x", [&](auto e) -> ffi::Error {
    using E = decltype(e);
    using S = typename E::Storage;
    const kernels::CastMxfp4Args<S> args{static_cast<const S*>(plan.x),
                                         plan.m,
                                         plan.k,
                                         plan.sr_key,
                                         plan.hadamard_key,
                                         plan.index_offset,
                                         plan.rule,
                                         plan.stochastic,
                                         plan.hadamard_signs,
                                         copy_args(plan.row),
                                         copy_args(plan.col)};
    if (kernels::cast_mxfp4_tiles(args) > std::numeric_limits<int32_t>::max())
      return ffi::Error::InvalidArgument("cast_mxfp4: x is too large for one launch");
    return gpu_error(kernels::launch_cast_mxfp4<E>(args, stream), "cast_mxfp4 launch");
  });
}

ffi::Error DequantizeMxfp4(gpu::Stream stream, ffi::AnyBuffer data, ffi::AnyBuffer scales,
                           ffi::Result<ffi::AnyBuffer> out, std::string_view layout) {
  auto planned = plan_dequantize_mxfp4(data, scales, *out, layout);
  if (planned.has_error()) return planned.error();
  const Mxfp4DequantizePlan& plan = planned.value();
  if (!gpu::aligned16(plan.data) || !gpu::aligned16(plan.out))
    return ffi::Error::InvalidArgument("dequantize_mxfp4: data and out must be aligned to 16 bytes");
  if (kernels::dequantize_mxfp4_tiles(plan.rows, plan.cols) > std::numeric_limits<int32_t>::max())
    return ffi::Error::InvalidArgument("dequantize_mxfp4: data is too large for one launch");
  const kernels::DequantizeMxfp4Args args{plan.data, plan.scales, plan.out, plan.rows, plan.cols};
  return gpu_error(kernels::launch_dequantize_mxfp4(args, plan.layout, stream), "dequantize_mxfp4 launch");
}

}  // namespace
}  // namespace jax_aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaCastMxfp4Gpu, jax_aiter::CastMxfp4,
                              jax_aiter::bind_cast_mxfp4(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<jax_aiter::gpu::Stream>>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaDequantizeMxfp4Gpu, jax_aiter::DequantizeMxfp4,
                              jax_aiter::bind_dequantize_mxfp4(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<jax_aiter::gpu::Stream>>()));
