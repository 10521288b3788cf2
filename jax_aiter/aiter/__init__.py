"""The ``aiter`` implementations: jax-aiter's ops on ROCm over AMD's AITER kernels.

Compile-checked and lowered here, not run on hardware here (docs/aiter-bridge.md). One module per op family, each
a leaf that exports its implementations and their ``supports`` checks; the op modules declare them:

* ``jax_aiter.aiter.rmsnorm``  rms_norm, rms_norm_with_add  (AITER's RMSNorm, C ABI)
* ``jax_aiter.aiter.gemm``     gemm                         (ASM a16w16, gfx942 and gfx950)
* ``jax_aiter.aiter.gemm_fp4`` gemm_fp4                     (ASM a4w4, gfx950)
* ``jax_aiter.mha._aiter``     flash_attn, flash_attn_varlen (AITER's mha_fwd / mha_bwd C++ API; shipped with
  jax-aiter-mha)

Building the libraries and staging AITER's code objects: docs/building-rocm.md.
"""

# The FFI targets of the two libraries (csrc/aiter/targets.cc, csrc/aiter/mha_targets.cc).
GEMM_FP4 = "ja_aiter_gemm_fp4"
GEMM_BF16 = "ja_aiter_gemm_bf16"
RMS_NORM_FWD = "ja_aiter_rms_norm_fwd"
ADD_RMS_NORM_FWD = "ja_aiter_add_rms_norm_fwd"
MHA_FWD = "ja_aiter_mha_fwd"
MHA_BWD = "ja_aiter_mha_bwd"
MHA_VARLEN_FWD = "ja_aiter_mha_varlen_fwd"
MHA_VARLEN_BWD = "ja_aiter_mha_varlen_bwd"

# Library names as jax_aiter._native knows them.
LIBRARY = "aiter"
MHA_LIBRARY = "aiter_mha"
