"""``rms_norm`` and ``rms_norm_with_add`` on ROCm through AITER's opus RMSNorm (csrc/aiter/rmsnorm.cc).

AITER provides the forward kernels only; the backward pass is the reference's derivative, taken at the
saved inputs. Float32 accumulation as the op's contract says; the fused add's rounding order is AITER's, so
results agree with the reference to rounding, not bit for bit. AITER does not scale a row whose sum of squares
overflows float32, so default selection takes it for float16 only (:func:`forced_only`).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jax_aiter._autodiff import kernel_forward_reference_backward
from jax_aiter.aiter import ADD_RMS_NORM_FWD, RMS_NORM_FWD, _support
from jax_aiter.ref import rmsnorm as ref


def _norm_call(x, gamma, *, epsilon):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call(RMS_NORM_FWD, out, vmap_method="sequential")(x, gamma, epsilon=np.float32(epsilon))


def _add_norm_call(x, residual, gamma, *, epsilon):
    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype))
    return jax.ffi.ffi_call(ADD_RMS_NORM_FWD, out, vmap_method="sequential")(
        x, residual, gamma, epsilon=np.float32(epsilon))


rms_norm = kernel_forward_reference_backward(_norm_call, ref.rms_norm)
rms_norm_with_add = kernel_forward_reference_backward(_add_norm_call, ref.rms_norm_with_add)


def supports(x, *rest, epsilon) -> str | None:
    gamma = rest[-1]
    if np.dtype(gamma.dtype) != np.dtype(x.dtype):
        return f"AITER's RMSNorm needs gamma in x's dtype {np.dtype(x.dtype)}, got {np.dtype(gamma.dtype)}"
    if x.shape[-1] >= 2**31 or math.prod(x.shape[:-1]) >= 2**31:
        return f"x of shape {tuple(x.shape)} exceeds the kernels' 32-bit row and column counts"
    return _support.arch_problem()


def forced_only(x, *rest, epsilon) -> str | None:
    """Why a call is left to the exact implementations unless aiter is forced. AITER's kernels sum a row's squares
    in float32 as they are, so a row whose sum overflows (elements around 2^64 / sqrt(H) and beyond, which
    bfloat16 and float32 hold) comes out as zeros, where the op's contract is exact for every finite input.
    float16 cannot get there: 65504^2 * 2^31 < 2^128."""
    if np.dtype(x.dtype) == np.float16:
        return None
    return (f"AITER's RMSNorm sums squares in float32 unscaled, so {np.dtype(x.dtype)} rows whose sum of squares "
            "overflows would come out as zeros; it runs only when forced (jax_aiter.use_backend)")
