// FFI targets of libjax_aiter_aiter.so (registered for XLA platform "ROCM" by jax_aiter/_native.py).

#include "jax_aiter/ffi_targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* JaAiterGemmFp4(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaAiterGemmBf16(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaAiterRmsNormFwd(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaAiterAddRmsNormFwd(XLA_FFI_CallFrame*);
}

JA_DEFINE_FFI_TARGET_TABLE(JA_FFI_TARGET("ja_aiter_gemm_fp4", JaAiterGemmFp4),
                           JA_FFI_TARGET("ja_aiter_gemm_bf16", JaAiterGemmBf16),
                           JA_FFI_TARGET("ja_aiter_rms_norm_fwd", JaAiterRmsNormFwd),
                           JA_FFI_TARGET("ja_aiter_add_rms_norm_fwd", JaAiterAddRmsNormFwd))
