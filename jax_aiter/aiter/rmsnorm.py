"""``rms_norm`` and ``rms_norm_with_add`` on ROCm through AITER's opus RMSNorm (csrc/aiter/rmsnorm.cc).

AITER provides the forward kernels only; the backward pass is the reference's, differentiated by JAX from the
saved inputs. Float32 accumulation as the op's contract says; the fused add's rounding order is AITER's, so
results agree with the reference to rounding, not bit for bit.
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
