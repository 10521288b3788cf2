"""SiLU-and-mul (the SwiGLU gate): ``x = [gate | up]`` along the last axis -> ``silu(gate) * up``.

Implementations, declared at the end of this module: ``native`` (this project's kernels, forward and
backward) and ``xla`` (``jax_aiter.ref.activation``, differentiated by JAX). Math in float32, output in x's
dtype.
"""

from __future__ import annotations

import jax

from jax_aiter import _backend, _checks, native
from jax_aiter._autodiff import reverse_mode
from jax_aiter.native import activation as native_impl
from jax_aiter.ref import activation as ref

__all__ = ["silu_and_mul"]


def silu_and_mul(x: jax.Array) -> jax.Array:
    _checks.check_dtype("x", x, _checks.FLOAT_ACTIVATION_DTYPES)
    shape = _checks.check_min_rank("x", x, 1)
    if shape[-1] % 2:
        raise ValueError(f"x's last dimension must be even ([gate | up]), got shape {shape}")
    return _backend.dispatch("silu_and_mul", x)


# --- implementations ----------------------------------------------------------------------------------------

_backend.define_op(
    "silu_and_mul", example=lambda: ((jax.ShapeDtypeStruct((4096, 2 * 14336), "bfloat16"),), {}),
    implementations=(
        _backend.Implementation("native", native_impl.silu_and_mul, library=native.LIBRARY,
                                targets=native_impl.TARGETS),
        _backend.Implementation("xla", reverse_mode(ref.silu_and_mul)),
    ))
