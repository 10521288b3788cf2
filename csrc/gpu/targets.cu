// FFI targets of the GPU library, libjax_aiter_cuda.so or libjax_aiter_hip.so (one source, two builds). The
// names match the CPU library's, so the Python ffi_call is the same on every platform.

#include "jax_aiter/ffi_targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* JaRmsNormFwdGpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaAddRmsNormFwdGpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaRmsNormBwdGpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaSiluAndMulFwdGpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaSiluAndMulBwdGpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaCastMxfp4Gpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaDequantizeMxfp4Gpu(XLA_FFI_CallFrame*);
}

JA_DEFINE_FFI_TARGET_TABLE(JA_FFI_TARGET("ja_rms_norm_fwd", JaRmsNormFwdGpu),
                           JA_FFI_TARGET("ja_add_rms_norm_fwd", JaAddRmsNormFwdGpu),
                           JA_FFI_TARGET("ja_rms_norm_bwd", JaRmsNormBwdGpu),
                           JA_FFI_TARGET("ja_silu_and_mul_fwd", JaSiluAndMulFwdGpu),
                           JA_FFI_TARGET("ja_silu_and_mul_bwd", JaSiluAndMulBwdGpu),
                           JA_FFI_TARGET("ja_cast_mxfp4", JaCastMxfp4Gpu),
                           JA_FFI_TARGET("ja_dequantize_mxfp4", JaDequantizeMxfp4Gpu))
