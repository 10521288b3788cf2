"""``rms_norm`` and ``rms_norm_with_add`` on ROCm through AITER's opus RMSNorm (csrc/aiter/rmsnorm.cc);
imported by jax_aiter.rmsnorm.

AITER provides the forward kernels only; the backward pass is the reference's, differentiated by JAX from the
saved inputs. Float32 accumulation as the contract says; the fused add's rounding order is AITER's, so results
agree with the reference to rounding, not bit for bit.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

import jax_aiter.rmsnorm  # noqa: F401  (defines the ops; either module may be imported first)
from jax_aiter import _backend
from jax_aiter.aiter import ADD_RMS_NORM_FWD, LIBRARY, RMS_NORM_FWD, _support
from jax_aiter.ref import norm as ref


def _norm_call(x, gamma, epsilon):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call(RMS_NORM_FWD, out, vmap_method="sequential")(x, gamma, epsilon=np.float32(epsilon))


def _add_norm_call(x, residual, gamma, epsilon):
    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype))
    return jax.ffi.ffi_call(ADD_RMS_NORM_FWD, out, vmap_method="sequential")(
        x, residual, gamma, epsilon=np.float32(epsilon))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_norm(x, gamma, epsilon):
    return _norm_call(x, gamma, epsilon)


def _rms_norm_fwd(x, gamma, epsilon):
    return _norm_call(x, gamma, epsilon), (x, gamma)


def _rms_norm_bwd(epsilon, residuals, dy):
    x, gamma = residuals
    return jax.vjp(functools.partial(ref.rms_norm, epsilon=epsilon), x, gamma)[1](dy)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _rms_norm_with_add(x, residual, gamma, epsilon):
    return _add_norm_call(x, residual, gamma, epsilon)


def _rms_norm_with_add_fwd(x, residual, gamma, epsilon):
    return _add_norm_call(x, residual, gamma, epsilon), (x, residual, gamma)


def _rms_norm_with_add_bwd(epsilon, residuals, cotangents):
    x, residual, gamma = residuals
    return jax.vjp(functools.partial(ref.rms_norm_with_add, epsilon=epsilon), x, residual, gamma)[1](cotangents)


_rms_norm_with_add.defvjp(_rms_norm_with_add_fwd, _rms_norm_with_add_bwd)


def aiter_rms_norm(x, gamma, epsilon):
    return _rms_norm(x, gamma, epsilon)


def aiter_rms_norm_with_add(x, residual, gamma, epsilon):
    return _rms_norm_with_add(x, residual, gamma, epsilon)


def supports(x, *rest, epsilon) -> str | None:
    gamma = rest[-1]
    if np.dtype(gamma.dtype) != np.dtype(x.dtype):
        return f"AITER's RMSNorm needs gamma in x's dtype {np.dtype(x.dtype)}, got {np.dtype(gamma.dtype)}"
    if x.shape[-1] >= 2**31 or math.prod(x.shape[:-1]) >= 2**31:
        return f"x of shape {tuple(x.shape)} exceeds the kernels' 32-bit row and column counts"
    return _support.arch_problem()


_backend.register("rms_norm", "aiter", aiter_rms_norm, platforms=("rocm",), library=LIBRARY, supports=supports)
_backend.register("rms_norm_with_add", "aiter", aiter_rms_norm_with_add, platforms=("rocm",), library=LIBRARY,
                  supports=supports)
