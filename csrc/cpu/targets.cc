// FFI targets of libjax_aiter_cpu.so.

#include "jax_aiter/ffi_targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* JaRmsNormFwdCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaAddRmsNormFwdCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaRmsNormBwdCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaSiluAndMulFwdCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaSiluAndMulBwdCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaCastMxfp4Cpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaDequantizeMxfp4Cpu(XLA_FFI_CallFrame*);
}

JA_DEFINE_FFI_TARGET_TABLE(JA_FFI_TARGET("ja_rms_norm_fwd", JaRmsNormFwdCpu),
                           JA_FFI_TARGET("ja_add_rms_norm_fwd", JaAddRmsNormFwdCpu),
                           JA_FFI_TARGET("ja_rms_norm_bwd", JaRmsNormBwdCpu),
                           JA_FFI_TARGET("ja_silu_and_mul_fwd", JaSiluAndMulFwdCpu),
                           JA_FFI_TARGET("ja_silu_and_mul_bwd", JaSiluAndMulBwdCpu),
                           JA_FFI_TARGET("ja_cast_mxfp4", JaCastMxfp4Cpu),
                           JA_FFI_TARGET("ja_dequantize_mxfp4", JaDequantizeMxfp4Cpu))
