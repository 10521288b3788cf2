"""RMSNorm, alone and with the residual add fused in front.

``rms_norm(x, gamma)``: ``y = x * rsqrt(mean(x**2, -1) + epsilon) * gamma`` in float32, returned in x's dtype.
``rms_norm_with_add(x, residual, gamma)``: ``s = x + residual`` rounded once to x's dtype, returns
``(rms_norm(s, gamma), s)`` — the pre-norm transformer block's residual stream and its normalized copy.

Implementations: ``native`` (this project's kernels, forward and backward, when gamma has x's dtype) and
``xla`` (``jax_aiter.ref.norm``, differentiated by JAX).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _backend, _checks
from jax_aiter.ref import norm as ref

__all__ = ["rms_norm", "rms_norm_with_add"]


def rms_norm(x: jax.Array, gamma: jax.Array, epsilon: float = 1e-6) -> jax.Array:
    epsilon = _check(x, gamma, epsilon)
    return _backend.dispatch("rms_norm", x, gamma, epsilon=epsilon)


def rms_norm_with_add(x: jax.Array, residual: jax.Array, gamma: jax.Array,
                      epsilon: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    epsilon = _check(x, gamma, epsilon)
    if tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    _checks.check_same_dtype("residual", residual, "x", x)
    return _backend.dispatch("rms_norm_with_add", x, residual, gamma, epsilon=epsilon)


def _check(x, gamma, epsilon) -> float:
    _checks.check_dtype("x", x, _checks.FLOAT_ACTIVATION_DTYPES)
    _checks.check_dtype("gamma", gamma, _checks.FLOAT_ACTIVATION_DTYPES)
    shape = _checks.check_min_rank("x", x, 1)
    _checks.check_rank("gamma", gamma, 1)
    if gamma.shape[0] != shape[-1]:
        raise ValueError(f"gamma must have x's last dimension {shape[-1]}, got shape {tuple(gamma.shape)}")
    return _checks.check_positive_float("epsilon", epsilon)


# --- native kernels (csrc/cpu/rms_norm.cc, csrc/kernels) -------------------------------------------------


def _forward_call(x, gamma, epsilon):
    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32))
    return jax.ffi.ffi_call("ja_rms_norm_fwd", out, vmap_method="sequential")(x, gamma, epsilon=np.float32(epsilon))


def _add_forward_call(x, residual, gamma, epsilon):
    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype),
           jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32))
    return jax.ffi.ffi_call("ja_add_rms_norm_fwd", out, vmap_method="sequential")(
        x, residual, gamma, epsilon=np.float32(epsilon))


# The GPU backward sums dgamma per thread block into a [blocks, cols] float32 workspace, then across blocks:
# at most this many blocks (one resident wave on an H200 or MI300), so the workspace stays a few percent of the
# traffic. XLA allocates it as a third output; the CPU kernel does not use it.
_DGAMMA_MAX_BLOCKS = 512


def _backward_call(dy, x, gamma, inv_rms, d_sum):
    rows = math.prod(x.shape[:-1])
    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(gamma.shape, gamma.dtype),
           jax.ShapeDtypeStruct((min(rows, _DGAMMA_MAX_BLOCKS), x.shape[-1]), jnp.float32))
    dx, dgamma, _ = jax.ffi.ffi_call("ja_rms_norm_bwd", out, vmap_method="sequential")(dy, x, gamma, inv_rms, d_sum)
    return dx, dgamma


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _native_rms_norm(x, gamma, epsilon):
    return _forward_call(x, gamma, epsilon)[0]


def _native_rms_norm_fwd(x, gamma, epsilon):
    y, inv_rms = _forward_call(x, gamma, epsilon)
    return y, (x, gamma, inv_rms)


def _native_rms_norm_bwd(epsilon, residuals, dy):
    x, gamma, inv_rms = residuals
    return _backward_call(dy, x, gamma, inv_rms, jnp.zeros((0,), x.dtype))


_native_rms_norm.defvjp(_native_rms_norm_fwd, _native_rms_norm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _native_rms_norm_with_add(x, residual, gamma, epsilon):
    y, total, _ = _add_forward_call(x, residual, gamma, epsilon)
    return y, total


def _native_rms_norm_with_add_fwd(x, residual, gamma, epsilon):
    y, total, inv_rms = _add_forward_call(x, residual, gamma, epsilon)
    return (y, total), (total, gamma, inv_rms)


def _native_rms_norm_with_add_bwd(epsilon, residuals, cotangents):
    total, gamma, inv_rms = residuals
    dy, d_total = cotangents
    dx, dgamma = _backward_call(dy, total, gamma, inv_rms, d_total)
    return dx, dx, dgamma


_native_rms_norm_with_add.defvjp(_native_rms_norm_with_add_fwd, _native_rms_norm_with_add_bwd)


def _native_supports(x, *rest, epsilon):
    gamma = rest[-1]
    if np.dtype(gamma.dtype) != np.dtype(x.dtype):
        return f"gamma dtype {np.dtype(gamma.dtype)} differs from x dtype {np.dtype(x.dtype)}"
    return None


def _example():
    return (jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16), jax.ShapeDtypeStruct((4096,), jnp.bfloat16)), \
        {"epsilon": 1e-6}


def _example_with_add():
    x = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
    return (x, x, jax.ShapeDtypeStruct((4096,), jnp.bfloat16)), {"epsilon": 1e-6}


_backend.define_op("rms_norm", example=_example)
_backend.register("rms_norm", "xla", ref.rms_norm)
_backend.register("rms_norm", "native", lambda x, gamma, epsilon: _native_rms_norm(x, gamma, epsilon),
                  library=_backend.NATIVE_LIBRARIES, supports=_native_supports)

_backend.define_op("rms_norm_with_add", example=_example_with_add)
_backend.register("rms_norm_with_add", "xla", ref.rms_norm_with_add)
_backend.register("rms_norm_with_add", "native",
                  lambda x, residual, gamma, epsilon: _native_rms_norm_with_add(x, residual, gamma, epsilon),
                  library=_backend.NATIVE_LIBRARIES, supports=_native_supports)

import jax_aiter.aiter.rmsnorm  # noqa: E402,F401  (registers the ROCm implementation)
