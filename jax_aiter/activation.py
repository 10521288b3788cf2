"""SiLU-and-mul (the SwiGLU gate): ``x = [gate | up]`` along the last axis -> ``silu(gate) * up``.

Implementations: ``native`` (this project's kernels, forward and backward) and ``xla``
(``jax_aiter.ref.activation``, differentiated by JAX). Math in float32, output in x's dtype.
"""

from __future__ import annotations

import jax

from jax_aiter import _backend, _checks
from jax_aiter.ref import activation as ref

__all__ = ["silu_and_mul"]


def silu_and_mul(x: jax.Array) -> jax.Array:
    _checks.check_dtype("x", x, _checks.FLOAT_ACTIVATION_DTYPES)
    shape = _checks.check_min_rank("x", x, 1)
    if shape[-1] % 2:
        raise ValueError(f"x's last dimension must be even ([gate | up]), got shape {shape}")
    return _backend.dispatch("silu_and_mul", x)


def _forward_call(x):
    out = jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 2), x.dtype)
    return jax.ffi.ffi_call("ja_silu_and_mul_fwd", out, vmap_method="sequential")(x)


def _backward_call(dout, x):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call("ja_silu_and_mul_bwd", out, vmap_method="sequential")(dout, x)


@jax.custom_vjp
def _native_silu_and_mul(x):
    return _forward_call(x)


_native_silu_and_mul.defvjp(lambda x: (_forward_call(x), x), lambda x, dout: (_backward_call(dout, x),))

_backend.define_op("silu_and_mul",
                   example=lambda: ((jax.ShapeDtypeStruct((4096, 2 * 14336), "bfloat16"),), {}))
_backend.register("silu_and_mul", "xla", ref.silu_and_mul)
_backend.register("silu_and_mul", "native", _native_silu_and_mul, library=_backend.NATIVE_LIBRARIES)
