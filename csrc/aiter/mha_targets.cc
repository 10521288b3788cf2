// FFI targets of libjax_aiter_aiter_mha.so (registered for XLA platform "ROCM" by jax_aiter/_native.py).

#include "jax_aiter/ffi_targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* JaAiterMhaFwd(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaAiterMhaBwd(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaAiterMhaVarlenFwd(XLA_FFI_CallFrame*);
XLA_FFI_Error* JaAiterMhaVarlenBwd(XLA_FFI_CallFrame*);
}

JA_DEFINE_FFI_TARGET_TABLE(JA_FFI_TARGET("ja_aiter_mha_fwd", JaAiterMhaFwd),
                           JA_FFI_TARGET("ja_aiter_mha_bwd", JaAiterMhaBwd),
                           JA_FFI_TARGET("ja_aiter_mha_varlen_fwd", JaAiterMhaVarlenFwd),
                           JA_FFI_TARGET("ja_aiter_mha_varlen_bwd", JaAiterMhaVarlenBwd))
